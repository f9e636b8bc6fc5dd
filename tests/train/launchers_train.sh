#!/usr/bin/env bash
# `ringtrain train` started by outside launchers trains and agrees with the built-in one:
# the same config with 2 ranks gives a byte-identical model.safetensors under
#   torchrun --no_python (Debian's torch; its own store holds MASTER_PORT),
#   mpirun -np 2 (Debian's Open MPI; rendezvous through dist.init_method=file://),
#   2 network namespaces x 1 rank, --nnodes 2 over tcp.
# The torchrun and netns runs are traced (--trace): `ringtrain trace` merges their ranks (on
# two "hosts" for netns, each with its own run directory). torchrun_desync: a rank that
# all-reduces a bucket with another count under torchrun fails with the desync diagnosis
# in the ranks' errors (docs/debugging.md), not a timeout.
# Exit 77 (skipped) when the launcher (or namespaces) is not available here.
#
#   tests/train/launchers_train.sh RINGTRAIN torchrun|torchrun_desync|mpirun|netns
set -u
# the test-only hooks (RINGTRAIN_TEST_*) act only with this switch (docs/testing.md)
export RINGTRAIN_TEST_HOOKS=1
bin=$1
mode=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
tmp=$(mktemp -d /tmp/rt-launch-train-XXXXXX)
cleanup() { pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
small=(model.arch=net model.dropout=0 data.train_subset=256 data.test_subset=64 data.batch_size=32
       train.threads=1 train.max_steps=4 dist.timeout_s=60 dist.transport=tcp log.progress=off)
fail() { echo "FAIL: $*"; cat "$tmp"/*.err 2>/dev/null; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
free_port() { # two consecutive free ports (torchrun's store takes the first, ours the second)
  /usr/bin/python3 - <<'PY'
import socket, random
for _ in range(200):
    p = random.randint(20000, 60000)
    socks = []
    try:
        for q in (p, p + 1):
            s = socket.socket(); s.bind(("127.0.0.1", q)); socks.append(s)
        print(p); break
    except OSError:
        pass
    finally:
        for s in socks: s.close()
PY
}

# the reference: the built-in launcher, 2 ranks over tcp
timeout 120 "$bin" train "$tmp/c.yaml" "${small[@]}" "log.dir=$tmp/ref" --nproc 2 >"$tmp/ref.out" 2>"$tmp/ref.err" ||
  fail "built-in launcher"
export RINGTRAIN_JOB_TOKEN=launchers-$$
case $mode in
torchrun)
  /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || { echo "SKIP: no torchrun"; exit 77; }
  port=$(free_port)
  timeout 180 /usr/bin/python3 -m torch.distributed.run --no_python --redirects 2 --tee 1 --log_dir "$tmp/tr-logs" \
    --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" \
    "$bin" train "$tmp/c.yaml" "${small[@]}" "log.dir=$tmp/got" --trace >"$tmp/got.out" 2>"$tmp/got.err" || fail "torchrun"
  ;;
torchrun_desync)
  /usr/bin/python3 -c 'import torch.distributed.run' 2>/dev/null || { echo "SKIP: no torchrun"; exit 77; }
  port=$(free_port)
  RINGTRAIN_TEST_BUCKET_COUNT=1:2:1 timeout 180 /usr/bin/python3 -m torch.distributed.run --no_python --redirects 2 \
    --tee 1 --log_dir "$tmp/tr-logs" --nnodes 1 --nproc_per_node 2 --master_addr 127.0.0.1 --master_port "$port" \
    "$bin" train "$tmp/c.yaml" "${small[@]}" dist.first_bucket_mb=0.01 dist.bucket_mb=0.05 dist.timeout_s=120 \
    "log.dir=$tmp/got" >"$tmp/got.out" 2>"$tmp/got.err"
  rc=$?
  [ $rc -ne 0 ] && [ $rc -ne 124 ] || fail "torchrun_desync: exit $rc (expected a failure, not a success or a timeout)"
  grep -q "diagnosis: desync at #[0-9]*: rank 0 called all_reduce #[0-9]* (f32 x \([0-9]*\), .*bucket 1 of [0-9]*, step 2) but rank 1 called all_reduce #[0-9]* (f32 x " \
    -r "$tmp/got.out" "$tmp/got.err" "$tmp/tr-logs" || fail "torchrun_desync: no desync diagnosis naming both calls"
  echo "torchrun_desync: the ranks' errors name the desync and both calls"
  exit 0
  ;;
mpirun)
  command -v mpirun >/dev/null || { echo "SKIP: no mpirun"; exit 77; }
  timeout 180 mpirun --allow-run-as-root --oversubscribe -np 2 -x RINGTRAIN_JOB_TOKEN \
    "$bin" train "$tmp/c.yaml" "${small[@]}" "log.dir=$tmp/got" "dist.init_method=file://$tmp/rdzv" \
    >"$tmp/got.out" 2>"$tmp/got.err" || fail "mpirun"
  ;;
netns)
  tag=$(( $$ % 200 + 20 ))
  nsa=rt-train-$$-a nsb=rt-train-$$-b va=rtta$$ vb=rttb$$
  cleanup() { ip netns del "$nsa" 2>/dev/null; ip netns del "$nsb" 2>/dev/null; ip link del "$va" 2>/dev/null;
              pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"; }
  ip netns add "$nsa" 2>/dev/null || { echo "SKIP: cannot create network namespaces here"; exit 77; }
  ip netns add "$nsb" && ip link add "$va" type veth peer name "$vb" && ip link set "$va" netns "$nsa" &&
    ip link set "$vb" netns "$nsb" && ip -n "$nsa" addr add "10.98.$tag.1/24" dev "$va" &&
    ip -n "$nsb" addr add "10.98.$tag.2/24" dev "$vb" && ip -n "$nsa" link set lo up && ip -n "$nsb" link set lo up &&
    ip -n "$nsa" link set "$va" up && ip -n "$nsb" link set "$vb" up || fail "namespace setup"
  common=(--nnodes 2 --nproc 1 --master-addr "10.98.$tag.1" --master-port 29533)
  timeout 180 ip netns exec "$nsa" "$bin" train "$tmp/c.yaml" "${small[@]}" "log.dir=$tmp/got" "${common[@]}" \
    --node-rank 0 --trace >"$tmp/got.out" 2>"$tmp/a.err" &
  a=$!
  timeout 180 ip netns exec "$nsb" "$bin" train "$tmp/c.yaml" "${small[@]}" "log.dir=$tmp/got-b" "${common[@]}" \
    --node-rank 1 --trace >"$tmp/b.out" 2>"$tmp/b.err" || fail "node 1"
  wait $a || fail "node 0"
  cp "$tmp/got-b/trace-rank1.jsonl" "$tmp/got/" || fail "node 1 wrote no trace"
  ;;
*) echo "usage: $0 RINGTRAIN torchrun|torchrun_desync|mpirun|netns" >&2; exit 2 ;;
esac
# (torchrun --tee prefixes every line with [default0]:)
tail -1 "$tmp/got.out" | grep -Eq "^(\[default0\]:)?test accuracy" || fail "$mode: no accuracy line: $(tail -1 "$tmp/got.out")"
cmp "$tmp/ref/model.safetensors" "$tmp/got/model.safetensors" || fail "$mode: the weights differ from the built-in launcher's"
if [ "$mode" != mpirun ]; then # traced: both ranks merged, each with its clock offset
  "$bin" trace "$tmp/got" -o "$tmp/trace.json" >"$tmp/trace.out" 2>&1 || fail "$mode: ringtrain trace: $(cat "$tmp/trace.out")"
  /usr/bin/python3 - "$tmp/trace.json" "$tmp/got" <<'PY' || fail "$mode: the merged trace"
import json, sys
ev = json.load(open(sys.argv[1]))["traceEvents"]
ranks = {e["pid"] for e in ev if e["ph"] == "X" and e["name"] == "all_reduce bucket"}
assert ranks == {0, 1}, ranks
h = json.loads(open(sys.argv[2] + "/trace-rank1.jsonl").readline())
assert h["kind"] == "header" and h["rank"] == 1 and h["world_size"] == 2, h
assert 0 < h["offset_error_ns"] < 1e9, h
PY
fi
echo "$mode: trained, weights identical to the built-in launcher's"
