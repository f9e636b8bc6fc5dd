#!/usr/bin/env bash
# The training step in CUDA graphs on emulated GPUs (train.cuda_graphs; issue 40, item 4):
# `ringtrain train` with graphs equals the run without them bit for bit, and the ledger of
# the emulated runtime (RINGTRAIN_EMU_STATS) shows what a graphed step costs.
#
#   tests/emu/graphs.sh RINGTRAIN CASE
# CASE:
#   one     1 GPU, tf32 and bf16: graphs on = off, bit for bit (losses, learning rates,
#           gradient norms, the checkpoint's files) over 2 epochs of 8 full batches and a
#           partial one (uncaptured), an evaluation with another batch size between them,
#           with what changes from step to step: one-cycle learning rate and momentum,
#           gradient clipping that clips, the moving average, label smoothing
#   nccl    2 GPUs over NCCL (fp32 and dist.compress bf16): graphs on = off, bit for bit;
#           a SIGUSR1 flight recorder dump after a replayed step lists the same operations
#   resume  graphs on: stopped at step 7 and resumed = the uninterrupted run
#   stop    SIGTERM before step 6 (a replayed step): the run stops after step 6, as without
#           graphs, with the same checkpoint
#   ledger  per step in steady state (runs of 8 and 16 steps): exactly 2 graph launches, no
#           more host synchronisations than without graphs, fewer kernel launches
#   errors  train.cuda_graphs: on where the step cannot be captured (dropout; the CPU; a
#           refused capture) is an error saying why; auto runs them uncaptured
#   kill    kill -9 of rank 1 before a replayed step: the launcher names it, nothing hangs
#   minutes checkpoint.every_minutes (its flag read by the graph): the same checkpoints
#   nonfinite  a NaN at a replayed step after an evaluation: rank named, step skipped
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
export RINGTRAIN_TEST_HOOKS=1 # RINGTRAIN_TEST_SIGNAL_AT (docs/testing.md)
bin=$1
what=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing (scripts/install-deps test installs it)"; exit 77; }
tmp=$(mktemp -d /tmp/rt-emu-graphs-XXXXXX)
trap 'pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done; exit 1; }
printf 'model:\n  arch: resnet18\n' > "$tmp/c.yaml"
export RINGTRAIN_EMU_GPUS=${RINGTRAIN_EMU_GPUS:-2}
# 272 images in batches of 32: 8 full batches and one of 16 per epoch (1 rank)
base=(model.width=4 model.stem=cifar data.train_subset=272 data.test_subset=96 data.batch_size=32
      data.eval_batch_size=48 train.threads=1 train.epochs=2 log.progress=off log.every_steps=1
      optim.momentum=0.9 optim.schedule=onecycle optim.clip_grad_norm=0.5 train.ema_decay=0.9 train.ema_every=2
      train.label_smoothing=0.1 train.device=cuda dist.nproc=1 dist.timeout_s=120)

# train NAME ARGS...: a run into $tmp/NAME, its emulator counters in $tmp/NAME.stats
train() {
  local name=$1; shift
  RINGTRAIN_EMU_STATS="$tmp/$name.stats" "$bin" train "$tmp/c.yaml" "${base[@]}" "$@" "log.dir=$tmp/$name" \
    >"$tmp/$name.out" 2>"$tmp/$name.err" || fail "$name: ringtrain train exited $?"
}

# graph_launches NAME: the run's graph launches (all its rank processes)
graph_launches() { /usr/bin/python3 -c 'import json,sys; print(sum(json.loads(l)["graph_launches"] for l in open(sys.argv[1])))' "$tmp/$1.stats"; }

# same A B LABEL: metrics.jsonl's steps (loss, lr, gradient norm, skipped) and the newest
# checkpoint's files bit for bit
same() {
  /usr/bin/python3 - "$tmp/$1" "$tmp/$2" <<'PY' || fail "$3"
import glob, json, os, struct, sys
def steps(d):
    return [(r["step"], r["loss"], r["lr"], r["grad_norm"], r.get("skipped")) for r in map(json.loads, open(d + "/metrics.jsonl"))
            if r.get("kind") == "step"]
a, b = sys.argv[1], sys.argv[2]
sa, sb = steps(a), steps(b)
assert sa and [s[0] for s in sa] == [s[0] for s in sb], "steps differ: %s vs %s" % ([s[0] for s in sa], [s[0] for s in sb])
bad = [(x, y) for x, y in zip(sa, sb) if x != y]
assert not bad, "%d of %d steps differ, first: %s vs %s" % (len(bad), len(sa), bad[0][0], bad[0][1])
ca, cb = sorted(glob.glob(a + "/checkpoints/ckpt-*"))[-1], sorted(glob.glob(b + "/checkpoints/ckpt-*"))[-1]
assert os.path.basename(ca) == os.path.basename(cb), (ca, cb)
files = sorted(f for f in os.listdir(ca) if f.endswith(".safetensors"))
assert files, "no tensors in " + ca
def tensors(p):  # name -> bytes (the metadata holds the run's id and config: not compared)
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n])
    return {k: raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
for f in files:
    ta, tb = tensors(ca + "/" + f), tensors(cb + "/" + f)
    assert ta.keys() == tb.keys(), (f, sorted(ta.keys() ^ tb.keys()))
    bad = [k for k in ta if ta[k] != tb[k]]
    assert not bad, "%s of %s: %d tensors differ: %s" % (f, os.path.basename(ca), len(bad), bad[:4])
print("same: %d steps, the tensors of %s in %s" % (len(sa), ", ".join(files), os.path.basename(ca)))
PY
}

