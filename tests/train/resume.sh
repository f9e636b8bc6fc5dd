#!/usr/bin/env bash
# Checkpoints end to end with real ranks (issue 13): exact resume after kill -9 of the
# launcher (at an epoch boundary and mid-epoch), clean stops by SIGTERM/SIGINT between
# steps, during an evaluation and during a checkpoint write (issue 20), resume with a
# different world size, a corrupted newest checkpoint, ringtrain eval, and the launcher's
# restarts (--max-restarts) after a rank died.
#
#   tests/train/resume.sh RINGTRAIN CASE
# CASE: evalonce | partition | exact | stop | stop_eval | stop_ckpt | steps | world | corrupt | eval |
#       torchvision | schedule | runid | ranks | restart | restart_term | restart_repeat | ckpt_slow |
#       branch | stop_hint | metrics_full
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
# the test-only hooks (RINGTRAIN_TEST_*) act only with this switch (docs/testing.md)
export RINGTRAIN_TEST_HOOKS=1
bin=$1
what=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
tmp=$(mktemp -d /tmp/rt-resume-XXXXXX)
trap 'pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
# the tutorial Net with dropout on, and a ResNet with batch norm (buffers), 2 ranks
net=(model.arch=net data.train_subset=2048 data.test_subset=256 data.batch_size=32 train.threads=1 train.epochs=2
     log.progress=off dist.nproc=2 optim.momentum=0.9)
# steps per epoch: the training subset over the global batch
net_steps_per_epoch=64
resnet_steps_per_epoch=32
resnet=(model.arch=resnet18 model.width=4 data.train_subset=1024 data.test_subset=256 data.batch_size=32
        train.threads=1 train.epochs=2 log.progress=off dist.nproc=2 optim.name=adam)

# same_run A B: the final checkpoints hold bitwise-identical parameters, buffers and
# optimizer state (both safetensors files' tensor data), and the trained weights agree
. "$(dirname "$0")/../same_run.sh"

# kill -9 of the launcher right after the checkpoint of step STEP is complete: rank 0
# kills its launcher (and so every rank) at that exact point (RINGTRAIN_TEST_KILL_AFTER_CKPT),
# instead of the test polling for the checkpoint and racing with the run
run_and_kill() { # name dir step args...
  local name=$1 dir=$2 step=$3; shift 3
  local rc=0
  RINGTRAIN_TEST_KILL_AFTER_CKPT=$step "$bin" train "$tmp/c.yaml" "$@" "log.dir=$dir" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  [ "$rc" -eq 137 ] || fail "$name: the run ended with exit $rc, not killed after the checkpoint of step $step"
  local ck
  ck=$(printf '%s/checkpoints/ckpt-%09d' "$dir" "$step")
  [ -d "$ck" ] || fail "$name: no checkpoint $ck before the kill"
}

# stop_case NAME HOOK CODE SIG STEP args...: a run that gets SIG at the exact point HOOK
# (RINGTRAIN_TEST_SIGNAL_AT, trainer.c: no polling, no race) exits CODE with the checkpoint
# of step STEP as its newest, the resume hint and no error; the same command again resumes
# from it and ends bit for bit where the uninterrupted run does
stop_case() {
  local name=$1 hook=$2 want=$3 sig=$4 step=$5; shift 5
  local d=$tmp/$name rc=0
  "$bin" train "$tmp/c.yaml" "$@" "log.dir=$tmp/$name-full" >"$tmp/$name-full.out" 2>"$tmp/$name-full.err" || fail "$name: straight run"
  RINGTRAIN_TEST_SIGNAL_AT=$hook "$bin" train "$tmp/c.yaml" "$@" "log.dir=$d" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  [ "$rc" -eq "$want" ] || fail "$name: exit $rc, expected $want ($sig at $hook)"
  local ck newest
  ck=$(printf '%s/checkpoints/ckpt-%09d' "$d" "$step")
  newest=$(ls -d "$d"/checkpoints/ckpt-* 2>/dev/null | tail -1)
  [ "$newest" = "$ck" ] || fail "$name: newest checkpoint '$newest', expected $ck (the stop must keep the work of step $step, no more)"
  grep -q "^stopped by $sig after step $step; checkpoint in $d/checkpoints/; run the same command again to resume" "$tmp/$name.out" ||
    fail "$name: no resume hint 'stopped by $sig after step $step' in stdout: $(grep stopped "$tmp/$name.out")"
  # an error: a log line of level E, or the launcher's/main's "error:" (info lines may name
  # CUDA's error codes, e.g. cudaErrorInsufficientDriver on a machine without a GPU)
  ! grep -qE '^\[ringtrain( rank [0-9]+)?\] E |error:' "$tmp/$name.err" || fail "$name: a clean stop printed an error: $(grep -E '^\[ringtrain( rank [0-9]+)?\] E |error:' "$tmp/$name.err" | head -3)"
  "$bin" train "$tmp/c.yaml" "$@" "log.dir=$d" >"$tmp/$name-2.out" 2>"$tmp/$name-2.err" || fail "$name: resume"
  grep -q "resuming from $ck " "$tmp/$name-2.out" || fail "$name: did not resume from $ck: $(grep resuming "$tmp/$name-2.out")"
  same_run "$tmp/$name-full" "$d" "$name ($sig at $hook)"
  metrics_contiguous "$d"
  echo "ok: $name: $sig at $hook exits $want with the checkpoint of step $step; the resumed run equals the uninterrupted one"
}

metrics_contiguous() { # no gap, no duplicate step
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY' || fail "metrics.jsonl has a gap or a duplicate step"
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if '"kind": "step"' in l]
assert steps == list(range(1, len(steps) + 1)), steps
PY
}

# every (kind, step) of the eval and checkpoint lines once, and the step lines contiguous
metrics_once() {
  /usr/bin/python3 - "$1/metrics.jsonl" <<'PY' || fail "$2: metrics.jsonl repeats an eval or checkpoint step, or has a gap"
import collections, json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
steps = [r["step"] for r in rows if r["kind"] == "step"]
assert steps == list(range(1, len(steps) + 1)), steps
seen = collections.Counter((r["kind"], r["step"]) for r in rows if r["kind"] in ("eval", "checkpoint"))
twice = sorted(k for k, n in seen.items() if n > 1)
assert not twice, "logged more than once: %s" % twice
PY
}

# meta CKPT KEY: a metadata field of checkpoint CKPT ("" when absent)
meta() { /usr/bin/python3 -c 'import json,struct,sys; b=open(sys.argv[1]+"/train.safetensors","rb").read(); n=struct.unpack("<Q",b[:8])[0]; print(json.loads(b[8:8+n])["__metadata__"].get(sys.argv[2],""))' "$1" "$2"; }

# step_lines FILE: the steps of FILE's step lines, space-separated, in file order
step_lines() {
  /usr/bin/python3 -c 'import json,sys; print(" ".join(str(json.loads(l)["step"]) for l in open(sys.argv[1]) if "\"kind\": \"step\"" in l))' "$1"
}

# has_files CKPT: both files of a checkpoint are there
has_files() { [ -s "$1/model.safetensors" ] && [ -s "$1/train.safetensors" ]; }

case $what in
evalonce)
  # a checkpoint of an epoch's last step is followed by that epoch's evaluation; a resume
  # from it must not log the evaluation of that step again (it did: the eval line before
  # the checkpoint survives the resume's truncation and the resumed run evaluates again)
  # (1) the same command again after the run finished: nothing left to train
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=1 "log.dir=$tmp/f" >"$tmp/f.out" 2>"$tmp/f.err" || fail "run"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=1 "log.dir=$tmp/f" >"$tmp/f2.out" 2>"$tmp/f2.err" || fail "rerun"
  grep -q "resuming from .*ckpt-0000000$net_steps_per_epoch" "$tmp/f2.out" || fail "the rerun did not resume"
  metrics_once "$tmp/f" "a finished run run again"
  # (2) checkpoints every epoch's worth of steps (written before the epoch's evaluation),
  # resumed from the one at the end of epoch 1 after the run went on: training continues
  "$bin" train "$tmp/c.yaml" "${net[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=$net_steps_per_epoch "log.dir=$tmp/b" >"$tmp/b.out" 2>"$tmp/b.err" ||
    fail "run with checkpoints every $net_steps_per_epoch steps"
  ck=$(printf '%s/checkpoints/ckpt-%09d' "$tmp/b" "$net_steps_per_epoch")
  "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=$net_steps_per_epoch "checkpoint.resume=$ck" "log.dir=$tmp/b" \
    >"$tmp/b2.out" 2>"$tmp/b2.err" || fail "resume from $ck"
  grep -q "resuming from $ck" "$tmp/b2.out" || fail "did not resume from $ck"
  metrics_once "$tmp/b" "resumed from the checkpoint of an epoch's last step"
  same_run "$tmp/full" "$tmp/b" "resumed from the checkpoint of an epoch's last step"
  echo "ok: a resume at an epoch's end logs its evaluation once"
  ;;
