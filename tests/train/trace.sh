#!/usr/bin/env bash
# Timelines end to end (log.trace, `ringtrain trace`, the report's overlap line; issue 21,
# docs/debugging.md): 2-rank runs of the small Net on a Fashion-MNIST subset, merged and
# checked against the Chrome trace-event format by tests/train/check_trace.py.
#
#   tests/train/trace.sh RINGTRAIN CASE
# CASE:
#   cpu     buckets on: every rank a process, spans nested or ordered per track, a bucket
#           all-reduce overlapping backward; dist.bucket_mb 0: none does; --steps; the
#           report's overlap line
#   errors  a rank's file missing, a garbled line, no trace, bad --steps
#   gpu     (emulated GPUs, label emu) the stream track on every rank, over nccl (2 GPUs)
#           and staged (2 ranks on 1 GPU); a traced run still syncs the host once per step
# Overlap is by construction, not by timing: the first bucket (first_bucket_mb, the last
# layers' gradients) starts while backward still has layers to go; with bucket_mb 0 the
# one bucket starts after backward returned.
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed (or, for gpu, no GPU).
set -u
bin=$1
what=$2
here=$(cd "$(dirname "$0")" && pwd)
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing (scripts/install-deps test installs it)"; exit 77; }
tmp=$(mktemp -d /tmp/rt-trace-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
small=(data.train_subset=256 data.test_subset=64 data.batch_size=32 train.threads=1 train.epochs=2
       log.progress=off dist.timeout_s=120 dist.nproc=2 dist.first_bucket_mb=0.01 dist.bucket_mb=0.05)
check() { /usr/bin/python3 "$here/check_trace.py" "$@" || fail "check_trace.py $*"; }

# train NAME ARGS...: a traced run into $tmp/NAME, merged into $tmp/NAME/trace.json
train() {
  local name=$1; shift
  "$bin" train "$tmp/c.yaml" "${small[@]}" "$@" "log.dir=$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err" ||
    fail "$name: ringtrain train exited $?"
  "$bin" trace "$tmp/$name" >"$tmp/$name-trace.out" 2>&1 || fail "$name: ringtrain trace exited $?"
  grep -q "2 rank(s)" "$tmp/$name-trace.out" || fail "$name: ringtrain trace did not say 2 ranks"
}

# expect NAME CODE PATTERN -- command...: exit CODE and PATTERN (fixed string) in its output
expect() {
  local name=$1 code=$2 pat=$3; shift 4
  "$@" >"$tmp/x.out" 2>&1; local rc=$?
  [ "$rc" -eq "$code" ] || { cat "$tmp/x.out"; fail "$name: exit $rc, expected $code"; }
  grep -qF -- "$pat" "$tmp/x.out" || { cat "$tmp/x.out"; fail "$name: no '$pat' in its output"; }
  echo "ok: $name"
}

case $what in
cpu)
  train b train.device=cpu --trace
  check "$tmp/b/trace.json" 2 full overlap
  train nb train.device=cpu log.trace=true dist.bucket_mb=0
  check "$tmp/nb/trace.json" 2 full nooverlap
  "$bin" trace "$tmp/b" --steps 3:5 -o "$tmp/s.json" >/dev/null 2>&1 || fail "--steps 3:5 failed"
  check "$tmp/s.json" 2 steps=3:5 overlap
  "$bin" report "$tmp/b" --no-plots >"$tmp/report.out" 2>&1 || fail "ringtrain report failed"
  n=$(grep -cE '^trace epoch [12]: [0-9]+% of all-reduce time hidden behind backward \(rank 0 [0-9]+%, rank 1 [0-9]+%\); slowest rank most often: [01] \([0-9]+ of [0-9]+ collectives' "$tmp/report.out")
  [ "$n" -eq 2 ] || { cat "$tmp/report.out"; fail "report: $n overlap lines, expected one per epoch (2)"; }
  grep -qE '^trace epoch 1: [1-9][0-9]*% ' "$tmp/report.out" || fail "report: buckets on, yet nothing hidden behind backward"
  grep -q '^trace epoch 1: 0% ' <("$bin" report "$tmp/nb" --no-plots 2>&1) || fail "report: bucket_mb 0 is not 0% hidden"
  echo "ok: traced runs with and without buckets, --steps, the report's overlap line"
  ;;