case $what in
one)
  for p in tf32 bf16; do
    train "$p-on" train.precision=$p train.cuda_graphs=on
    train "$p-off" train.precision=$p train.cuda_graphs=off
    grep -q "train.cuda_graphs: from step 3 the training step runs as CUDA graphs" "$tmp/$p-on.err" ||
      fail "$p: graphs on did not capture from step 3"
    n=$(graph_launches "$p-on")
    # 18 steps: 2 uncaptured, 2 partial batches uncaptured, 14 of 2 launches each
    [ "$n" -eq 28 ] || fail "$p: $n graph launches, expected 28 (14 graphed steps of 2)"
    [ "$(graph_launches "$p-off")" -eq 0 ] || fail "$p: graph launches with train.cuda_graphs off"
    same "$p-on" "$p-off" "$p: 1 GPU with graphs differs from the run without"
  done
  echo "ok: 1 GPU, tf32 and bf16: graphs on = off, bit for bit"
  ;;
nccl)
  for c in none bf16; do
    train "$c-on" dist.nproc=2 dist.compress=$c train.cuda_graphs=on
    train "$c-off" dist.nproc=2 dist.compress=$c train.cuda_graphs=off
    [ "$(graph_launches "$c-on")" -gt 0 ] || fail "compress $c: no graph launches"
    same "$c-on" "$c-off" "2 GPUs over NCCL (compress $c): graphs on differ from off"
  done
  # the flight recorder during replays (SIGUSR1 before replayed step 6, small buckets):
  # the same entries as without graphs, every one done, on both ranks
  for m in on off; do
    RINGTRAIN_TEST_SIGNAL_AT=step:6:launcher:0:USR1 train "fl-$m" dist.nproc=2 train.cuda_graphs=$m train.max_steps=7 \
      dist.bucket_mb=0.05 dist.first_bucket_mb=0.05
  done
  /usr/bin/python3 - "$tmp" <<'PY' || fail "the flight recorder during replays differs from the uncaptured run's"
import json, sys
t = sys.argv[1]
for r in (0, 1):
    on, off = ([(e["id"], e["op"], e.get("dtype"), e.get("count"), e["state"], e.get("tag", ""))
                for e in json.load(open("%s/fl-%s/flight-rank%d.json" % (t, m, r)))["entries"]] for m in ("on", "off"))
    assert on == off, "rank %d: %s vs %s" % (r, on[-3:], off[-3:])
    assert all(e[4] == "done" for e in on), [e for e in on if e[4] != "done"][:3]
    buckets = [e for e in on if e[5].endswith(", step 6") and e[5].startswith("bucket")]
    assert len(buckets) > 1, buckets
    print("rank %d: %d flight entries, the same with graphs; step 6 (replayed): %d buckets" % (r, len(on), len(buckets)))
PY
  echo "ok: 2 GPUs over NCCL: graphs on = off, bit for bit; the flight recorder as without graphs"
  ;;
resume)
  train full train.cuda_graphs=on
  train part train.cuda_graphs=on train.max_steps=7
  train part train.cuda_graphs=on
  grep -q "resuming from" "$tmp/part.out" || fail "the second run did not resume"
  same part full "graphs on: a resumed run differs from the uninterrupted one"
  echo "ok: graphs on: stopped at step 7 and resumed = the uninterrupted run"
  ;;