partition)
  # data.sampler partition stopped mid-epoch on 1 rank and resumed on 2: refused (each
  # rank's part of the data depends on the world size; the resumed run took some samples
  # twice and others never, and said the epoch was re-partitioned); on 1 rank it
  # continues; from a checkpoint at an epoch's end the next epoch starts on 2 ranks
  p=(data.sampler=partition checkpoint.every_steps=10)
  run_and_kill p1 "$tmp/p" 10 "${net[@]}" "${p[@]}" dist.nproc=1
  rc=0
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${p[@]}" dist.nproc=2 "log.dir=$tmp/p" >"$tmp/p2.out" 2>"$tmp/p2.err" || rc=$?
  [ "$rc" -eq 1 ] || fail "partition: resuming a mid-epoch checkpoint of 1 rank on 2 ranks: exit $rc, expected a refusal"
  grep -q "ckpt-000000010 stopped after batch 10 of epoch 1 on 1 rank(s), this run has 2: data.sampler partition cannot continue that epoch on another number of ranks" "$tmp/p2.err" ||
    fail "partition: the refusal does not name data.sampler and both world sizes"
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${p[@]}" dist.nproc=1 "log.dir=$tmp/p" >"$tmp/p3.out" 2>"$tmp/p3.err" ||
    fail "partition: resume on the same number of ranks"
  grep -q "resuming from .*ckpt-000000010 " "$tmp/p3.out" || fail "partition: did not resume from step 10"
  metrics_contiguous "$tmp/p"
  run_and_kill pe "$tmp/pe" "$net_steps_per_epoch" "${net[@]}" data.sampler=partition checkpoint.every_epochs=1 dist.nproc=1
  "$bin" train "$tmp/c.yaml" "${net[@]}" data.sampler=partition checkpoint.every_epochs=1 dist.nproc=2 "log.dir=$tmp/pe" \
    >"$tmp/pe2.out" 2>"$tmp/pe2.err" || fail "partition: resume on 2 ranks at an epoch's end"
  tail -1 "$tmp/pe2.out" | grep -q "^test accuracy" || fail "partition: the resume at an epoch's end did not complete"
  echo "ok: data.sampler partition refuses another world size in mid-epoch, accepts it at an epoch's end"
  ;;
exact)
  for m in net resnet; do
    eval "args=(\"\${$m[@]}\")"
    "$bin" train "$tmp/c.yaml" "${args[@]}" "log.dir=$tmp/$m-full" >"$tmp/$m-full.out" 2>"$tmp/$m-full.err" || fail "$m: straight run"
    # kill -9 of the launcher after the end-of-epoch-1 checkpoint, then resume
    eval "spe=\$${m}_steps_per_epoch"
    run_and_kill "$m-a" "$tmp/$m-a" "$spe" "${args[@]}" checkpoint.every_epochs=1
    "$bin" train "$tmp/c.yaml" "${args[@]}" checkpoint.every_epochs=1 "log.dir=$tmp/$m-a" >"$tmp/$m-a2.out" 2>"$tmp/$m-a2.err" || fail "$m: resume"
    grep -q "resuming from" "$tmp/$m-a2.out" || fail "$m: did not resume"
    same_run "$tmp/$m-full" "$tmp/$m-a" "$m, killed at an epoch boundary"
    metrics_contiguous "$tmp/$m-a"
    # mid-epoch: checkpoints every 5 steps, killed after the one of step 10
    run_and_kill "$m-b" "$tmp/$m-b" 10 "${args[@]}" checkpoint.every_steps=5
    "$bin" train "$tmp/c.yaml" "${args[@]}" checkpoint.every_steps=5 "log.dir=$tmp/$m-b" >"$tmp/$m-b2.out" 2>"$tmp/$m-b2.err" || fail "$m: resume mid-epoch"
    grep -q "resuming from .*ckpt-0000000[1-9][05] " "$tmp/$m-b2.out" || fail "$m: did not resume mid-epoch: $(grep resuming "$tmp/$m-b2.out")"
    same_run "$tmp/$m-full" "$tmp/$m-b" "$m, killed mid-epoch"
    metrics_contiguous "$tmp/$m-b"
    echo "ok: $m resumes exactly (epoch boundary and mid-epoch)"
  done
  ;;
stop)
  # SIGTERM to the launcher between steps 19 and 20: step 20 is finished and kept
  stop_case stop step:20:launcher:0:TERM 143 SIGTERM 20 "${net[@]}"
  ;;
stop_eval)
  # SIGINT to rank 1 alone inside the evaluation after epoch 1 (step 64; 16 batches of 8
  # per rank, the signal after the first): the evaluation is finished, the ranks agree
  # after it, and the checkpoint of step 64 is written (there is no scheduled one)
  stop_case stop_eval eval:64:self:1:INT 130 SIGINT 64 "${net[@]}" train.eval_every=1 checkpoint.every_epochs=0 \
    data.eval_batch_size=16
  # SIGTERM to the launcher inside the run's last evaluation (step 128): the run finishes
  # (only the end-of-run check and model.safetensors were left): exit 0, an end line
  rc=0
  RINGTRAIN_TEST_SIGNAL_AT=eval:128:launcher:0:TERM "$bin" train "$tmp/c.yaml" "${net[@]}" train.eval_every=1 \
    checkpoint.every_epochs=0 data.eval_batch_size=16 "log.dir=$tmp/last" >"$tmp/last.out" 2>"$tmp/last.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "a stop in the last evaluation: exit $rc, expected 0 (the run finishes)"
  [ -f "$tmp/last/model.safetensors" ] || fail "a stop in the last evaluation: no model.safetensors"
  grep -q '"kind": "end"' "$tmp/last/metrics.jsonl" || fail "a stop in the last evaluation: no end line"
  same_run "$tmp/stop_eval-full" "$tmp/last" "a stop in the last evaluation"
  echo "ok: a stop in the run's last evaluation lets it finish"
  ;;
stop_ckpt)
  # SIGTERM to the launcher while rank 0 writes the scheduled checkpoint of step 30: the
  # write completes, the ranks agree after it and stop there (no checkpoint of step 31)
  stop_case stop_ckpt ckpt:30:launcher:0:TERM 143 SIGTERM 30 "${net[@]}" checkpoint.every_steps=10
  ;;
steps)
  # train.max_steps ends a run in mid-epoch; the same command with more steps continues with
  # the next batch of that epoch (it skipped the rest of the epoch: the position was saved
  # as the next epoch's start) and equals the uninterrupted run
  "$bin" train "$tmp/c.yaml" "${net[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.max_steps=40 "log.dir=$tmp/m" >"$tmp/m1.out" 2>"$tmp/m1.err" || fail "40 steps"
  "$bin" train "$tmp/c.yaml" "${net[@]}" "log.dir=$tmp/m" >"$tmp/m2.out" 2>"$tmp/m2.err" || fail "resume to the end"
  grep -q "resuming from .*ckpt-000000040" "$tmp/m2.out" || fail "did not resume from step 40: $(grep resuming "$tmp/m2.out")"
  same_run "$tmp/full" "$tmp/m" "stopped by train.max_steps in mid-epoch, then resumed"
  metrics_contiguous "$tmp/m"
  echo "ok: a run ended by train.max_steps in mid-epoch resumes with the next batch"
  ;;
world)
  for pair in "1 2" "2 1"; do
    set -- $pair
    d=$tmp/w$1$2
    run_and_kill "w$1" "$d" 10 "${net[@]}" checkpoint.every_steps=10 dist.nproc=$1
    "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=10 dist.nproc=$2 "log.dir=$d" >"$tmp/w$2.out" 2>"$tmp/w$2.err" ||
      fail "resume with $2 rank(s) of a run saved with $1"
    grep -q "written by $1 rank(s), this run has $2: the rest of epoch 1 is re-partitioned" "$tmp/w$2.out" ||
      fail "no re-partition message ($1 -> $2)"
    tail -1 "$tmp/w$2.out" | grep -q "^test accuracy" || fail "$1 -> $2 did not complete"
    metrics_contiguous "$d"
  done
  echo "ok: resume across world sizes (1 -> 2, 2 -> 1)"
  ;;
