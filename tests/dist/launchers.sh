#!/usr/bin/env bash
# The real launchers start dist_worker ranks: torchrun (its own store holds MASTER_PORT,
# ours moves to MASTER_PORT+1) and Open MPI's mpirun (rank and size from
# OMPI_COMM_WORLD_*). Exit 77 (skipped) when the launcher is not installed.
#
#   tests/dist/launchers.sh torchrun|mpirun /path/to/dist_worker
set -u
mode=$1
worker=$2
port=$(( 20000 + ($$ * 7) % 20000 ))
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
  timeout 120 mpirun --allow-run-as-root --oversubscribe -np 2 -x MASTER_ADDR=127.0.0.1 -x MASTER_PORT="$port" \
    -x RINGTRAIN_JOB_TOKEN "$worker"
  ;;
*) echo "usage: $0 torchrun|mpirun WORKER" >&2; exit 2 ;;
esac