stop)
  for m in on off; do
    rc=0
    RINGTRAIN_TEST_SIGNAL_AT=step:6:self:0:TERM RINGTRAIN_EMU_STATS="$tmp/stop-$m.stats" "$bin" train "$tmp/c.yaml" \
      "${base[@]}" train.cuda_graphs=$m "log.dir=$tmp/stop-$m" >"$tmp/stop-$m.out" 2>"$tmp/stop-$m.err" || rc=$?
    [ "$rc" -eq 143 ] || fail "graphs $m: SIGTERM before step 6: exit $rc, expected 143 (a clean stop)"
    [ -d "$tmp/stop-$m/checkpoints/ckpt-000000006" ] || fail "graphs $m: no checkpoint of step 6 after SIGTERM before step 6"
    last=$(grep '"kind": *"step"' "$tmp/stop-$m/metrics.jsonl" | tail -1 | grep -o '"step": *[0-9]*' | grep -o '[0-9]*$')
    [ "$last" = 6 ] || fail "graphs $m: the last step logged is $last, expected 6"
  done
  n=$(graph_launches stop-on) # steps 3-6, 2 launches each: step 6's update runs, its stop comes after it
  [ "$n" -eq 8 ] || fail "graphs on: steps 3-6 were not replayed ($n launches, expected 8)"
  same stop-on stop-off "a stop during a replayed step: graphs on differ from off"
  echo "ok: SIGTERM before replayed step 6 stops after step 6, as without graphs"
  ;;
ledger)
  for m in on off; do
    for n in 8 16; do
      train "l$m$n" train.cuda_graphs=$m data.train_subset=1024 train.epochs=1 train.max_steps=$n train.eval_every=0 \
        checkpoint.every_epochs=0
    done
  done
  /usr/bin/python3 - "$tmp" <<'PY' || fail "the ledger of a graphed step"
import json, sys
t = sys.argv[1]
def get(name):
    rows = [json.loads(l) for l in open("%s/%s.stats" % (t, name))]
    rows = [r for r in rows if r["launches"] > 0]
    assert len(rows) == 1, rows
    return rows[0]
per = {}
for m in ("on", "off"):
    a, b = get("l%s8" % m), get("l%s16" % m)
    per[m] = {k: (b[k] - a[k]) / 8.0 for k in ("graph_launches", "host_syncs", "launches")}
print("per step in steady state: graphs on %s, off %s" % (per["on"], per["off"]))
assert per["on"]["graph_launches"] == 2, per["on"]
assert per["off"]["graph_launches"] == 0, per["off"]
assert per["on"]["host_syncs"] <= per["off"]["host_syncs"], per
assert per["on"]["launches"] < per["off"]["launches"], per
PY
  ;;
errors)
  rc=0
  "$bin" train "$tmp/c.yaml" "${base[@]}" model.arch=net train.label_smoothing=0 train.cuda_graphs=on "log.dir=$tmp/e1" >"$tmp/e1.out" 2>"$tmp/e1.err" || rc=$?
  [ "$rc" -ne 0 ] || fail "train.cuda_graphs on with dropout did not fail"
  grep -q "train.cuda_graphs: on, but the step cannot be captured: the model has dropout" "$tmp/e1.err" ||
    fail "the error does not say why (dropout)"
  rc=0
  "$bin" train "$tmp/c.yaml" "${base[@]}" train.device=cpu train.cuda_graphs=on "log.dir=$tmp/e2" >"$tmp/e2.out" 2>"$tmp/e2.err" || rc=$?
  [ "$rc" -ne 0 ] && grep -q "train.cuda_graphs: on, but the step cannot be captured: the run is on the CPU" "$tmp/e2.err" ||
    fail "train.cuda_graphs on, on the CPU: no error saying why"
  train auto model.arch=net train.label_smoothing=0 train.max_steps=4
  [ "$(graph_launches auto)" -eq 0 ] || fail "auto captured a step with dropout"
  # a capture that fails (the emulator refuses the first cudaStreamBeginCapture): on is an
  # error naming it; auto warns and goes on uncaptured, with the same bits as off
  rc=0
  RINGTRAIN_EMU_FAIL_CALL=cudaStreamBeginCapture:1 "$bin" train "$tmp/c.yaml" "${base[@]}" train.max_steps=6 \
    train.cuda_graphs=on "log.dir=$tmp/e3" >"$tmp/e3.out" 2>"$tmp/e3.err" || rc=$?
  [ "$rc" -ne 0 ] && grep -q "capturing the training step in a CUDA graph (train.cuda_graphs)" "$tmp/e3.err" ||
    fail "a failed capture with train.cuda_graphs on: exit $rc, no error naming the capture"
  RINGTRAIN_EMU_FAIL_CALL=cudaStreamBeginCapture:1 train fb train.max_steps=6
  grep -q "train.cuda_graphs auto: the forward graph could not be captured, the steps run uncaptured" "$tmp/fb.err" ||
    fail "a failed capture with auto: no warning"
  [ "$(graph_launches fb)" -eq 0 ] || fail "graphs launched after the capture failed"
  train fb-off train.max_steps=6 train.cuda_graphs=off
  same fb fb-off "auto after a failed capture differs from off"
  # the step's scalars in pageable memory (the first pinned allocation, vals_host, refused
  # by the emulator): on is an error saying so, auto runs uncaptured
  rc=0
  RINGTRAIN_EMU_FAIL_CALL=cudaHostAlloc:1 "$bin" train "$tmp/c.yaml" "${base[@]}" train.max_steps=4 \
    train.cuda_graphs=on "log.dir=$tmp/e4" >"$tmp/e4.out" 2>"$tmp/e4.err" || rc=$?
  [ "$rc" -ne 0 ] && grep -q "cannot be captured: the step's scalars are in pageable host memory" "$tmp/e4.err" ||
    fail "pageable step scalars with train.cuda_graphs on: exit $rc, no error saying why"
  RINGTRAIN_EMU_FAIL_CALL=cudaHostAlloc:1 train pg train.max_steps=4
  [ "$(graph_launches pg)" -eq 0 ] || fail "graphs launched with the step's scalars in pageable memory"
  echo "ok: train.cuda_graphs on where it cannot capture is an error saying why; auto runs uncaptured"
  ;;
