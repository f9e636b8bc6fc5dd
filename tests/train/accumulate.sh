#!/usr/bin/env bash
# train.accumulate end to end (issue 42, item 1; docs/train.md "Gradient accumulation"):
# `ringtrain train` of the tutorial Net without dropout (no batch norm, no dropout: a
# step's gradient is then a function of the batch alone), global batch 128.
#
#   tests/train/accumulate.sh RINGTRAIN CASE [cpu|cuda]
# CASE:
#   equiv   2 ranks with K=4 (micro-batches of 16) reach the parameters of 2 ranks with
#           K=1 after 6 steps, up to the order of the sums (relative error < 1e-6; the
#           measured one is printed), and so does a run stopped at step 3 and resumed onto
#           1 rank with K=8 (the global batch kept, micro-batches of 16: the same memory per
#           rank); the logged steps count optimizer steps, 128 images each
#   flight  a SIGUSR1 flight recorder dump after step 3: with K=4 the same all-reduces per
#           optimizer step as with K=1 (the gradient buckets, the step's scalars), every
#           gradient bucket tagged with the 4th micro-batch ("step S micro 4/4": queued
#           during the last backward), none during micro-batches 1 to 3
#   resume  SIGTERM between micro-batches 2 and 3 of step 3: the run stops after step 3's
#           optimizer step with its checkpoint, and the resumed run equals the uninterrupted
#           one bit for bit (losses, learning rates, gradient norms, the checkpoint's files)
#   errors  a batch that does not split into the micro-batches is an error naming the keys;
#           train.cuda_graphs on with K > 1 is an error saying why (cuda only)
# cpu (the default) trains on the CPU over shm; cuda on 2 emulated GPUs over NCCL (the
# emulated-GPU build, tests/emu/accumulate.cmake).
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
export RINGTRAIN_TEST_HOOKS=1 # RINGTRAIN_TEST_SIGNAL_AT (docs/testing.md)
bin=$1
what=$2
dev=${3:-cpu}
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing (scripts/install-deps test installs it)"; exit 77; }
tmp=$(mktemp -d /tmp/rt-accum-XXXXXX)
trap 'pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
# 1024 images in batches of 128: 8 steps per epoch; buckets of one block each (the
# all-reduces overlap backward), momentum so that the optimizer has state to carry
base=(model.arch=net model.dropout=0 data.train_subset=1024 data.test_subset=64 data.batch_size=128
      train.threads=1 optim.lr=0.05 optim.momentum=0.9 dist.bucket_mb=0.0001 dist.first_bucket_mb=0
      log.progress=off log.every_steps=1 dist.timeout_s=120 dist.nproc=2)
if [ "$dev" = cuda ]; then
  export RINGTRAIN_EMU_GPUS=${RINGTRAIN_EMU_GPUS:-2}
  base+=(train.device=cuda dist.transport=nccl)
else
  base+=(train.device=cpu dist.transport=shm)
fi

# train NAME ARGS...: a run into $tmp/NAME (its exit status returned)
train() {
  local name=$1; shift
  "$bin" train "$tmp/c.yaml" "${base[@]}" "$@" "log.dir=$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err"
}

