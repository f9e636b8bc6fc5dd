#!/usr/bin/env bash
# The bf16/fp32 ceiling the CPU's kernels allow (issue 22, item 3): how fast the bf16 and
# fp32 convolution and matmul kernels of oneDNN (Debian's libdnnl 2.6) and libxsmm
# (Debian's libxsmm-dev 1.17, the other Debian library with AVX-512 BF16 convolutions;
# skipped where it is not installed) run alone, one thread, at the shapes of ResNet34
# 1x28x28 at each batch split in THREADS parts (bench/kernels/*.c: no reorders, no
# conversions, nothing of ringtrain's), next to ringtrain's own fp32 and bf16 steps with
# their per-layer profile (`bench model --json --layers`), all REPEAT times interleaved.
#
# bench/kernels_table.py prints the kernels' times and bf16/fp32 ratios, then projects a
# bf16 step from the measured fp32 step: every convolution row divided by the best kernel
# ratio of its shape and pass (the dense layers' by their matmul's; rows of shapes not
# probed by 2, the nominal ratio), everything else (batch norm, pooling, the optimizer)
# unchanged: the step a bf16 implementation with free conversions and layouts would reach
# with these kernels. Writes bench/results/kernels-cpu-<YYYYMMDD>.json.
#
#   bench/kernels.sh    (BUILD=build by default; THREADS=2, STEPS=10, BATCHES="64 128", REPEAT=3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
threads=${THREADS:-2}
steps=${STEPS:-10}
batches=${BATCHES:-64 128}
repeat=${REPEAT:-3}
[ -x "$bin" ] || { echo "kernels.sh: $bin not found (make build, or set BUILD / RINGTRAIN)" >&2; exit 1; }
mkdir -p bench/results
out=${OUT:-bench/results/kernels-cpu-$(date -u +%Y%m%d).json}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cc=${CC:-cc}
"$cc" -O2 -o "$tmp/onednn" bench/kernels/onednn.c -ldnnl -fopenmp
probes=("$tmp/onednn")
if [ -f /usr/include/libxsmm_dnn.h ]; then
  "$cc" -O2 -o "$tmp/libxsmm" bench/kernels/libxsmm.c -lxsmm -lopenblas -lpthread -lrt -ldl -lm
  probes+=("$tmp/libxsmm")
else
  echo "kernels.sh: no libxsmm (scripts/install-deps bench installs libxsmm-dev): its rows are skipped" >&2
fi
common=(--arch resnet34 --stem imagenet --channels 1 --size 28 --threads "$threads" --steps "$steps")
: >"$tmp/kernels.jsonl"
: >"$tmp/steps.jsonl"
for rep in $(seq "$repeat"); do
  for b in $batches; do
    for p in "${probes[@]}"; do OMP_NUM_THREADS=1 "$p" 3 "$b" "$threads" >>"$tmp/kernels.jsonl"; done
    for prec in fp32 bf16; do
      "$bin" bench model --json --layers "${common[@]}" --batch "$b" --precision "$prec" 2>/dev/null \
        >>"$tmp/steps.jsonl"
    done
  done
  echo "kernels.sh: round $rep of $repeat done" >&2
done
"$bin" info --json >"$tmp/info.json"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
/usr/bin/python3 bench/kernels_table.py --kernels "$tmp/kernels.jsonl" --steps "$tmp/steps.jsonl" \
  --info "$tmp/info.json" --commit "$commit" --out "$out"