corrupt)
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=3 checkpoint.every_epochs=1 "log.dir=$tmp/c" >"$tmp/c.out" 2>&1 || fail "run"
  newest=$(ls -d "$tmp"/c/checkpoints/ckpt-* | tail -1)
  # flip one byte in the tensor data of the newest checkpoint's model
  f=$newest/model.safetensors
  size=$(stat -c %s "$f")
  /usr/bin/python3 -c "import sys; p=sys.argv[1]; b=bytearray(open(p,'rb').read()); b[-5]^=0x40; open(p,'wb').write(b)" "$f"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=3 checkpoint.every_epochs=1 "log.dir=$tmp/c" >"$tmp/c2.out" 2>"$tmp/c2.err" || fail "resume"
  grep -q "refused:.*crc32" "$tmp/c2.err" || fail "the corrupt checkpoint was not refused with its reason"
  grep -q "resuming from .*ckpt-" "$tmp/c2.out" || fail "auto did not fall back to the previous checkpoint"
  ! grep -q "resuming from $newest" "$tmp/c2.out" || fail "resumed from the corrupt checkpoint"
  # a truncated header is refused too
  newest=$(ls -d "$tmp"/c/checkpoints/ckpt-* | tail -1)
  head -c 20 "$newest/train.safetensors" > "$tmp/t" && cp "$tmp/t" "$newest/train.safetensors"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=3 checkpoint.every_epochs=1 "log.dir=$tmp/c" >"$tmp/c3.out" 2>"$tmp/c3.err" || fail "resume 2"
  grep -q "refused" "$tmp/c3.err" || fail "the truncated checkpoint was not refused"
  # passing over a corrupt newer checkpoint is not a rollback: nothing is moved aside
  ! ls -d "$tmp"/c/checkpoints/abandoned-* 2>/dev/null || fail "resume: auto moved checkpoints aside"
  echo "ok: corrupted checkpoints are refused and auto falls back"
  ;;
eval)
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=1 "log.dir=$tmp/e" >"$tmp/e.out" 2>&1 || fail "run"
  acc=$(tail -1 "$tmp/e.out" | sed -n 's/^test accuracy \([0-9.]*\)%.*/\1/p')
  ck=$(ls -d "$tmp"/e/checkpoints/ckpt-* | tail -1)
  for n in 1 2 3; do
    "$bin" eval "$ck" --nproc $n >"$tmp/ev$n.out" 2>"$tmp/ev$n.err" || fail "eval with $n rank(s)"
    grep -q "accuracy $acc% (256 test samples, $n rank(s))" "$tmp/ev$n.out" || fail "eval with $n rank(s): $(tail -1 "$tmp/ev$n.out"), training said $acc%"
  done
  "$bin" eval "$tmp/c.yaml" "${net[@]}" "log.dir=$tmp/e" >"$tmp/ev.out" 2>&1 || fail "eval of a config (its newest checkpoint)"
  grep -q "accuracy $acc%" "$tmp/ev.out" || fail "eval CONFIG: $(tail -1 "$tmp/ev.out")"
  echo "ok: ringtrain eval gives the training's accuracy with 1, 2, 3 ranks"
  ;;
schedule)
  # a schedule whose length is the run's (one-cycle, cosine with a warmup): stopped by
  # train.max_steps in mid-epoch and resumed with more steps, it equals the uninterrupted
  # run (the lengths were those of the 40 steps the first command ran, and were recomputed
  # on resume); the saved lengths are restored (schedule.* metadata)
  for sch in "optim.schedule=onecycle" "optim.schedule=cosine optim.warmup_steps=8"; do
    n=${sch%%[ =]*}; n=$(echo "$sch" | sed 's/optim.schedule=\([a-z]*\).*/\1/')
    # shellcheck disable=SC2086
    "$bin" train "$tmp/c.yaml" "${net[@]}" optim.lr=0.05 $sch "log.dir=$tmp/$n-full" >"$tmp/$n-full.out" 2>"$tmp/$n-full.err" || fail "$n: straight run"
    # shellcheck disable=SC2086
    "$bin" train "$tmp/c.yaml" "${net[@]}" optim.lr=0.05 $sch train.max_steps=40 "log.dir=$tmp/$n" >"$tmp/$n-1.out" 2>"$tmp/$n-1.err" || fail "$n: 40 steps"
    # shellcheck disable=SC2086
    "$bin" train "$tmp/c.yaml" "${net[@]}" optim.lr=0.05 $sch "log.dir=$tmp/$n" >"$tmp/$n-2.out" 2>"$tmp/$n-2.err" || fail "$n: resume"
    grep -q "resuming from .*ckpt-000000040" "$tmp/$n-2.out" || fail "$n: did not resume from step 40"
    same_run "$tmp/$n-full" "$tmp/$n" "$n schedule stopped by train.max_steps, then resumed"
    /usr/bin/python3 - "$(ls -d "$tmp/$n"/checkpoints/ckpt-* | tail -1)" <<'PY' || fail "$n: schedule metadata"
