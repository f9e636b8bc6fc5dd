#!/usr/bin/env bash
# The distributed guarantees of the trainer that identical ranks cannot show (issue 20,
# item 8). Each case makes one rank break a guarantee through a test-only hook of
# src/train/test_hooks.c (RINGTRAIN_TEST_*) and checks that the trainer repairs or detects it:
#
#   init  rank 0's weights are broadcast at start: rank 1 initialised from another seed
#         trains to the same final weights, bit for bit (rank 0 from another seed does not)
#   sync  dist.check_sync_every compares the ranks: rank 1's parameters perturbed after
#         step 5 fail the job at step 8 (check every 4 steps), not before, and the end
#         check catches it without the periodic one; unperturbed, the same run passes
#   bn    evaluation uses rank 0's batch-norm statistics: rank 1's running means and
#         variances scaled by 4 before every evaluation change no evaluation (training and
#         ringtrain eval), while rank 0's scaled do
#   hooks the hooks themselves are test-only (issue 37, item 2): without
#         RINGTRAIN_TEST_HOOKS=1 a set hook does nothing and the run says it ignores it;
#         a hook that signals "the launcher" never signals a parent that is not
#         ringtrain's launcher (here a shell holding a job token); only test_hooks.c
#         reads the hooks' settings
#
#   tests/train/guards.sh RINGTRAIN CASE     CASE: init | sync | bn | hooks
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
# the test-only hooks (RINGTRAIN_TEST_*) act only with this switch (docs/testing.md)
export RINGTRAIN_TEST_HOOKS=1
bin=$1
what=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
tmp=$(mktemp -d /tmp/rt-guards-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -8 "$f"; }; done; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
# a ResNet with batch norm (buffers), 2 ranks, 16 steps per epoch
args=(model.arch=resnet18 model.width=4 data.train_subset=512 data.test_subset=256 data.batch_size=32
      train.threads=1 train.epochs=2 log.progress=off dist.nproc=2 optim.momentum=0.9)

# train NAME [VAR=VALUE] [key=value ...]: a run into $tmp/NAME; its exit status in $rc
train() {
  local name=$1 env=()
  shift
  case ${1-} in RINGTRAIN_TEST_*=*) env=("$1"); shift ;; esac
  rc=0
  env "${env[@]}" "$bin" train "$tmp/c.yaml" "${args[@]}" "$@" "log.dir=$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
}
evals() { grep -E '"kind": "(eval|end)"' "$tmp/$1/metrics.jsonl" | sed 's/"wall_s": [0-9.]*, //'; }

case $what in
init)
  train ref
  [ "$rc" -eq 0 ] || fail "the run without a hook: exit $rc"
  train r1 RINGTRAIN_TEST_INIT_SEED_RANK=1
  [ "$rc" -eq 0 ] || fail "rank 1 initialised from another seed: exit $rc (rank 0's weights were not broadcast at start)"
  cmp -s "$tmp/ref/model.safetensors" "$tmp/r1/model.safetensors" ||
    fail "rank 1 initialised from another seed: the final weights differ from the run without the hook"
  # the hook is real: rank 0 (whose weights every rank takes) from another seed trains elsewhere
  train r0 RINGTRAIN_TEST_INIT_SEED_RANK=0
  [ "$rc" -eq 0 ] || fail "rank 0 initialised from another seed: exit $rc"
  ! cmp -s "$tmp/ref/model.safetensors" "$tmp/r0/model.safetensors" || fail "RINGTRAIN_TEST_INIT_SEED_RANK=0 changed nothing"
  echo "ok: rank 0's weights are broadcast at start (rank 1 from another seed ends bit for bit where the plain run ends)"
  ;;
sync)
  train clean dist.check_sync_every=4
  [ "$rc" -eq 0 ] || fail "unperturbed ranks with dist.check_sync_every=4: exit $rc"
  train p RINGTRAIN_TEST_PERTURB_AT=1:5 dist.check_sync_every=4
  [ "$rc" -ne 0 ] || fail "rank 1 perturbed after step 5: the run succeeded (dist.check_sync_every=4 compared nothing)"
  grep -q "step 8: the ranks' parameters differ" "$tmp/p.err" ||
    fail "rank 1 perturbed after step 5: no in-sync error at step 8: $(grep -m1 error "$tmp/p.err")"
  ! grep -q "step 4: the ranks' parameters differ" "$tmp/p.err" || fail "the check of step 4 (before the perturbation) failed"
  grep -q '"step": 7,' "$tmp/p/metrics.jsonl" || fail "the run stopped before step 7 (the checks before the perturbation failed?)"
  # without the periodic check, the check at the end of training catches it
  train e RINGTRAIN_TEST_PERTURB_AT=1:5
  [ "$rc" -ne 0 ] || fail "rank 1 perturbed after step 5, no periodic check: the run succeeded"
  grep -q "at the end of training: the ranks' parameters differ" "$tmp/e.err" ||
    fail "rank 1 perturbed, no periodic check: no in-sync error at the end: $(grep -m1 error "$tmp/e.err")"
  echo "ok: a rank perturbed after step 5 fails the in-sync check of step 8 (and the one at the end)"
  ;;
