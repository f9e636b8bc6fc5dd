#!/usr/bin/env bash
# The real launchers start dist_worker ranks: torchrun (its own store holds MASTER_PORT,
# ours moves to MASTER_PORT+1) and Open MPI's mpirun (rank and size from
# OMPI_COMM_WORLD_*, rendezvous through a file:// path). Exit 77 (skipped) when the launcher is not installed.
#
#   tests/dist/launchers.sh torchrun|mpirun /path/to/dist_worker
set -u
mode=$1
worker=$2
# two consecutive free ports (torchrun's store takes the first, ours the second)
port=$(/usr/bin/python3 - <<'PY'
import socket, random
for _ in range(200):
    p = random.randint(20000, 60000)
    try:
        socks = []
        for q in (p, p + 1):
            s = socket.socket(); s.bind(("127.0.0.1", q)); socks.append(s)
        for s in socks: s.close()
        print(p); break
    except OSError:
        for s in socks: s.close()
PY
)
export RINGTRAIN_JOB_TOKEN=launcher-$$
case $mode in
torchrun)
  /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || { echo "SKIP: no torchrun"; exit 77; }
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
  timeout 120 /usr/bin/python3 -m torch.distributed.run --no_python --redirects 2 --tee 1 --log_dir "$out" \
    --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" "$worker"
  ;;
mpirun)
  command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
  # file:// rendezvous: rank 0 hosts the store on an ephemeral port and writes it down
  rdzv=$(mktemp -u /tmp/rt-mpirun-XXXXXX)
  trap 'rm -f "$rdzv"' EXIT
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x RINGTRAIN_JOB_TOKEN "$worker" "file://$rdzv"
  ;;
*) echo "usage: $0 torchrun|mpirun WORKER" >&2; exit 2 ;;
esac