import json, struct, sys
b = open(sys.argv[1] + "/train.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
m = json.loads(b[8:8 + n])["__metadata__"]
assert m["schedule.step"] == m["step"] == "128", m
assert m["schedule.total_steps"] == "128" and m["schedule.steps_per_epoch"] == "64", m
PY
  done
  # a resume that changes a key of the trajectory is refused with the key and both values
  d=$tmp/onecycle
  "$bin" train "$tmp/c.yaml" "${net[@]}" optim.schedule=onecycle optim.lr=0.02 train.epochs=3 "log.dir=$d" >"$tmp/ch.out" 2>"$tmp/ch.err" &&
    fail "a resume with another optim.lr was accepted"
  grep -q "optim.lr.*0.05.*0.02" "$tmp/ch.err" || fail "the refusal does not name optim.lr and both values: $(cat "$tmp/ch.err")"
  grep -q "checkpoint.allow_changes" "$tmp/ch.err" || fail "the refusal does not say how to apply the change"
  "$bin" train "$tmp/c.yaml" "${net[@]}" optim.schedule=onecycle optim.lr=0.05 data.augment=false train.epochs=3 "log.dir=$d" >"$tmp/ch2.out" 2>"$tmp/ch2.err" &&
    fail "a resume with another data.augment was accepted"
  grep -q "data.augment.*true.*false" "$tmp/ch2.err" || fail "the refusal does not name data.augment: $(cat "$tmp/ch2.err")"
  [ "$(ls -d "$d"/checkpoints/ckpt-* | tail -1)" = "$d/checkpoints/ckpt-000000128" ] || fail "a refused resume wrote a checkpoint"
  # stated: applied and logged; train.epochs (free) trains longer
  "$bin" train "$tmp/c.yaml" "${net[@]}" optim.schedule=onecycle optim.lr=0.02 train.epochs=3 'checkpoint.allow_changes=[optim.lr]' "log.dir=$d" >"$tmp/ch3.out" 2>"$tmp/ch3.err" ||
    fail "a resume with checkpoint.allow_changes=[optim.lr]: $(tail -3 "$tmp/ch3.err")"
  grep -q "checkpoint.allow_changes: optim.lr 0.05 -> 0.02" "$tmp/ch3.out" || fail "the allowed change was not logged"
  grep -q "resuming from .*ckpt-000000128" "$tmp/ch3.out" || fail "did not resume from step 128"
  ls -d "$d"/checkpoints/ckpt-000000192 >/dev/null || fail "the longer run did not reach step 192"
  # trained longer, the one-cycle schedule keeps its saved length (128 steps) and holds its
  # final lr past it, as a restored OneCycleLR would (recomputed, it spans 192 steps)
  grep -q "the schedule keeps its saved lengths (.*total_steps 128" "$tmp/ch3.out" || fail "the kept schedule was not reported"
  /usr/bin/python3 - "$d/checkpoints/ckpt-000000192" "$d/metrics.jsonl" <<'PY' || fail "the schedule was not restored"
import json, struct, sys
b = open(sys.argv[1] + "/train.safetensors", "rb").read(); n = struct.unpack("<Q", b[:8])[0]
m = json.loads(b[8:8 + n])["__metadata__"]
assert m["schedule.total_steps"] == "128" and m["schedule.step"] == "192", m
lr = {r["step"]: r["lr"] for r in map(json.loads, open(sys.argv[2])) if r.get("kind") == "step"}
assert lr[129] == lr[160] == lr[192] < lr[100], (lr[100], lr[129], lr[160], lr[192])
PY
  # optim.eps auto and the value it stands for (1e-8 here; what a checkpoint written before
  # auto existed holds) are the same run; another value is refused
  "$bin" train "$tmp/c.yaml" "${net[@]}" optim.schedule=onecycle optim.lr=0.02 train.epochs=4 optim.eps=1e-7 "log.dir=$d" >"$tmp/ch4.out" 2>"$tmp/ch4.err" &&
    fail "a resume with another optim.eps was accepted"
  grep -q "optim.eps.*auto.*1e-07" "$tmp/ch4.err" || fail "the refusal does not name optim.eps: $(cat "$tmp/ch4.err")"
  "$bin" train "$tmp/c.yaml" "${net[@]}" optim.schedule=onecycle optim.lr=0.02 train.epochs=4 optim.eps=1e-8 "log.dir=$d" >"$tmp/ch5.out" 2>"$tmp/ch5.err" ||
    fail "optim.eps=1e-8 against a checkpoint with optim.eps auto was refused: $(tail -3 "$tmp/ch5.err")"
  grep -q "resuming from .*ckpt-000000192" "$tmp/ch5.out" || fail "did not resume from step 192"
  echo "ok: schedule state restored (exact resume after max_steps); changed keys refused unless allowed"
  ;;
runid)
  # a checkpoint folder belongs to one run: resume none in a folder with another run's
  # checkpoints refuses; checkpoint.overwrite moves them aside (nothing is lost)
  d=$tmp/r
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=1 "log.dir=$d" >"$tmp/r1.out" 2>"$tmp/r1.err" || fail "run 1"
  id1=$(meta "$d/checkpoints/ckpt-000000064" run_id)
  echo "$id1" | grep -qE '^[0-9a-f]{16}$' || fail "run_id '$id1' is not 16 hex digits"
  grep '"kind": "start"' "$d/metrics.jsonl" | grep -q "\"run_id\": \"$id1\"" || fail "metrics.jsonl's start line lacks run_id $id1"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=1 checkpoint.resume=none "log.dir=$d" >"$tmp/r2.out" 2>"$tmp/r2.err" &&
    fail "resume none in a folder holding another run's checkpoints was accepted"
  grep -q "checkpoint.overwrite" "$tmp/r2.err" && grep -q "checkpoint.dir" "$tmp/r2.err" || fail "the refusal does not say what to do: $(cat "$tmp/r2.err")"
  [ "$(meta "$d/checkpoints/ckpt-000000064" run_id)" = "$id1" ] || fail "the refused run touched the checkpoints"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=1 train.seed=3 checkpoint.resume=none checkpoint.overwrite=true "log.dir=$d" >"$tmp/r3.out" 2>"$tmp/r3.err" ||
    fail "checkpoint.overwrite=true: $(tail -3 "$tmp/r3.err")"
  [ -d "$d/checkpoints/old-$id1/ckpt-000000064" ] || fail "the old checkpoints were not moved into old-$id1/: $(ls "$d/checkpoints")"
  [ "$(meta "$d/checkpoints/old-$id1/ckpt-000000064" run_id)" = "$id1" ] || fail "the moved checkpoint changed"
  id2=$(meta "$d/checkpoints/ckpt-000000064" run_id)
  [ -n "$id2" ] && [ "$id2" != "$id1" ] || fail "the new run's id '$id2' (old $id1)"
  grep -q "moved .* aside into .*old-$id1" "$tmp/r3.out" || fail "the move was not reported"
  # a resume keeps the run's id
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.epochs=2 train.seed=3 "log.dir=$d" >"$tmp/r4.out" 2>"$tmp/r4.err" || fail "resume"
  [ "$(meta "$d/checkpoints/ckpt-000000128" run_id)" = "$id2" ] || fail "the resumed run changed its id"
  echo "ok: resume none refuses another run's folder; overwrite moves it aside; run ids kept on resume"
  ;;
ranks)
  # rank 0 chooses the checkpoint and every rank loads that one: rank 1 sees node-local
  # folders (RINGTRAIN_TEST_RANK_PATH) that hold a newer checkpoint (it resumed from it,
  # and the ranks' parameters differed) or lack rank 0's choice (the job fails naming it)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.max_steps=20 checkpoint.every_steps=10 "log.dir=$tmp/a" >"$tmp/a1.out" 2>"$tmp/a1.err" || fail "20 steps"
  cp -r "$tmp/a" "$tmp/b" && cp -r "$tmp/a" "$tmp/c"
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.max_steps=30 checkpoint.every_steps=10 "log.dir=$tmp/b" >"$tmp/b1.out" 2>"$tmp/b1.err" || fail "b to 30 steps"
  rm -rf "$tmp/c/checkpoints/ckpt-000000020"
  # eval: rank 1 loads rank 0's choice (ckpt-20), not its own newest (ckpt-30)
  "$bin" eval "$tmp/a/checkpoints/ckpt-000000020" --nproc 1 >"$tmp/e1.out" 2>"$tmp/e1.err" || fail "eval of ckpt-20, 1 rank"
  acc=$(sed -n 's/.*accuracy \([0-9.]*%\).*/\1/p' "$tmp/e1.out")
  RINGTRAIN_TEST_RANK_PATH="1:$tmp/a=$tmp/b" "$bin" eval "$tmp/c.yaml" "${net[@]}" train.max_steps=20 "log.dir=$tmp/a" >"$tmp/e2.out" 2>"$tmp/e2.err" || fail "eval, rank 1 sees b: $(tail -3 "$tmp/e2.err")"
  grep -q "ckpt-000000020 (step 20): .*accuracy $acc" "$tmp/e2.out" || fail "eval did not evaluate rank 0's ckpt-20 on every rank ($acc): $(cat "$tmp/e2.out")"
  RINGTRAIN_TEST_RANK_PATH="1:$tmp/a=$tmp/c" "$bin" eval "$tmp/c.yaml" "${net[@]}" "log.dir=$tmp/a" >"$tmp/e3.out" 2>"$tmp/e3.err" && fail "eval with rank 1 lacking rank 0's checkpoint succeeded"
  grep -q "$tmp/c/checkpoints/ckpt-000000020.*No such file" "$tmp/e3.err" || fail "eval: the failure does not name the path and the reason: $(cat "$tmp/e3.err")"
  # train: rank 1 lacks rank 0's choice: the job fails, naming the path and the reason
  cp -r "$tmp/a" "$tmp/a0"
  RINGTRAIN_TEST_RANK_PATH="1:$tmp/a=$tmp/c" "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=10 "log.dir=$tmp/a" >"$tmp/t1.out" 2>"$tmp/t1.err" && fail "resume with rank 1 lacking rank 0's checkpoint succeeded"
  grep -q "$tmp/c/checkpoints/ckpt-000000020.*No such file" "$tmp/t1.err" || fail "the failure does not name the path and the reason: $(cat "$tmp/t1.err")"
  [ ! -d "$tmp/a/checkpoints/ckpt-000000030" ] || fail "the failed resume trained on"
  # rank 1's folder holds a newer checkpoint: every rank resumes from rank 0's ckpt-20
  RINGTRAIN_TEST_RANK_PATH="1:$tmp/a=$tmp/b" "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=10 "log.dir=$tmp/a" >"$tmp/t2.out" 2>"$tmp/t2.err" ||
    fail "resume with rank 1 seeing a newer checkpoint: $(tail -3 "$tmp/t2.err")"
  grep -q "resuming from .*ckpt-000000020" "$tmp/t2.out" || fail "did not resume from rank 0's ckpt-20"
  same_run "$tmp/full" "$tmp/a" "rank 1 saw a newer checkpoint"
  echo "ok: rank 0 chooses the checkpoint, every rank loads it or the job fails naming it"
  ;;