bn)
  train ref
  [ "$rc" -eq 0 ] || fail "the run without a hook: exit $rc"
  [ "$(evals ref | grep -c '"kind": "eval"')" -eq 2 ] || fail "expected an evaluation after each of the 2 epochs"
  train b1 RINGTRAIN_TEST_BN_PERTURB=1
  [ "$rc" -eq 0 ] || fail "rank 1's batch-norm statistics scaled: exit $rc"
  [ "$(evals ref)" = "$(evals b1)" ] ||
    fail "rank 1's batch-norm statistics scaled before each evaluation changed it (rank 0's were not used): $(evals ref) vs $(evals b1)"
  cmp -s "$tmp/ref/model.safetensors" "$tmp/b1/model.safetensors" || fail "rank 1's scaled statistics reached the final weights"
  # the hook is real: rank 0's statistics scaled change the evaluation
  train b0 RINGTRAIN_TEST_BN_PERTURB=0
  [ "$rc" -eq 0 ] || fail "rank 0's batch-norm statistics scaled: exit $rc"
  [ "$(evals ref)" != "$(evals b0)" ] || fail "RINGTRAIN_TEST_BN_PERTURB=0 changed no evaluation"
  # ringtrain eval of a checkpoint with 2 ranks: the same
  ck=$(ls -d "$tmp"/ref/checkpoints/ckpt-* | tail -1)
  "$bin" eval "$ck" --nproc 2 >"$tmp/ev.out" 2>"$tmp/ev.err" || fail "ringtrain eval"
  RINGTRAIN_TEST_BN_PERTURB=1 "$bin" eval "$ck" --nproc 2 >"$tmp/ev1.out" 2>"$tmp/ev1.err" || fail "ringtrain eval, rank 1 scaled"
  RINGTRAIN_TEST_BN_PERTURB=0 "$bin" eval "$ck" --nproc 2 >"$tmp/ev0.out" 2>"$tmp/ev0.err" || fail "ringtrain eval, rank 0 scaled"
  a=$(grep -i "accuracy" "$tmp/ev.out"); b=$(grep -i "accuracy" "$tmp/ev1.out"); z=$(grep -i "accuracy" "$tmp/ev0.out")
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "ringtrain eval: rank 1's scaled statistics changed the result: '$a' vs '$b'"
  [ "$a" != "$z" ] || fail "ringtrain eval: RINGTRAIN_TEST_BN_PERTURB=0 changed nothing"
  echo "ok: evaluation uses rank 0's batch-norm statistics (rank 1's scaled change nothing, rank 0's do)"
  ;;
hooks)
  one=(dist.nproc=1 train.epochs=1 data.train_subset=256)
  # a NaN at step 2 fails the run when the hooks act...
  train nan_on RINGTRAIN_TEST_NAN_AT=0:2 "${one[@]}"
  [ "$rc" -ne 0 ] && grep -q 'non-finite' "$tmp/nan_on.err" || fail "RINGTRAIN_TEST_NAN_AT with the switch: exit $rc, no non-finite error"
  grep -q 'ignoring' "$tmp/nan_on.err" && fail "with the switch the run said it ignores a hook"
  # ...and does nothing without the switch, which the run says once
  (unset RINGTRAIN_TEST_HOOKS; train nan_off RINGTRAIN_TEST_NAN_AT=0:2 "${one[@]}"; exit "$rc") || fail "RINGTRAIN_TEST_NAN_AT without the switch acted (exit $?)"
  n=$(grep -c 'ignoring RINGTRAIN_TEST_NAN_AT: a test-only hook' "$tmp/nan_off.err")
  [ "$n" -eq 1 ] || fail "without the switch: $n lines saying the hook is ignored (expected 1)"
  # a rank whose parent is not ringtrain's launcher (a shell, given a job token as a
  # launcher would) signals itself, never the parent: the shell lives on to say so
  out=$(RINGTRAIN_JOB_TOKEN=hooks-$$ RINGTRAIN_TEST_SIGNAL_AT=step:3 bash -c '"$@" >/dev/null 2>&1; echo "parent alive, rank exit $?"' _ \
        "$bin" train "$tmp/c.yaml" "${args[@]}" "${one[@]}" "log.dir=$tmp/sig" 2>&1) || true
  # (a clean stop on SIGTERM exits 128 + 15, as the signal's default would)
  case $out in "parent alive, rank exit 143") ;; *) fail "the hook signalled its parent shell (it printed: '$out')" ;; esac
  grep -q '"kind": "stop"' "$tmp/sig/metrics.jsonl" || fail "the rank did not stop on its own signal"
  # one reader of the hooks' settings
  src=$(cd "$(dirname "$0")/../../src" && pwd)
  readers=$(grep -rl 'RT_SET_TEST_' "$src" --include='*.c' | sed "s|$src/||" | sort | tr '\n' ' ')
  [ "$readers" = "train/test_hooks.c " ] || fail "RT_SET_TEST_* read outside src/train/test_hooks.c: $readers"
  ;;
*) echo "usage: $0 RINGTRAIN init|sync|bn" >&2; exit 2 ;;
esac
