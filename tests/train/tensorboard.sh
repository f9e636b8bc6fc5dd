#!/usr/bin/env bash
# log.tensorboard end to end (issue 42 item 5), read back by TensorBoard's own reader (the
# `tensorboard` package from PyPI in scripts/tb-venv's virtual environment) through
# tests/train/tb_read.py, which compares every scalar with metrics.jsonl.
#
#   tests/train/tensorboard.sh RINGTRAIN CASE
# CASE:
#   values    2 ranks with a validation split: every step's and evaluation's scalars read
#             back once, equal to metrics.jsonl; copies cut inside the last record (length,
#             its crc, data, data's crc) read back every record before it
#   kill      rank 0 killed (SIGKILL) after step 25, the newest checkpoint step 20's; the
#             same command resumes from step 20: every step and evaluation once (steps
#             1..total), equal to metrics.jsonl (steps 21..25 written twice would show as
#             duplicates); then a torn record appended (a kill mid-write) and the same
#             command again: the resume drops it, the file reads back whole
#   evalonce  resumed from the checkpoint of epoch 1's last step after the run went on (a
#             branch: its later records move aside, as metrics.jsonl's lines do) and a
#             finished run run again: the evaluation of that step is in the file once
# Exit 77 (skipped) when Debian's Fashion-MNIST is missing, or when the environment with
# TensorBoard cannot be made (no network: scripts/tb-venv says why).
set -u
export RINGTRAIN_TEST_HOOKS=1 # RINGTRAIN_TEST_KILL_RANK_AT (docs/testing.md)
bin=$1
what=$2
here=$(cd "$(dirname "$0")" && pwd)
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
py=$("$here/../../scripts/tb-venv") || { echo "SKIP: no Python environment with TensorBoard's reader (scripts/tb-venv failed: see above)"; exit 77; }
tmp=$(mktemp -d /tmp/rt-tb-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
net=(model.arch=net data.train_subset=1024 data.val_split=64 data.test_subset=128 data.batch_size=32 train.threads=1
     train.epochs=2 log.progress=off dist.nproc=2 log.tensorboard=true)
run() { # name dir args...
  local name=$1 dir=$2; shift 2
  "$bin" train "$tmp/c.yaml" "${net[@]}" "$@" "log.dir=$dir" >"$tmp/$name.out" 2>"$tmp/$name.err"
}
tb() { "$py" "$here/tb_read.py" "$@" || fail "tb_read.py $*"; }
# the steps of the run: from its start line (the held-out split changes them)
total_steps() { "$py" -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][0]["total_steps"])' "$1/metrics.jsonl"; }
# tb_read.py check, then: steps 1..total and one evaluation per epoch
check_whole() { # dir epochs
  local out
  out=$("$py" "$here/tb_read.py" check "$1") || fail "$out"
  echo "$out"
  local total
  total=$(total_steps "$1")
  grep -q "($total steps, $2 evaluations)" <<<"$out" || fail "$1: expected $total steps and $2 evaluations: $out"
}

case "$what" in
values)
  run a "$tmp/a" || fail "run"
  check_whole "$tmp/a" 2
  tb truncate "$tmp/a"
  ;;
kill)
  # rank 0 SIGKILLs itself after step 25 (RINGTRAIN_TEST_KILL_RANK_AT: an exact point, no
  # polling); the newest checkpoint is step 20's, so the file holds 5 steps past it
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=0:25 run k "$tmp/k" checkpoint.every_steps=10 || rc=$?
  [ "$rc" -ne 0 ] || fail "the run was not killed after step 25"
  grep -q "rank 0 kills itself after step 25" "$tmp/k.err" || fail "no kill after step 25: $(tail -3 "$tmp/k.err")"
  out=$("$py" "$here/tb_read.py" check "$tmp/k") || fail "$out"
  grep -q "(25 steps, 0 evaluations)" <<<"$out" || fail "before the resume: expected steps 1..25: $out"
  echo "$out"
  run k2 "$tmp/k" checkpoint.every_steps=10 || fail "resume"
  grep -q "resuming from .*ckpt-000000020" "$tmp/k2.out" || fail "did not resume from step 20: $(grep resuming "$tmp/k2.out")"
  check_whole "$tmp/k" 2
  echo "ok: killed after step 25 (checkpoint 20), resumed: every step once"
  # what a kill in the middle of a record's write leaves: a valid length and crc, half the
  # data; the same command again (resumes the finished run's last checkpoint) drops it
  tb tear "$tmp/k"
  run k3 "$tmp/k" checkpoint.every_steps=10 || fail "rerun after the torn record"
  check_whole "$tmp/k" 2
  echo "ok: a torn record at the end is dropped by the next resume"
  ;;
evalonce)
  run f "$tmp/f" train.epochs=1 || fail "run"
  run f2 "$tmp/f" train.epochs=1 || fail "rerun"
  grep -q "resuming from" "$tmp/f2.out" || fail "the rerun did not resume"
  check_whole "$tmp/f" 1
  spe=$("$py" -c 'import json,sys; print([json.loads(l) for l in open(sys.argv[1])][0]["steps_per_epoch"])' "$tmp/f/metrics.jsonl")
  run b "$tmp/b" checkpoint.every_steps="$spe" || fail "run with checkpoints every $spe steps"
  ck=$(printf '%s/checkpoints/ckpt-%09d' "$tmp/b" "$spe")
  run b2 "$tmp/b" checkpoint.every_steps="$spe" "checkpoint.resume=$ck" || fail "resume from $ck"
  grep -q "resuming from $ck" "$tmp/b2.out" || fail "did not resume from $ck"
  check_whole "$tmp/b" 2
  aside=$(ls "$tmp"/b/checkpoints/*/events.out.tfevents.* "$tmp"/b/*/events.out.tfevents.* 2>/dev/null | head -1)
  [ -n "$aside" ] || fail "the abandoned branch's records were not moved aside with its metrics lines"
  echo "ok: a resume at an epoch's end has its evaluation once; the branch's records are in $(dirname "${aside#"$tmp"/}")"
  ;;
*) echo "usage: $0 RINGTRAIN values|kill|evalonce" >&2; exit 2 ;;
esac
