#!/usr/bin/env bash
# What watches the evaluations (issue 42 items 3 and 4) with real ranks: the validation
# split, the best checkpoint (best/), the early stop and its resume, and time-based
# checkpoints (checkpoint.every_minutes) with a clock the test controls.
#
#   tests/train/watch.sh RINGTRAIN CASE
# CASE: split | best | early | minutes | minutes_rank1
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
export RINGTRAIN_TEST_HOOKS=1 # the test-only hooks act only with this switch (docs/testing.md)
bin=$1
what=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
tmp=$(mktemp -d /tmp/rt-watch-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
# 1024 training samples, 256 held out: 768 trained, 24 steps per epoch of 32 (16 per rank)
base=(model.arch=net data.train_subset=1024 data.test_subset=256 data.val_split=256 data.batch_size=32
      train.threads=1 log.progress=off dist.nproc=2 dist.timeout_s=30 log.all_ranks=true)
spe=24

train() { # name args...: a run into $tmp/name, its output in $tmp/name.out/.err
  local name=$1; shift
  "$bin" train "$tmp/c.yaml" "${base[@]}" "$@" "log.dir=$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err"
}

# json_lines FILE KIND: the lines of that kind, one JSON object each
json_lines() { grep "\"kind\": \"$2\"" "$1"; }

# meta CKPT KEY: a key of the checkpoint's train.safetensors metadata
meta() {
  python3 - "$1/train.safetensors" "$2" <<'EOF'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    print(json.loads(f.read(n))["__metadata__"].get(sys.argv[2], ""))
EOF
}

# ckpt_steps DIR: the steps of the ckpt-* folders, space-separated
ckpt_steps() { ls "$1" | sed -n 's/^ckpt-0*\([0-9]\)/\1/p' | tr '\n' ' ' | sed 's/ $//'; }

# The same held-out samples on 1 and 2 ranks (their indices' fingerprint in the start
# line), another seed holds out others, and the training set is the rest.
case_split() {
  train one dist.nproc=1 train.max_steps=2 || fail "1 rank"
  train two train.max_steps=2 || fail "2 ranks"
  train seed train.max_steps=2 train.seed=7 || fail "another seed"
  local a b c
  a=$(json_lines "$tmp/one/metrics.jsonl" start | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["val_fingerprint"])')
  b=$(json_lines "$tmp/two/metrics.jsonl" start | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["val_fingerprint"])')
  c=$(json_lines "$tmp/seed/metrics.jsonl" start | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["val_fingerprint"])')
  [ -n "$a" ] && [ "$a" = "$b" ] || fail "held-out fingerprint on 1 rank '$a', on 2 ranks '$b'"
  [ "$a" != "$c" ] || fail "seed 7 held out the same samples as seed 0 ($a)"
  json_lines "$tmp/two/metrics.jsonl" start | grep -q '"train_samples": 768, .*"val_samples": 256' ||
    fail "start line: $(json_lines "$tmp/two/metrics.jsonl" start)"
  json_lines "$tmp/two/metrics.jsonl" eval | grep -q '"val_loss": [0-9.]*, "val_accuracy": [0-9.]*, "val_samples": 256' ||
    fail "eval line without the validation metrics"
  grep -q '^epoch 1: test loss .*; validation loss [0-9.]*, accuracy [0-9.]*% (256 samples)$' "$tmp/two.out" ||
    fail "no validation metrics in the epoch line"
  # a val_* watch without a split is refused, naming the key
  "$bin" train "$tmp/c.yaml" "${base[@]}" data.val_split=0 train.early_stop=val_loss train.max_steps=1 \
    "log.dir=$tmp/nosplit" >"$tmp/nosplit.out" 2>&1 && fail "train.early_stop: val_loss without a split ran"
  grep -q "train.early_stop: val_loss needs a validation split" "$tmp/nosplit.out" || fail "no clear error without a split"
  echo "split: fingerprint $a on 1 and 2 ranks, $c with seed 7"
}

# best/: the checkpoint of the best evaluation by val_loss (step 96 of 120 in this run),
# kept when keep_last 1 prunes its ckpt-96, equal to the ckpt-96 of a run that kept all;
# its metadata names the metric, the value and the step; ringtrain eval reads it.
case_best() {
  local args=(train.epochs=5 checkpoint.keep_best=val_loss)
  train all "${args[@]}" checkpoint.keep_last=0 || fail "keep_last 0"
  train one "${args[@]}" checkpoint.keep_last=1 || fail "keep_last 1"
  local want
  want=$(json_lines "$tmp/one/metrics.jsonl" eval | python3 -c '
import json, sys
e = [json.loads(l) for l in sys.stdin]
b = min(e, key=lambda x: x["val_loss"])
print(b["step"], b["val_loss"], b["loss"], e[-1]["step"])')
  read -r step val test last <<<"$want"
  [ "$step" != "$last" ] || fail "the best evaluation is the last one (step $step): the case shows no pruning"
  local best=$tmp/one/checkpoints/best
  [ -d "$best" ] || fail "no $best"
  [ "$(ckpt_steps "$tmp/one/checkpoints")" = "$last" ] || fail "keep_last 1 left: $(ckpt_steps "$tmp/one/checkpoints")"
  [ "$(meta "$best" step)" = "$step" ] || fail "best/ holds step $(meta "$best" step), the best evaluation was step $step"
  [ "$(meta "$best" best.metric)" = val_loss ] && [ "$(meta "$best" best.step)" = "$step" ] ||
    fail "best/ metadata: metric '$(meta "$best" best.metric)' step '$(meta "$best" best.step)'"
  python3 -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(abs(a - b) > 1e-5 * abs(b))" \
    "$(meta "$best" best.value)" "$val" || fail "best.value $(meta "$best" best.value), the eval line says $val"
  local ref
  ref=$(printf '%s/all/checkpoints/ckpt-%09d' "$tmp" "$step")
  cmp -s "$best/model.safetensors" "$ref/model.safetensors" || fail "best/ weights differ from $ref's"
  "$bin" eval "$best" train.threads=1 >"$tmp/eval.out" 2>"$tmp/eval.err" || fail "ringtrain eval $best"
  grep -q "(step $step): test loss $(printf '%.4f' "$test")," "$tmp/eval.out" || fail "eval of best/: $(cat "$tmp/eval.out")"
  echo "best: step $step (val_loss $val) of $last kept in best/, equal to ckpt-$step"
  # best/ belongs to the checkpoints it was chosen among: a rollback to step 24 moves it
  # (step $step > 24) aside with the branch it abandons; checkpoint.overwrite moves it
  # aside with the old run's checkpoints
  [ "$step" -gt 24 ] || fail "the best step $step is not after step 24: the rollback case shows nothing"
  train all "${args[@]}" checkpoint.keep_last=0 train.epochs=1 \
    "checkpoint.resume=$tmp/all/checkpoints/ckpt-000000024" || fail "rollback to step 24"
  local moved
  moved=$(ls -d "$tmp"/all/checkpoints/abandoned-*-from-24/best 2>/dev/null | head -1)
  [ -n "$moved" ] && [ "$(meta "$moved" step)" = "$step" ] || fail "rollback: best/ of step $step not moved aside: $(ls "$tmp/all/checkpoints")"
  [ ! -d "$tmp/all/checkpoints/best" ] || [ "$(meta "$tmp/all/checkpoints/best" step)" -le 24 ] ||
    fail "rollback: best/ still holds step $(meta "$tmp/all/checkpoints/best" step) of the abandoned branch"
  train one "${args[@]}" train.epochs=1 checkpoint.resume=none checkpoint.overwrite=true || fail "overwrite"
  moved=$(ls -d "$tmp"/one/checkpoints/old-*/best 2>/dev/null | head -1)
  [ -n "$moved" ] && [ "$(meta "$moved" step)" = "$step" ] || fail "overwrite: the old run's best/ not moved aside"
  echo "best: moved aside with a rollback's abandoned branch and with checkpoint.overwrite"
}

# The early stop: val_acc must improve by more than 1 (never after the first
# evaluation), patience 2: the run stops after the third evaluation (step 72) on both
# ranks with a checkpoint and says why; the same command again refuses, naming how to go
# on; with patience 3 it goes on from the saved count and stops one evaluation later.
case_early() {
  local args=(train.epochs=8 train.early_stop=val_acc train.early_stop_min_delta=1 checkpoint.keep_last=0)
  train es "${args[@]}" train.early_stop_patience=2 || fail "early stop run: exit $?"
  local at=$((3 * spe))
  grep -q "^stopped early after step $at by train.early_stop: val_acc did not improve" "$tmp/es.out" ||
    fail "summary: $(grep -i 'stopped\|accuracy' "$tmp/es.out" | tail -2)"
  json_lines "$tmp/es/metrics.jsonl" early_stop | grep -q "\"step\": $at, \"metric\": \"val_acc\"" || fail "no early_stop line"
  json_lines "$tmp/es/metrics.jsonl" checkpoint | tail -1 | grep -q "\"step\": $at, .*\"why\": \"early_stop\"" ||
    fail "last checkpoint: $(json_lines "$tmp/es/metrics.jsonl" checkpoint | tail -1)"
  for r in 0 1; do
    local s
    s=$(json_lines "$tmp/es/metrics-rank$r.jsonl" step | tail -1 | sed 's/.*"step": \([0-9]*\).*/\1/')
    [ "$s" = "$at" ] || fail "rank $r's last step is $s, expected $at"
  done
  local ck
  ck=$(printf '%s/es/checkpoints/ckpt-%09d' "$tmp" "$at")
  [ "$(meta "$ck" early_stop.stopped)" = true ] && [ "$(meta "$ck" early_stop.evals_without_improvement)" = 2 ] ||
    fail "$ck: early_stop.stopped '$(meta "$ck" early_stop.stopped)', count '$(meta "$ck" early_stop.evals_without_improvement)'"
  # the same command again: refused, saying how to go on
  train es "${args[@]}" train.early_stop_patience=2 && fail "a resume after the early stop trained on"
  grep -q "ended its run by train.early_stop .*raise train.early_stop_patience above 2" "$tmp/es.err" "$tmp/es.out" ||
    fail "the refusal does not say how to go on"
  # patience 3: one more evaluation without improvement (the count goes on from 2)
  train es "${args[@]}" train.early_stop_patience=3 || fail "resume with patience 3"
  local at2=$((4 * spe))
  grep -q "^stopped early after step $at2 by train.early_stop" "$tmp/es.out" ||
    fail "patience 3 from the saved count should stop at step $at2: $(grep -i 'stopped\|accuracy' "$tmp/es.out" | tail -2)"
  # a checkpoint of the stopping step written before its evaluation (checkpoint.every_steps
  # at the epoch's end): the early stop writes it again, with its state, and a resume refuses
  train es2 "${args[@]}" train.early_stop_patience=2 checkpoint.every_steps=$spe checkpoint.keep_best=none ||
    fail "early stop with every_steps"
  ck=$(printf '%s/es2/checkpoints/ckpt-%09d' "$tmp" "$at")
  [ "$(meta "$ck" early_stop.stopped)" = true ] ||
    fail "every_steps: $ck was not rewritten by the early stop (early_stop.stopped '$(meta "$ck" early_stop.stopped)')"
  train es2 "${args[@]}" train.early_stop_patience=2 checkpoint.every_steps=$spe checkpoint.keep_best=none &&
    fail "every_steps: a resume after the early stop trained on"
  echo "early: stopped at step $at on both ranks; resume refused; patience 3 stopped at $at2; with every_steps too"
}

# checkpoint.every_minutes 3 with rank 0's clock at 1 minute per step (RINGTRAIN_TEST_CLOCK):
# a checkpoint after steps 4, 8, 12, ... on both ranks (the 2-rank job completes only if
# every rank saves after the same steps); the one after step 48 is the run's end too.
case_minutes() {
  RINGTRAIN_TEST_CLOCK=0:1 train m train.epochs=2 checkpoint.every_minutes=3 checkpoint.every_epochs=0 \
    checkpoint.keep_last=0 || fail "every_minutes run: exit $?"
  local got want="4 8 12 16 20 24 28 32 36 40 44 48"
  got=$(ckpt_steps "$tmp/m/checkpoints")
  [ "$got" = "$want" ] || fail "checkpoints after steps '$got', expected '$want'"
  [ "$(json_lines "$tmp/m/metrics.jsonl" checkpoint | grep -c '"why": "every_minutes"')" = 12 ] ||
    fail "every_minutes checkpoints: $(json_lines "$tmp/m/metrics.jsonl" checkpoint | grep -c '"why": "every_minutes"'), expected 12"
  echo "minutes: checkpoints after steps $got"
}

# Only rank 0's clock counts: rank 1's at 100 minutes per step asks for nothing.
case_minutes_rank1() {
  RINGTRAIN_TEST_CLOCK=1:100 train m train.epochs=1 checkpoint.every_minutes=3 checkpoint.every_epochs=0 \
    checkpoint.keep_last=0 || fail "run: exit $?"
  [ "$(ckpt_steps "$tmp/m/checkpoints")" = "$spe" ] || fail "checkpoints after steps '$(ckpt_steps "$tmp/m/checkpoints")', expected only the end ($spe)"
  echo "minutes_rank1: rank 1's clock ignored"
}

"case_$what"