# relerr A B MAX: ||a - b|| / ||a|| over the final parameters of runs A and B, printed;
# fails above MAX (and when training did not move them: the comparison would be vacuous)
relerr() {
  /usr/bin/python3 - "$tmp/$1/model.safetensors" "$tmp/$2/model.safetensors" "$3" "$1 vs $2" <<'PY' || fail "$1 vs $2"
import json, struct, sys
def load(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    out = {}
    for k, v in h.items():
        if k != "__metadata__" and v["dtype"] == "F32":
            s, e = v["data_offsets"]; out[k] = struct.unpack("<%df" % ((e - s) // 4), raw[8 + n + s:8 + n + e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys()
num = den = mx = 0.0
for k in a:
    for x, y in zip(a[k], b[k]):
        num += (x - y) ** 2; den += x * x; mx = max(mx, abs(x - y))
e = (num / den) ** 0.5
print("%s: relative error %.3g, largest difference %.3g" % (sys.argv[4], e, mx))
assert e < float(sys.argv[3]), "relative error %.3g, expected < %s" % (e, sys.argv[3])
PY
}

# steps NAME: metrics.jsonl's step lines as "step images" (rank 0's)
steps() { /usr/bin/python3 -c 'import json,sys; [print(r["step"], r["images"]) for r in map(json.loads, open(sys.argv[1])) if r.get("kind") == "step"]' "$tmp/$1/metrics.jsonl"; }

# same A B LABEL: metrics.jsonl's steps (loss, lr, gradient norm) and the newest
# checkpoint's tensors bit for bit
same() {
  /usr/bin/python3 - "$tmp/$1" "$tmp/$2" <<'PY' || fail "$3"
import glob, json, os, struct, sys
def steps(d):
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"]) for r in map(json.loads, open(d + "/metrics.jsonl"))
            if r.get("kind") == "step"]
a, b = sys.argv[1], sys.argv[2]
sa, sb = steps(a), steps(b)
assert sa == sb, "steps differ: %s" % [(x, y) for x, y in zip(sa, sb) if x != y][:2]
ca, cb = sorted(glob.glob(a + "/checkpoints/ckpt-*"))[-1], sorted(glob.glob(b + "/checkpoints/ckpt-*"))[-1]
assert os.path.basename(ca) == os.path.basename(cb), (ca, cb)
def tensors(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
for f in sorted(f for f in os.listdir(ca) if f.endswith(".safetensors")):
    ta, tb = tensors(ca + "/" + f), tensors(cb + "/" + f)
    bad = [k for k in ta if ta[k] != tb.get(k)]
    assert ta.keys() == tb.keys() and not bad, "%s: tensors differ: %s" % (f, bad[:4])
print("same: %d steps, the tensors of %s" % (len(sa), os.path.basename(ca)))
PY
}

case $what in
equiv)
  train frozen train.max_steps=6 optim.lr=0 || fail "lr 0: exit $?"
  train k1 train.max_steps=6 || fail "K=1: exit $?"
  relerr k1 frozen 1e30 # the distance 6 steps moved the parameters (printed)
  train k4 train.max_steps=6 train.accumulate=4 || fail "K=4: exit $?"
  grep -q "global batch 128 (each rank: 4 micro-batches of 16)" "$tmp/k4.out" || fail "K=4: no micro-batch line"
  [ "$(steps k4 | tr '\n' ' ')" = "1 128 2 128 3 128 4 128 5 128 6 128 " ] || fail "K=4 logs $(steps k4 | tr '\n' ' ')"
  relerr k1 k4 1e-6
  # 3 steps on 2 ranks with K=4, then resumed onto 1 rank with K=8 to step 6
  train r8 train.max_steps=3 train.accumulate=4 || fail "K=4, 3 steps: exit $?"
  train r8 train.max_steps=6 train.accumulate=8 dist.nproc=1 || fail "resume onto 1 rank, K=8: exit $?"
  grep -q "resuming from .*ckpt-000000003" "$tmp/r8.out" || fail "K=8 did not resume from step 3"
  grep -q "global batch 128 (each rank: 8 micro-batches of 16)" "$tmp/r8.out" || fail "K=8: no micro-batch line"
  relerr k1 r8 1e-6
  echo "ok: K=4 on 2 ranks and a resume onto 1 rank with K=8 equal K=1 up to the order of the sums"
  ;;
flight)
  for k in 1 4; do
    RINGTRAIN_TEST_SIGNAL_AT=step:4:launcher:0:USR1 train f$k train.max_steps=6 train.accumulate=$k ||
      fail "K=$k: exit $?"
    [ -f "$tmp/f$k/flight-rank0.json" ] || fail "K=$k: no flight recorder dump"
  done
  /usr/bin/python3 - "$tmp/f1/flight-rank0.json" "$tmp/f4/flight-rank0.json" <<'PY' || fail "the all-reduces of K=4 are not those of K=1"
import collections, json, re, sys
def per_step(path):  # step -> [(what, count)] of its all-reduces, in order; micro-batch tags
    out, micro = collections.defaultdict(list), collections.Counter()
    for e in json.load(open(path))["entries"]:
        if e["op"] != "all_reduce": continue
        m = re.search(r"step (\d+)( micro (\d+)/(\d+))?", e.get("tag", ""))
        if not m: continue
        kind = "bucket" if "bucket" in e["tag"] else "scalars"
        out[int(m.group(1))].append((kind, e["count"]))
        micro[(kind, m.group(2) or "")] += 1
    return out, micro
s1, m1 = per_step(sys.argv[1])
s4, m4 = per_step(sys.argv[2])
full = [s for s in s1 if s in s4 and s <= 3]
assert len(full) >= 2, ("too few steps recorded", sorted(s1), sorted(s4))
for s in full:
    assert s1[s] == s4[s], "step %d: K=1 %s, K=4 %s" % (s, s1[s], s4[s])
buckets = sum(1 for k, c in s1[full[0]] if k == "bucket")
assert buckets >= 2, "K=1 has %d bucket(s) per step: nothing overlaps backward" % buckets
assert set(m4) == {("bucket", " micro 4/4"), ("scalars", "")}, m4
print("same all-reduces per step in steps %s: %d gradient buckets (all in micro-batch 4/4) and the step's scalars" % (full, buckets))
PY
  echo "ok: K=4 all-reduces as K=1 does, once per optimizer step, during the last backward"
  ;;
resume)
  train full train.max_steps=6 train.accumulate=4 checkpoint.every_steps=2 || fail "uninterrupted: exit $?"
  # micro-batch 10 of the run: the 2nd of step 3 (4 per step)
  rc=0
  RINGTRAIN_TEST_SIGNAL_AT=micro:10:launcher:0:TERM train cut train.max_steps=6 train.accumulate=4 \
    checkpoint.every_steps=2 || rc=$?
  [ "$rc" -eq 143 ] || fail "SIGTERM between micro-batches: exit $rc, expected 143"
  newest=$(ls -d "$tmp"/cut/checkpoints/ckpt-* | tail -1)
  [ "$(basename "$newest")" = ckpt-000000003 ] || fail "newest checkpoint $newest, expected the one of step 3"
  grep -q "^stopped by SIGTERM after step 3;" "$tmp/cut.out" || fail "no 'stopped by SIGTERM after step 3'"
  [ "$(steps cut | tail -1)" = "3 128" ] || fail "the stopped run logged $(steps cut | tail -1) last"
  train cut train.max_steps=6 train.accumulate=4 checkpoint.every_steps=2 || fail "resume: exit $?"
  grep -q "resuming from .*ckpt-000000003" "$tmp/cut.out" || fail "did not resume from step 3"
  same full cut "SIGTERM between micro-batches, resumed"
  echo "ok: a stop between micro-batches lands on the step boundary; the resumed run is the uninterrupted one"
  ;;
errors)
  rc=0; train bad train.max_steps=1 train.accumulate=3 || rc=$?
  [ "$rc" -ne 0 ] || fail "batch 128 on 2 ranks with K=3 ran"
  grep -q "data.batch_size 128 with train.accumulate 3 on 2 rank(s): each rank's batch of 64 does not split into 3 micro-batches" "$tmp/bad.err" ||
    fail "no error naming data.batch_size and train.accumulate"
  if [ "$dev" = cuda ]; then
    rc=0; train graphs train.max_steps=1 train.accumulate=2 train.cuda_graphs=on || rc=$?
    [ "$rc" -ne 0 ] || fail "train.cuda_graphs on with K=2 ran"
    grep -q "train.cuda_graphs: on, but the step cannot be captured: train.accumulate is 2" "$tmp/graphs.err" ||
      fail "train.cuda_graphs on with K=2: no error saying why"
  fi
  echo "ok: errors name the keys"
  ;;
*)
  fail "unknown case $what"
  ;;
esac