torchvision)
  # the final checkpoint in torchvision.models.resnet34 (strict=True) scores ringtrain's accuracy
  /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null || { echo "SKIP: no torch at /usr/bin/python3"; exit 77; }
  "$bin" train "$tmp/c.yaml" model.arch=resnet34 data.train_subset=256 data.test_subset=500 data.batch_size=32 \
    train.threads=2 train.max_steps=4 optim.lr=0.05 log.progress=off dist.nproc=1 "log.dir=$tmp/tv" >"$tmp/tv.out" 2>&1 || fail "run"
  acc=$(tail -1 "$tmp/tv.out" | sed -n 's/^test accuracy \([0-9.]*\)%.*/\1/p')
  ck=$(ls -d "$tmp"/tv/checkpoints/ckpt-* | tail -1)
  /usr/bin/python3 - "$ck/model.safetensors" "$data" "$acc" <<'PY' || fail "torchvision disagrees"
import gzip, json, struct, sys
import torch, torch.nn as nn, torchvision
path, data, acc = sys.argv[1], sys.argv[2], float(sys.argv[3])
b = open(path, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
dt = {"F32": torch.float32, "I64": torch.int64}
sd = {k: torch.frombuffer(bytearray(d[v["data_offsets"][0]:v["data_offsets"][1]]), dtype=dt[v["dtype"]]).reshape(v["shape"])
      for k, v in h.items() if k != "__metadata__"}
m = torchvision.models.resnet34(num_classes=10)
m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
m.load_state_dict(sd, strict=True)
m.eval()
with gzip.open(data + "/t10k-images-idx3-ubyte.gz") as f:
    f.read(16); x = f.read(500 * 784)
with gzip.open(data + "/t10k-labels-idx1-ubyte.gz") as f:
    f.read(8); y = torch.tensor(list(f.read(500)))
x = (torch.frombuffer(bytearray(x), dtype=torch.uint8).float().view(500, 1, 28, 28) / 255 - 0.2860) / 0.3530
with torch.no_grad():
    got = 100.0 * (m(x).argmax(1) == y).float().mean().item()
print("torchvision %.2f%%, ringtrain %.2f%%" % (got, acc))
assert abs(got - acc) <= 0.1, (got, acc)
PY
  echo "ok: torchvision resnet34 (strict=True) gives ringtrain's accuracy"
  ;;
restart)
  # --max-restarts: rank 1 SIGKILLs itself right after step 12 of epoch 1 (checkpoints every
  # 5 steps) in the first attempt only (RINGTRAIN_TEST_KILL_RANK_AT reads the attempt from
  # TORCHELASTIC_RESTART_COUNT, which the launcher exports); the launcher restarts the job
  # from ckpt-10, and the run equals the uninterrupted one
  ck=(checkpoint.every_steps=5 log.all_ranks=true dist.timeout_s=60)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  restarted() { # name dir: the job was restarted once, from ckpt-10, and its logs have no gap or duplicate
    local name=$1 d=$2 ck10
    ck10=$(printf '%s/checkpoints/ckpt-%09d' "$d" 10)
    [ "$(grep -c "restarting" "$tmp/$name.err")" -eq 1 ] || fail "$name: expected one restart, stderr has: $(grep restarting "$tmp/$name.err")"
    grep -q "^ringtrain: rank 1 was killed by SIGKILL: RINGTRAIN_TEST_KILL_RANK_AT: rank 1 kills itself after step 12 (attempt 0); restarting (1/1) from the newest checkpoint, $ck10\$" "$tmp/$name.err" ||
      fail "$name: no restart line naming rank 1, SIGKILL and $ck10: $(grep restarting "$tmp/$name.err")"
    grep -q "^ringtrain: resuming from $ck10 " "$tmp/$name.out" || fail "$name: the restarted attempt did not resume from $ck10: $(grep resuming "$tmp/$name.out")"
    tail -1 "$tmp/$name.out" | grep -q "^test accuracy .* after 128 steps" || fail "$name: the job did not complete: $(tail -1 "$tmp/$name.out")"
    same_run "$tmp/full" "$d" "$name: restarted after rank 1 died at step 12"
    /usr/bin/python3 - "$d" <<'PY' || fail "$name: the logs of the restarted job have a gap or a duplicate"
import json, sys
d = sys.argv[1]
lines = [json.loads(l) for l in open(d + "/metrics.jsonl")]
of = lambda k: [l for l in lines if l["kind"] == k]
steps = [l["step"] for l in of("step")]
assert steps == list(range(1, 129)), "step lines: %s" % steps
starts = [(l.get("resumed_from_step"), l.get("restart_count")) for l in of("start")]
assert starts == [(None, None), (10, 1)], "start lines (resumed_from_step, restart_count): %s" % starts
assert [l["step"] for l in of("eval")] == [64, 128], "eval lines at steps %s" % [l["step"] for l in of("eval")]
ck = [l["step"] for l in of("checkpoint")]
assert ck == sorted(set(range(5, 128, 5)) | {64, 128}), "checkpoint lines at steps %s" % ck  # every 5 steps, every epoch
assert len(of("end")) == 1, "%d end lines" % len(of("end"))
for r in (0, 1):
    rs = [json.loads(l)["step"] for l in open("%s/metrics-rank%d.jsonl" % (d, r)) if '"kind": "step"' in l]
    assert rs == list(range(1, 129)), "metrics-rank%d.jsonl steps: %s" % (r, rs)
PY
  }
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=1:12 "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/r" --max-restarts 1 \
    >"$tmp/r.out" 2>"$tmp/r.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "--max-restarts 1: the job exited $rc after rank 1 died, expected 0 (restarted)"
  restarted r "$tmp/r"
  echo "ok: --max-restarts 1 restarts the job from ckpt-10 after rank 1 died; it equals the uninterrupted run"
  # checkpoint.resume: none with checkpoint.overwrite in a folder holding an older run's checkpoints (moved
  # aside; another seed, up to step 128): the restart resumes from this job's ckpt-10, never from the old ckpt-128
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.seed=7 "log.dir=$tmp/n" >"$tmp/old.out" 2>"$tmp/old.err" || fail "the older run"
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=1:12 "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" checkpoint.resume=none checkpoint.overwrite=true "log.dir=$tmp/n" \
    --max-restarts 1 >"$tmp/n.out" 2>"$tmp/n.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "resume: none: the job exited $rc after rank 1 died, expected 0 (restarted)"
  restarted n "$tmp/n"
  # the same, killed at step 3, before the job wrote a checkpoint: the restart starts afresh
  # as the first attempt did (resume: none), not from the older run's checkpoints
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.seed=7 "log.dir=$tmp/n3" >"$tmp/old3.out" 2>"$tmp/old3.err" || fail "the older run (2)"
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=1:3 "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" checkpoint.resume=none checkpoint.overwrite=true "log.dir=$tmp/n3" \
    --max-restarts 1 >"$tmp/n3.out" 2>"$tmp/n3.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "resume: none, killed at step 3: the job exited $rc, expected 0 (restarted)"
  grep -q "^ringtrain: rank 1 was killed by SIGKILL: .*; restarting (1/1) as the job started (it wrote no checkpoint yet; checkpoint.resume: none)\$" "$tmp/n3.err" ||
    fail "resume: none, killed at step 3: no restart line saying it starts afresh: $(grep restarting "$tmp/n3.err")"
  ! grep -q "resuming from" "$tmp/n3.out" || fail "resume: none, killed at step 3: the restart resumed: $(grep resuming "$tmp/n3.out")"
  same_run "$tmp/full" "$tmp/n3" "resume: none, restarted afresh after rank 1 died at step 3"
  metrics_contiguous "$tmp/n3"
  echo "ok: with checkpoint.resume: none the restart resumes from the job's own checkpoint, or starts afresh"
  # one rank: the launcher still starts it as a process, so that it can restart it
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=0:12 "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" dist.nproc=1 "log.dir=$tmp/one" \
    --max-restarts 1 >"$tmp/one.out" 2>"$tmp/one.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "one rank: the job exited $rc after the rank died, expected 0 (restarted)"
  grep -q "^ringtrain: rank 0 was killed by SIGKILL: .*; restarting (1/1) from the newest checkpoint, .*ckpt-000000010\$" "$tmp/one.err" ||
    fail "one rank: no restart line: $(grep restarting "$tmp/one.err")"
  grep -q "^ringtrain: resuming from .*ckpt-000000010 " "$tmp/one.out" || fail "one rank: the restarted attempt did not resume"
  # --max-restarts 0 (the default): the same death fails the job, naming rank 1
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=1:12 "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/z" >"$tmp/z.out" 2>"$tmp/z.err" || rc=$?
  [ "$rc" -eq 137 ] || fail "--max-restarts 0: exit $rc, expected 137 (rank 1 killed by SIGKILL)"
  ! grep -q "restarting" "$tmp/z.err" || fail "--max-restarts 0 restarted the job"
  grep -q "^ringtrain: rank 1 was killed by SIGKILL (its last error is above); the other ranks were stopped\$" "$tmp/z.err" ||
    fail "--max-restarts 0: the failure does not name rank 1 and SIGKILL: $(tail -1 "$tmp/z.err")"
  # the rank dies in every attempt: one restart, then the job fails naming the failure
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=1:12:every "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/e" --max-restarts 1 \
    >"$tmp/e.out" 2>"$tmp/e.err" || rc=$?
  [ "$rc" -eq 137 ] || fail "killed in every attempt: exit $rc, expected 137 (rank 1 killed by SIGKILL)"
  [ "$(grep -c "restarting (1/1)" "$tmp/e.err")" -eq 1 ] && ! grep -q "restarting (2/" "$tmp/e.err" ||
    fail "killed in every attempt: expected exactly one restart: $(grep restarting "$tmp/e.err")"
  grep -q "^ringtrain: rank 1 was killed by SIGKILL (its last error is above); the other ranks were stopped; no restarts left (1 of --max-restarts 1 used)\$" "$tmp/e.err" ||
    fail "killed in every attempt: the final failure does not name rank 1, SIGKILL and the restarts used: $(tail -1 "$tmp/e.err")"
  [ "$(grep -c "kills itself after step 12 (attempt 1)" "$tmp/e.err")" -eq 1 ] || fail "killed in every attempt: the second attempt did not die at step 12"
  echo "ok: without restarts the death fails the job; with one restart, dying again fails it after that restart"
  # a stop is never restarted: SIGTERM to the launcher before step 20 (rank 0 sends it,
  # RINGTRAIN_TEST_SIGNAL_AT) stops the job with the checkpoint of step 20 and exit 143,
  # as without --max-restarts
  rc=0
  RINGTRAIN_TEST_SIGNAL_AT=step:20:launcher:0:TERM "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/s" \
    --max-restarts 1 >"$tmp/s.out" 2>"$tmp/s.err" || rc=$?
  [ "$rc" -eq 143 ] || fail "stop: SIGTERM to the launcher with --max-restarts 1: exit $rc, expected 143"
  ! grep -q "restarting" "$tmp/s.err" || fail "stop: the job was restarted after SIGTERM to the launcher"
  grep -q "^stopped by SIGTERM after step 20;" "$tmp/s.out" || fail "stop: no resume hint naming step 20: $(tail -2 "$tmp/s.out")"
  echo "ok: SIGTERM to the launcher stops the job and is not restarted"
  ;;