errors)
  train e train.device=cpu train.epochs=1 --trace
  cp -r "$tmp/e" "$tmp/miss" && rm "$tmp/miss/trace-rank1.jsonl"
  expect "a rank's file missing" 1 "trace-rank1.jsonl: No such file or directory (the header of trace-rank0.jsonl says 2 ranks traced)" -- "$bin" trace "$tmp/miss"
  cp -r "$tmp/e" "$tmp/bad" && sed -i '3s/.*/{"name": "forward", "track": 0/' "$tmp/bad/trace-rank1.jsonl"
  expect "a garbled line" 1 "trace-rank1.jsonl:3: not a JSON object" -- "$bin" trace "$tmp/bad"
  cp -r "$tmp/e" "$tmp/nof" && sed -i '4s/"t0": [0-9]*, //' "$tmp/nof/trace-rank0.jsonl"
  expect "a missing field" 1 'trace-rank0.jsonl:4: field "t0": missing' -- "$bin" trace "$tmp/nof"
  mkdir "$tmp/empty"
  expect "no trace" 1 "holds no trace-rank*.jsonl (train with log.trace: true" -- "$bin" trace "$tmp/empty"
  expect "bad --steps" 2 "--steps '5:2' (expected A:B" -- "$bin" trace "$tmp/e" --steps 5:2
  expect "damaged trace in report" 0 "warning: the trace: $tmp/bad/trace-rank1.jsonl:3: not a JSON object" -- "$bin" report "$tmp/bad" --no-plots
  ;;
gpu)
  "$bin" info 2>/dev/null | grep -q "features: cuda=on" || { echo "SKIP: built without CUDA"; exit 77; }
  export RINGTRAIN_EMU_GPUS=${RINGTRAIN_EMU_GPUS:-2}
  RINGTRAIN_LOG_LEVEL=debug train g2 train.device=cuda --trace
  grep -q "transport nccl" "$tmp/g2.err" || fail "2 GPUs: not over nccl"
  check "$tmp/g2/trace.json" 2 full stream
  "$bin" report "$tmp/g2" --no-plots >"$tmp/report.out" 2>&1 || fail "ringtrain report of the GPU run failed"
  grep -q "^trace epoch 2: all-reduce time hidden behind backward: not measured on a GPU" "$tmp/report.out" ||
    { cat "$tmp/report.out"; fail "report: the GPU run's line does not say the share is not measured"; }
  CUDA_VISIBLE_DEVICES=0 RINGTRAIN_LOG_LEVEL=debug RINGTRAIN_EMU_DELAY_US=300 train g1 train.device=cuda --trace
  grep -q "transport shm" "$tmp/g1.err" || fail "2 ranks on 1 GPU: not staged over shm"
  check "$tmp/g1/trace.json" 2 full stream
  # tracing adds no host synchronisation: at most one per step, as without it (emu_train_syncs)
  for n in 8 16; do
    RINGTRAIN_EMU_STATS="$tmp/stats-$n.jsonl" "$bin" train "$tmp/c.yaml" "${small[@]}" data.train_subset=1024 \
      train.device=cuda train.max_steps=$n train.eval_every=0 checkpoint.every_epochs=0 dist.check_sync_every=0 \
      --trace "log.dir=$tmp/s$n" >"$tmp/s$n.out" 2>"$tmp/s$n.err" || fail "syncs: the traced run of $n steps failed"
  done
  /usr/bin/python3 - "$tmp/stats-8.jsonl" "$tmp/stats-16.jsonl" <<'PY' || fail "tracing adds host synchronisations"
import json, sys
def syncs(p):  # per rank process (the ones that launched kernels)
    return sorted((r["host_syncs"] for r in map(json.loads, open(p)) if r["launches"] > 0), reverse=True)
a, b = syncs(sys.argv[1]), syncs(sys.argv[2])
assert len(a) == len(b) == 2, (a, b)
per = max(y - x for x, y in zip(a, b)) / 8.0
print("traced: host synchronisations per rank %s in 8 steps, %s in 16: %.2f per step" % (a, b, per))
assert per <= 1.0, per
PY
  echo "ok: GPU runs (nccl, staged) have the stream track on every rank, and tracing adds no host synchronisation"
  ;;
*) fail "unknown case $what" ;;
esac
