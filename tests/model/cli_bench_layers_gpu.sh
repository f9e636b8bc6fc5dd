#!/bin/sh
# `ringtrain bench model --device cuda --layers` (docs/model.md, docs/gpu.md): on a GPU
# (or the emulated ones) the per-layer table comes from a second run with a pair of CUDA
# events around every layer call (no synchronisation between layers). ResNet18 has 20 convolutions: each precision's JSON must count 20
# conv2d calls per step forward and 20 backward (every call timed, none twice), and give
# the profiled run's step time. Exit 77 (skipped) where no GPU answers, unless
# RINGTRAIN_REQUIRE_GPU=1.
# usage: cli_bench_layers_gpu.sh RINGTRAIN
set -u
bin=$1
out=$(mktemp) && err=$(mktemp) || exit 1
trap 'rm -f "$out" "$err"' EXIT
for p in fp32 bf16; do
  "$bin" bench model --device cuda --layers --json --arch resnet18 --width 4 --batch 2 --steps 2 --warmup 1 \
    --precision "$p" >"$out" 2>"$err"
  rc=$?
  if [ $rc -ne 0 ]; then
    if grep -q "no GPU" "$err" && [ "${RINGTRAIN_REQUIRE_GPU:-0}" != 1 ]; then
      echo "no GPU: skipped"; cat "$err"; exit 77
    fi
    echo "--device cuda --layers --precision $p: exit $rc"; cat "$err"; exit 1
  fi
  /usr/bin/env python3 - "$out" "$p" <<'PY' || exit 1
import json, sys
d = json.loads(open(sys.argv[1]).read())
p = sys.argv[2]
assert d["precision"] == p, d["precision"]
assert d["layers_step_ms"] > 0 and "pair of CUDA events" in d["layers_timing"], d
for pas in ("forward", "backward"):
    calls = sum(r["calls_per_step"] for r in d["layers"] if r["kind"] == "conv2d" and r["pass"] == pas)
    assert abs(calls - 20) < 1e-9, f"{p} {pas}: {calls} conv2d calls per step, expected 20"
    ms = [r["ms_per_step"] for r in d["layers"] if r["pass"] == pas]
    assert ms and all(m > 0 for m in ms), f"{p} {pas}: a row without time: {ms}"
total = sum(r["ms_per_step"] for r in d["layers"])
assert abs(total - d["layers_ms_per_step"]) < 1e-2 and total < d["layers_step_ms"], (total, d["layers_step_ms"])
print(f"{p}: 20 conv2d calls per step each way, layers {total:.3f} of {d['layers_step_ms']:.3f} ms per step")
PY
done
# the profiled run synchronises once per step, not around every layer: on the emulated
# GPUs (RINGTRAIN_EMU_STATS: the runtime's host synchronisations at exit), 2 and 4 steps
# differ by a few synchronisations a step (the search before the steps varies by about 2)
stats=$(mktemp) || exit 1
trap 'rm -f "$out" "$err" "$stats"' EXIT
for s in 2 4; do
  RINGTRAIN_EMU_STATS=$stats "$bin" bench model --device cuda --layers --json --arch resnet18 --width 4 --batch 2 \
    --steps $s --warmup 1 >"$out" 2>"$err" || { echo "--layers --steps $s failed"; cat "$err"; exit 1; }
done
if [ -s "$stats" ]; then
  /usr/bin/env python3 - "$stats" <<'PY' || exit 1
import json, sys
a, b = [json.loads(l)["host_syncs"] for l in open(sys.argv[1])]
per = (b - a) / 2.0
print(f"host synchronisations: {a} with 2 steps, {b} with 4: {per:.1f} per step (timed and profiled)")
assert per <= 4.0, f"{per} host synchronisations per step: the profile waits between layers"
PY
fi
exit 0