restart_term)
  # one rank preempted under --max-restarts (issue 38): SIGTERM to rank 1 alone, before step
  # 20 (RINGTRAIN_TEST_SIGNAL_AT, sent by that rank to itself: an exact point). The ranks agree
  # to stop: the job ends with the stop checkpoint of step 20, exit 143 as a clean stop, and
  # no restart (a stop someone asked for is not a failure); running it again resumes and
  # ends bit for bit where the uninterrupted run does
  ck=(checkpoint.every_steps=5 log.all_ranks=true dist.timeout_s=60)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  rc=0
  RINGTRAIN_TEST_SIGNAL_AT=step:20:self:1:TERM "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/t" \
    --max-restarts 2 >"$tmp/t.out" 2>"$tmp/t.err" || rc=$?
  [ "$rc" -eq 143 ] || fail "SIGTERM to rank 1 with --max-restarts 2: exit $rc, expected 143 (a clean stop)"
  ! grep -q "restarting" "$tmp/t.err" || fail "SIGTERM to rank 1: the job was restarted: $(grep restarting "$tmp/t.err")"
  ! grep -qE '^\[ringtrain( rank [0-9]+)?\] E |error:|was killed|exited with code' "$tmp/t.err" ||
    fail "SIGTERM to rank 1: a clean stop printed an error: $(grep -E '^\[ringtrain( rank [0-9]+)?\] E |error:|was killed|exited with code' "$tmp/t.err" | head -3)"
  ck20=$(printf '%s/checkpoints/ckpt-%09d' "$tmp/t" 20)
  newest=$(ls -d "$tmp/t"/checkpoints/ckpt-* | tail -1)
  [ "$newest" = "$ck20" ] || fail "SIGTERM to rank 1: newest checkpoint '$newest', expected the stop checkpoint $ck20"
  grep -q "^stopped by SIGTERM after step 20; checkpoint in $tmp/t/checkpoints/;" "$tmp/t.out" ||
    fail "SIGTERM to rank 1: no stop line naming step 20: $(tail -2 "$tmp/t.out")"
  grep -q '"why": "stop"' "$tmp/t/metrics.jsonl" || fail "SIGTERM to rank 1: no checkpoint line with why: stop"
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/t" --max-restarts 2 >"$tmp/t2.out" 2>"$tmp/t2.err" || fail "SIGTERM to rank 1: the rerun"
  grep -q "^ringtrain: resuming from $ck20 " "$tmp/t2.out" || fail "SIGTERM to rank 1: the rerun did not resume from $ck20"
  same_run "$tmp/full" "$tmp/t" "SIGTERM to rank 1, then the same command again"
  metrics_contiguous "$tmp/t"
  echo "ok: SIGTERM to one rank under --max-restarts 2 stops the job cleanly at the stop checkpoint (exit 143), without a restart"
  ;;
restart_repeat)
  # a failure that repeats with the same cause at the same step, with no checkpoint in
  # between, stops the restarts (issue 38): rank 1 SIGKILLs itself right after step 12 in every
  # attempt (RINGTRAIN_TEST_KILL_RANK_AT=1:12:every); with --max-restarts 3 the job is restarted
  # once from ckpt-10, dies the same way, and stops saying why instead of using all 3
  ck=(checkpoint.every_steps=5 dist.timeout_s=60)
  rc=0
  RINGTRAIN_TEST_KILL_RANK_AT=1:12:every "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/e" --max-restarts 3 \
    >"$tmp/e.out" 2>"$tmp/e.err" || rc=$?
  [ "$rc" -eq 137 ] || fail "the same death in every attempt: exit $rc, expected 137 (rank 1 killed by SIGKILL)"
  [ "$(grep -c "restarting" "$tmp/e.err")" -eq 1 ] && grep -q "restarting (1/3) from the newest checkpoint, .*ckpt-000000010\$" "$tmp/e.err" ||
    fail "the same death in every attempt: expected exactly one restart, from ckpt-10: $(grep restarting "$tmp/e.err")"
  grep -q "^ringtrain: rank 1 was killed by SIGKILL (its last error is above); the other ranks were stopped; not restarted: the same failure as in the attempt before, after step 12, with no checkpoint in between\$" "$tmp/e.err" ||
    fail "the same death in every attempt: the last line does not say why the restarts stopped: $(tail -1 "$tmp/e.err")"
  [ "$(grep -c "^RINGTRAIN_TEST_KILL_RANK_AT: rank 1 kills itself after step 12" "$tmp/e.err")" -eq 2 ] || fail "the same death in every attempt: expected two attempts"
  echo "ok: the same death at the same step twice stops --max-restarts 3 after one restart, saying why"
  # deaths at different points still restart, also between the same two checkpoints:
  # RINGTRAIN_TEST_KILL_PLAN kills rank 1 after step 12 in the first attempt and after step 13
  # in the second (both resume from ckpt-10): two restarts, and the job completes as the
  # uninterrupted run does
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  rc=0
  RINGTRAIN_TEST_KILL_PLAN=0:1:12,1:1:13 "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/d" --max-restarts 3 \
    >"$tmp/d.out" 2>"$tmp/d.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "different points: exit $rc, expected 0 (restarted twice, then completed)"
  [ "$(grep -c "restarting" "$tmp/d.err")" -eq 2 ] && grep -q "restarting (2/3) from the newest checkpoint, .*ckpt-000000010\$" "$tmp/d.err" ||
    fail "different points: expected two restarts from ckpt-10, got: $(grep restarting "$tmp/d.err")"
  same_run "$tmp/full" "$tmp/d" "restarted after deaths at steps 12 and 13"
  metrics_contiguous "$tmp/d"
  echo "ok: deaths of the same rank by the same signal at different steps are restarted"
  ;;
