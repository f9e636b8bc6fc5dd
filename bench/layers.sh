#!/usr/bin/env bash
# Where a CPU training step's time goes, layer by layer, against the CPU's peak
# (issue 22, item 5). For each precision (fp32, bf16) and batch (64, 128), ResNet34 at
# 1x28x28 (imagenet stem), 2 threads:
#   1. `ringtrain bench peak`: the CPU's measured fp32 and bf16 peak (GFLOP/s);
#   2. `ringtrain bench model --json`: the step time without tracing, its GFLOP/s and share
#      of the peak (FLOPs per image from the layer shapes, rt_model_flops_per_image);
#   3. `ringtrain bench model --json --layers`: ringtrain's per-layer profile, the wall time
#      of every layer call (model/profile.h) by shape and pass, our own loops included
#      (batch norm, pooling, the dense path of the tiny layers), with GFLOP/s and share
#      of the peak per convolution and linear row;
#   4. the same run with ONEDNN_VERBOSE=1: oneDNN times each primitive it executes (every
#      convolution pass and every layout reorder, with its shape): how a oneDNN layer's
#      time splits between its kernels and its reorders (the verbose logging itself adds
#      to the step: these times read high). The rest of the step is the step time less
#      the oneDNN time.
# bench/layers_table.py prints the table (grouped by pass and shape, GFLOP/s and share of
# the peak per row) and writes bench/results/layers-cpu-<YYYYMMDD>.json.
#
#   bench/layers.sh     (BUILD=build by default; THREADS=2, STEPS=5, BATCHES="64 128",
#                        PRECISIONS="fp32 bf16")
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
threads=${THREADS:-2}
steps=${STEPS:-5}
batches=${BATCHES:-64 128}
precisions=${PRECISIONS:-fp32 bf16}
[ -x "$bin" ] || { echo "layers.sh: $bin not found (make build, or set BUILD / RINGTRAIN)" >&2; exit 1; }
mkdir -p bench/results
out=${OUT:-bench/results/layers-cpu-$(date -u +%Y%m%d).json}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$bin" bench peak --json --threads "$threads" >"$tmp/peak.json"
common=(--arch resnet34 --stem imagenet --channels 1 --size 28 --threads "$threads" --warmup 1)
for p in $precisions; do
  for b in $batches; do
    "$bin" bench model --json "${common[@]}" --steps "$steps" --batch "$b" --precision "$p" >"$tmp/model-$p-$b.json"
    "$bin" bench model --json --layers "${common[@]}" --steps "$steps" --batch "$b" --precision "$p" \
      >"$tmp/layers-$p-$b.json"
    # one timed step traced: the warmup step's lines come first and are skipped by count
    ONEDNN_VERBOSE=1 DNNL_VERBOSE=1 "$bin" bench model --json "${common[@]}" --steps "$steps" --batch "$b" \
      --precision "$p" >"$tmp/verbose-$p-$b.txt" 2>&1
  done
done
"$bin" info --json >"$tmp/info.json"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
/usr/bin/python3 bench/layers_table.py --dir "$tmp" --out "$out" --commit "$commit" --threads "$threads" \
  --steps "$steps" --batches "$batches" --precisions "$precisions"
