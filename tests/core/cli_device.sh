#!/usr/bin/env bash
# The device a run chooses, as a newcomer reads it (issue 38): a CPU run with
# train.device=auto (the default) says once per node (local rank 0), without a source
# trace, that it uses the CPU and why; the trace is a debug line. CUDA_VISIBLE_DEVICES=""
# hides any GPU, so the run is on the CPU on every machine and build.
#   tests/core/cli_device.sh RINGTRAIN
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
bin=$1
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing (scripts/install-deps test installs it)"; exit 77; }
tmp=$(mktemp -d /tmp/rt-cli-device-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; echo "--- output"; cat "$tmp/all"; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/ok.yaml"
run=(model.arch=net data.train_subset=128 data.test_subset=64 data.batch_size=32 train.threads=1
     "log.dir=$tmp/run" dist.timeout_s=60 dist.nproc=2 train.device=auto)
unset RINGTRAIN_LOG_LEVEL

CUDA_VISIBLE_DEVICES="" "$bin" train "$tmp/ok.yaml" "${run[@]}" >"$tmp/all" 2>&1 || fail "a 2-rank CPU run failed"
n=$(grep -c "using the CPU" "$tmp/all")
[ "$n" -eq 1 ] || fail "'using the CPU' printed $n times by a 2-rank run (expected once)"
line=$(grep "using the CPU" "$tmp/all")
echo "$line" | grep -Eq '^\[ringtrain( rank 0)?\] I device auto: using the CPU \(no GPU: .+\)$' ||
  fail "the CPU line is not one plain sentence: $line"
! echo "$line" | grep -q "src/" || fail "the CPU line has a source location: $line"
! grep -q "^  from src/" "$tmp/all" || fail "a source trace at info level"
echo "ok: a 2-rank CPU run says once that it uses the CPU: $line"

# debug level: the detailed reason, trace included, for whoever asks
rm -rf "$tmp/run"
CUDA_VISIBLE_DEVICES="" "$bin" train "$tmp/ok.yaml" "${run[@]}" log.level=debug >"$tmp/all" 2>&1 ||
  fail "a 2-rank CPU run at debug level failed"
grep -q "D device auto: .*no GPU: .*(src/.*\.c:[0-9]" "$tmp/all" || fail "no detailed reason at debug level"
echo "ok: the detailed reason at debug level"