ckpt_slow)
  # a checkpoint write slower than dist.timeout_s (issue 38): rank 0 stalls 8 s inside the
  # write of ckpt-10 (RINGTRAIN_TEST_CKPT_STALL: the stall is the fault, at an exact point)
  # with dist.timeout_s=3. The peers wait while rank 0's heartbeat comes (save.c), so the job
  # completes and equals the uninterrupted run; before, rank 1's wait was a collective
  # bounded by dist.timeout_s and the job failed with a timeout at every such checkpoint
  ck=(checkpoint.every_steps=5 dist.timeout_s=3)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  rc=0
  RINGTRAIN_TEST_CKPT_STALL=10:8 "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" "log.dir=$tmp/s" --max-restarts 1 \
    >"$tmp/s.out" 2>"$tmp/s.err" || rc=$?
  [ "$rc" -eq 0 ] || fail "a checkpoint write of 8 s with dist.timeout_s=3: exit $rc, expected 0"
  grep -q "^RINGTRAIN_TEST_CKPT_STALL: rank 0 stalls 8 s in the checkpoint of step 10" "$tmp/s.err" || fail "the stall did not happen"
  ! grep -q "restarting" "$tmp/s.err" || fail "the slow checkpoint made the job restart: $(grep restarting "$tmp/s.err")"
  ! grep -qE 'timed out|error:' "$tmp/s.err" || fail "the slow checkpoint printed an error: $(grep -E 'timed out|error:' "$tmp/s.err" | head -3)"
  same_run "$tmp/full" "$tmp/s" "a checkpoint write slower than dist.timeout_s"
  metrics_contiguous "$tmp/s"
  echo "ok: a checkpoint write of 8 s with dist.timeout_s=3 does not time out the peers; the run equals the uninterrupted one"
  # a rank 0 that dies during the write is still seen: SIGKILL to itself right before it
  # writes ckpt-10 (every attempt); the peers' wait ends with the job (the launcher stops
  # them, or the store rank 0 hosts closes), not after a beat timeout, and the second
  # identical death stops the restarts
  rc=0
  RINGTRAIN_TEST_SIGNAL_AT=ckpt:10:self:0:KILL "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=5 dist.timeout_s=60 \
    "log.dir=$tmp/k" --max-restarts 2 >"$tmp/k.out" 2>"$tmp/k.err" || rc=$?
  [ "$rc" -eq 137 ] || fail "rank 0 killed in the write: exit $rc, expected 137"
  grep -q "^ringtrain: rank 0 was killed by SIGKILL.*not restarted: the same failure as in the attempt before, after step 10, with no checkpoint in between\$" "$tmp/k.err" ||
    fail "rank 0 killed in the write: the job does not name rank 0's death: $(tail -1 "$tmp/k.err")"
  ! grep -q "gave no sign of progress" "$tmp/k.err" || fail "rank 0 killed in the write: the peers waited for the beat timeout"
  echo "ok: rank 0 killed during the write ends the job (its death is seen), and its repetition stops the restarts"
  ;;
branch)
  # a rollback is a new branch (issue 38, item 2): checkpoints every 10 steps, keep_last 3,
  # to step 30; resumed from ckpt-10 (checkpoint.resume=PATH) to step 25. It was silently
  # undone: the rolled-back run kept the run id, pruning kept the abandoned ckpt-30 and
  # deleted the new branch's older checkpoints, and the next plain run resumed ckpt-30
  d=$tmp/b
  ck=(checkpoint.every_steps=10 checkpoint.keep_last=3)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.max_steps=30 "log.dir=$d" >"$tmp/b1.out" 2>"$tmp/b1.err" || fail "30 steps"
  ida=$(meta "$d/checkpoints/ckpt-000000030" run_id)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.max_steps=25 "checkpoint.resume=$d/checkpoints/ckpt-000000010" "log.dir=$d" \
    >"$tmp/b2.out" 2>"$tmp/b2.err" || fail "the rollback to ckpt-10: $(tail -3 "$tmp/b2.err")"
  grep -q "resuming from $d/checkpoints/ckpt-000000010 " "$tmp/b2.out" || fail "the rollback did not resume from ckpt-10"
  ab=$d/checkpoints/abandoned-$ida-from-10
  grep -q "is not the newest checkpoint of $d/checkpoints: this run is a new branch .*moved aside into $ab/" "$tmp/b2.out" ||
    fail "the rollback did not say it is a new branch and where the abandoned one went: $(grep -i branch "$tmp/b2.out")"
  idb=$(meta "$d/checkpoints/ckpt-000000025" run_id)
  [ -n "$idb" ] && [ "$idb" != "$ida" ] || fail "the new branch's id '$idb' is the abandoned one's ($ida)"
  [ "$(meta "$d/checkpoints/ckpt-000000020" run_id)" = "$idb" ] || fail "ckpt-20 is not the new branch's"
  [ "$(meta "$d/checkpoints/ckpt-000000010" run_id)" = "$ida" ] || fail "ckpt-10 (the branch point) was changed or pruned"
  # the abandoned branch: moved, never deleted, with its metrics lines
  for s in 20 30; do
    c=$(printf '%s/ckpt-%09d' "$ab" $s)
    has_files "$c" || fail "the abandoned $c is not on disk with its files: $(ls -R "$d/checkpoints")"
    [ "$(meta "$c" run_id)" = "$ida" ] || fail "the abandoned $c changed"
  done
  [ "$(step_lines "$ab/metrics.jsonl")" = "$(seq -s ' ' 11 30)" ] || fail "the abandoned metrics lines: $(step_lines "$ab/metrics.jsonl")"
  # every line after the first one past step 10 went with it: the abandoned run's "end" line too
  [ "$(grep -c '"kind": "end"' "$ab/metrics.jsonl")" -eq 1 ] && grep -q '"kind": "end", "steps": 30,' "$ab/metrics.jsonl" ||
    fail "the abandoned run's end line is not in $ab/metrics.jsonl"
  [ "$(grep -c '"kind": "end"' "$d/metrics.jsonl")" -eq 1 ] && grep -q '"kind": "end", "steps": 25,' "$d/metrics.jsonl" ||
    fail "metrics.jsonl holds another end line than the new branch's: $(grep '"kind": "end"' "$d/metrics.jsonl")"
  "$bin" eval "$ab/ckpt-000000030" --nproc 1 >"$tmp/be.out" 2>"$tmp/be.err" || fail "the abandoned ckpt-30 does not evaluate"
  # the plain rerun continues the user's branch; resume: auto never looks into abandoned-*/
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.max_steps=25 "log.dir=$d" >"$tmp/b3.out" 2>"$tmp/b3.err" || fail "plain rerun"
  grep -q "resuming from $d/checkpoints/ckpt-000000025 " "$tmp/b3.out" || fail "the plain rerun did not resume the new branch: $(grep resuming "$tmp/b3.out")"
  [ "$(step_lines "$d/metrics.jsonl")" = "$(seq -s ' ' 1 25)" ] || fail "metrics.jsonl: steps $(step_lines "$d/metrics.jsonl")"
  # the branch trains on; pruning keeps its newest 3 and never touches ckpt-10 (another run's)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.max_steps=50 "log.dir=$d" >"$tmp/b4.out" 2>"$tmp/b4.err" || fail "on to step 50"
  [ "$(cd "$d/checkpoints" && echo ckpt-*)" = "ckpt-000000010 ckpt-000000030 ckpt-000000040 ckpt-000000050" ] ||
    fail "after step 50: $(cd "$d/checkpoints" && echo ckpt-*)"
  [ "$(meta "$d/checkpoints/ckpt-000000050" run_id)" = "$idb" ] || fail "the plain reruns changed the branch's id"
  [ "$(step_lines "$d/metrics.jsonl")" = "$(seq -s ' ' 1 50)" ] || fail "metrics.jsonl after step 50: $(step_lines "$d/metrics.jsonl")"
  echo "ok: a rollback is a new branch; the abandoned one is moved aside whole; the plain rerun resumes the user's branch"
  # a newer checkpoint that would be refused is not a branch (a --max-restarts restart resumes
  # the job's newest valid checkpoint by path): the run keeps its id and moves nothing
  d2=$tmp/b2
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.max_steps=30 "log.dir=$d2" >"$tmp/c1.out" 2>"$tmp/c1.err" || fail "30 steps (corrupt case)"
  id2=$(meta "$d2/checkpoints/ckpt-000000030" run_id)
  : >"$d2/checkpoints/ckpt-000000030/model.safetensors"
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.max_steps=30 "checkpoint.resume=$d2/checkpoints/ckpt-000000020" "log.dir=$d2" \
    >"$tmp/c2.out" 2>"$tmp/c2.err" || fail "resume past a corrupt newest checkpoint: $(tail -3 "$tmp/c2.err")"
  ! grep -q "new branch" "$tmp/c2.out" || fail "a corrupt newer checkpoint made a new branch: $(grep 'new branch' "$tmp/c2.out")"
  [ -z "$(ls -d "$d2"/checkpoints/abandoned-* 2>/dev/null)" ] || fail "a corrupt newer checkpoint was moved aside as a branch"
  [ "$(meta "$d2/checkpoints/ckpt-000000030" run_id)" = "$id2" ] || fail "the run past a corrupt newer checkpoint changed its id"
  echo "ok: a corrupt newer checkpoint is not a branch: the run keeps its id and moves nothing"
  # resume=PATH into another run's folder: a new branch in this (empty) folder, the other untouched
  before=$(cd "$d" && find . -type f | sort | xargs md5sum)
  "$bin" train "$tmp/c.yaml" "${net[@]}" "${ck[@]}" train.max_steps=60 "checkpoint.resume=$d/checkpoints/ckpt-000000050" "log.dir=$tmp/o" \
    >"$tmp/o.out" 2>"$tmp/o.err" || fail "resume from another folder: $(tail -3 "$tmp/o.err")"
  grep -q "resuming from $d/checkpoints/ckpt-000000050 " "$tmp/o.out" || fail "did not resume from the other folder"
  idc=$(meta "$tmp/o/checkpoints/ckpt-000000060" run_id)
  [ -n "$idc" ] && [ "$idc" != "$idb" ] || fail "a resume from another folder kept that run's id ($idb)"
  [ "$(cd "$d" && find . -type f | sort | xargs md5sum)" = "$before" ] || fail "the resume from another folder changed it"
  echo "ok: checkpoint.resume=PATH into another run's folder is a new branch here and leaves that folder as it was"
  ;;
