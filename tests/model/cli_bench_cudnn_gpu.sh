#!/bin/sh
# `ringtrain bench model --cudnn MODE` (docs/model.md; issue 40, item 3): on a GPU (or the
# emulated ones) each mode's JSON row says the mode and lists the convolution algorithms
# chosen; heuristic and timed-deterministic (train's default and train.cudnn_benchmark)
# choose only algorithms cuDNN calls deterministic (backward data not ALGO_0, backward
# filter neither ALGO_0 nor ALGO_3, the ones that add with atomics). On the emulated GPUs,
# where RINGTRAIN_EMU_CUDNN_FAST makes Find measure forward IMPLICIT_GEMM (0) and the
# non-deterministic backward-filter ALGO_0 fastest (docs/cuda-emulation.md), the timed
# modes must be the ones that took the measurement: timed-deterministic forward 0 with
# backward filter 1, timed 0 and 0, heuristic neither (the heuristics measure nothing).
# A bad mode is a usage error listing the modes (exit 2, wherever it runs). Exit 77
# (skipped) where no GPU answers, unless RINGTRAIN_REQUIRE_GPU=1.
# usage: cli_bench_cudnn_gpu.sh RINGTRAIN
set -u
bin=$1
out=$(mktemp) && err=$(mktemp) || exit 1
trap 'rm -f "$out" "$err"' EXIT
"$bin" bench model --cudnn fastest >"$out" 2>"$err"
rc=$?
[ $rc -eq 2 ] && grep -q -- "--cudnn: unknown cuDNN algorithm choice 'fastest' (expected heuristic | timed-deterministic | timed | heuristic-any)" "$err" ||
  { echo "--cudnn fastest: exit $rc"; cat "$err"; exit 1; }
emu=0
"$bin" info 2>/dev/null | grep -q "^  cuda:0 .*(emulated)" && emu=1
export RINGTRAIN_EMU_CUDNN_FAST=fwd:0,filter:0 RINGTRAIN_EMU_CUDNN_JITTER=0
for m in heuristic timed-deterministic timed; do
  "$bin" bench model --device cuda --json --arch resnet18 --width 4 --batch 2 --steps 1 --warmup 0 --cudnn "$m" \
    >"$out" 2>"$err"
  rc=$?
  if [ $rc -ne 0 ]; then
    if grep -q "no GPU" "$err" && [ "${RINGTRAIN_REQUIRE_GPU:-0}" != 1 ]; then
      echo "no GPU: skipped"; cat "$err"; exit 77
    fi
    echo "--device cuda --cudnn $m: exit $rc"; cat "$err"; exit 1
  fi
  /usr/bin/env python3 - "$out" "$m" "$emu" <<'PY' || exit 1
import json, sys
d = json.loads(open(sys.argv[1]).read())
m, emu = sys.argv[2], sys.argv[3] == "1"
assert d["cudnn"] == m, d["cudnn"]
got = sorted({(a["fwd"], a["bwd_data"], a["bwd_filter"]) for a in d["conv_algos"]})
assert got, "no convolution algorithms listed"
if m != "timed":
    bad = [g for g in got if g[1] == 0 or g[2] in (0, 3)]
    assert not bad, f"{m}: non-deterministic algorithms chosen (fwd, data, filter): {bad}"
if emu:
    want = {"heuristic": None, "timed-deterministic": [(0, 1, 1)], "timed": [(0, 0, 0)]}[m]
    if want is None:
        assert all(g[0] != 0 for g in got), f"heuristic took the measured fastest forward: {got}"
    else:
        assert got == want, f"{m}: chose {got}, expected {want} (the measured fastest allowed)"
print(f"--cudnn {m}: {got}")
PY
done
exit 0