kill)
  # rank 1 SIGKILLs itself before replayed step 6 while rank 0 replays: the watchdog fed by
  # the replay (rt_pg_graph_launched) ends rank 0's wait, and the launcher names rank 1
  rc=0
  RINGTRAIN_TEST_SIGNAL_AT=step:6:self:1:KILL "$bin" train "$tmp/c.yaml" "${base[@]}" dist.nproc=2 train.epochs=50 \
    train.cuda_graphs=on dist.timeout_s=30 "log.dir=$tmp/kill" >"$tmp/kill.out" 2>"$tmp/kill.err" || rc=$?
  [ "$rc" -ne 0 ] || fail "launcher exited 0 after a rank was killed"
  grep -q "train.cuda_graphs: from step 3" "$tmp/kill.err" || fail "the run did not replay graphs"
  grep -q "rank 1 was killed by SIGKILL" "$tmp/kill.err" || fail "the launcher does not name rank 1 and SIGKILL"
  for _ in $(seq 300); do pgrep -f "$tmp" >/dev/null || break; sleep 0.1; done
  ! pgrep -af "$tmp" || fail "processes left running (30 s after the run ended)"
  echo "ok: a rank killed during replays stops the job, named"
  ;;
minutes)
  # checkpoint.every_minutes on 2 GPUs, rank 0's clock at 1 minute per step
  # (RINGTRAIN_TEST_CLOCK): the flag travels with the step's scalars, read by the forward
  # graph from pinned memory at each launch: the same checkpoints as without graphs
  for m in on off; do
    RINGTRAIN_TEST_CLOCK=0:1 train "min-$m" dist.nproc=2 train.cuda_graphs=$m checkpoint.every_minutes=3 \
      checkpoint.every_epochs=0 checkpoint.keep_last=0
  done
  a=$(cd "$tmp/min-on/checkpoints" && ls -d ckpt-* | tr '\n' ' ') b=$(cd "$tmp/min-off/checkpoints" && ls -d ckpt-* | tr '\n' ' ')
  [ "$a" = "$b" ] || fail "every_minutes: checkpoints with graphs ($a) differ from without ($b)"
  [ "$(echo "$a" | wc -w)" -ge 4 ] || fail "every_minutes: only $a"
  [ "$(graph_launches min-on)" -gt 0 ] || fail "every_minutes: no graph launches"
  same min-on min-off "every_minutes: graphs on differ from off"
  echo "ok: checkpoint.every_minutes with graphs: the same checkpoints ($a)"
  ;;
nonfinite)
  # a NaN in rank 1's batch at replayed step 12 (epoch 2, after an evaluation with flip TTA,
  # which leaves the model's host record of its last forward as an evaluation's): every
  # rank names rank 1, the step is skipped, and the run equals the one without graphs
  for m in on off; do
    RINGTRAIN_TEST_NAN_AT=1:12 train "nf-$m" dist.nproc=2 train.cuda_graphs=$m train.skip_nonfinite=true eval.tta=flip
    grep -q "step 12: non-finite gradient on rank 1 " "$tmp/nf-$m.err" || fail "graphs $m: the skipped step does not name rank 1"
  done
  [ "$(graph_launches nf-on)" -gt 0 ] || fail "no graph launches"
  same nf-on nf-off "a skipped non-finite replayed step: graphs on differ from off"
  echo "ok: a non-finite replayed step after an evaluation names rank 1 and is skipped, as without graphs"
  ;;
*) echo "usage: $0 RINGTRAIN one|nccl|resume|stop|ledger|errors|kill|minutes|nonfinite" >&2; exit 2 ;;
esac