stop_hint)
  # the stop hint is the command that resumes (issue 38, item 3), also where the same command
  # would not: checkpoint.resume: none with overwrite (it would move the stop checkpoint aside
  # and start over) and an explicit checkpoint.resume=PATH (it would go back to PATH); no
  # rerun loses metrics lines (plain: the stop case)
  hint_case() { # name dir args...: SIGTERM before step 20, then the hint's command
    local name=$1 d=$2 rc=0; shift 2
    RINGTRAIN_TEST_SIGNAL_AT=step:20:launcher:0:TERM "$bin" train "$tmp/c.yaml" "$@" "log.dir=$d" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
    [ "$rc" -eq 143 ] || fail "$name: exit $rc, expected 143"
    local ck20 over
    ck20=$(printf '%s/checkpoints/ckpt-%09d' "$d" 20)
    grep -q "^stopped by SIGTERM after step 20; checkpoint in $d/checkpoints/; to resume, run the same command with checkpoint.resume=$ck20 at its end" "$tmp/$name.out" ||
      fail "$name: the hint does not name the override that resumes: $(grep stopped "$tmp/$name.out")"
    over=$(sed -n 's/.*to resume, run the same command with \(checkpoint.resume=[^ ]*\) at its end.*/\1/p' "$tmp/$name.out")
    "$bin" train "$tmp/c.yaml" "$@" "log.dir=$d" "$over" >"$tmp/$name-2.out" 2>"$tmp/$name-2.err" || fail "$name: the hint's command: $(tail -3 "$tmp/$name-2.err")"
    grep -q "^ringtrain: resuming from $ck20 " "$tmp/$name-2.out" || fail "$name: the hint's command did not resume from $ck20: $(grep resuming "$tmp/$name-2.out")"
    ! grep -q "new branch" "$tmp/$name-2.out" || fail "$name: resuming the stop checkpoint started a branch"
    [ "$(meta "$ck20" run_id)" = "$(meta "$(printf '%s/checkpoints/ckpt-%09d' "$d" 40)" run_id)" ] || fail "$name: the resume changed the run id"
    [ "$(step_lines "$d/metrics.jsonl")" = "$(seq -s ' ' 1 40)" ] || fail "$name: metrics.jsonl steps: $(step_lines "$d/metrics.jsonl")"
  }
  # overwrite: an earlier run's 10 steps (its checkpoint and metrics moved aside together)
  d=$tmp/ow
  "$bin" train "$tmp/c.yaml" "${net[@]}" train.max_steps=10 "log.dir=$d" >"$tmp/ow0.out" 2>"$tmp/ow0.err" || fail "the earlier run"
  id0=$(meta "$d/checkpoints/ckpt-000000010" run_id)
  hint_case ow "$d" "${net[@]}" train.max_steps=40 checkpoint.resume=none checkpoint.overwrite=true
  has_files "$d/checkpoints/old-$id0/ckpt-000000010" || fail "overwrite: the earlier run's checkpoint was not moved aside"
  [ "$(step_lines "$d/checkpoints/old-$id0/metrics.jsonl")" = "$(seq -s ' ' 1 10)" ] || fail "overwrite: the earlier run's metrics were not moved with its checkpoints"
  echo "ok: with checkpoint.resume: none and overwrite, the stop hint resumes; the earlier run's metrics moved with its checkpoints"
  # explicit PATH: a rollback to ckpt-10 of a 30-step run, stopped at step 20
  d=$tmp/p
  "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=10 train.max_steps=30 "log.dir=$d" >"$tmp/p0.out" 2>"$tmp/p0.err" || fail "30 steps"
  id0=$(meta "$d/checkpoints/ckpt-000000030" run_id)
  hint_case p "$d" "${net[@]}" checkpoint.every_steps=10 train.max_steps=40 "checkpoint.resume=$d/checkpoints/ckpt-000000010"
  [ "$(step_lines "$d/checkpoints/abandoned-$id0-from-10/metrics.jsonl")" = "$(seq -s ' ' 11 30)" ] || fail "resume=PATH: the abandoned metrics lines"
  echo "ok: with checkpoint.resume=PATH, the stop hint resumes from the stop; no metrics line lost"
  ;;
metrics_full)
  # a metrics file cut back on resume is replaced only by a complete copy (issue 38, item 4):
  # its temporary is /dev/full here (a full disk): the resume fails naming the file and the
  # error, and metrics.jsonl keeps every line (it was renamed over by a short copy before)
  d=$tmp/m
  "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=10 train.max_steps=20 "log.dir=$d" >"$tmp/m0.out" 2>"$tmp/m0.err" || fail "20 steps"
  before=$(md5sum <"$d/metrics.jsonl")
  ln -s /dev/full "$d/metrics.jsonl.tmp"
  rc=0
  "$bin" train "$tmp/c.yaml" "${net[@]}" checkpoint.every_steps=10 train.max_steps=30 "log.dir=$d" >"$tmp/m1.out" 2>"$tmp/m1.err" || rc=$?
  [ "$rc" -ne 0 ] || fail "a resume whose metrics copy cannot be written succeeded"
  grep -q "metrics.jsonl.tmp: No space left on device" "$tmp/m1.err" || fail "the error does not name the metrics copy and ENOSPC: $(grep -m1 ' E ' "$tmp/m1.err")"
  # rank 1 does not wait in a collective until dist.timeout_s: it fails at once, naming rank 0
  grep -q "rank 0 could not open the run's metrics.jsonl" "$tmp/m1.err" || fail "rank 1 did not name rank 0's failure: $(grep -m2 'error' "$tmp/m1.err")"
  [ -f "$d/metrics.jsonl" ] && [ ! -L "$d/metrics.jsonl" ] || fail "metrics.jsonl is no longer a regular file: $(ls -l "$d/metrics.jsonl")"
  [ "$(md5sum <"$d/metrics.jsonl")" = "$before" ] || fail "metrics.jsonl changed after the failed copy"
  echo "ok: a metrics copy that cannot be written fails the resume and leaves metrics.jsonl whole"
  ;;
*) echo "usage: $0 RINGTRAIN evalonce|partition|exact|stop|stop_eval|stop_ckpt|steps|world|corrupt|eval|torchvision|schedule|runid|ranks|restart|restart_term|restart_repeat|ckpt_slow|branch|stop_hint|metrics_full" >&2; exit 2 ;;
esac
