#!/usr/bin/env bash
# bf16 against fp32 on the CPU (issue 22, item 3): the ResNet34 training step (1x28x28,
# imagenet stem, SGD momentum, --threads 2), batch 64 and 128, four ways in the same run:
# ringtrain fp32, ringtrain bf16 (train.precision bf16), PyTorch fp32 and PyTorch's CPU
# autocast bf16 (bench/model_torch.py --autocast). Every configuration runs REPEAT times,
# interleaved (load drifts on a shared machine hit all alike); the table shows the best
# run of each and the ratios; bench/results/bf16-cpu-<YYYYMMDD>.json holds every run, each
# ringtrain row with cpu_avx512_bf16, the oneDNN version and ISA, and `ringtrain info --json`.
#
#   bench/bf16.sh     (BUILD=build by default; THREADS=2, STEPS=10, BATCHES="64 128", REPEAT=3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
threads=${THREADS:-2}
steps=${STEPS:-10}
batches=${BATCHES:-64 128}
repeat=${REPEAT:-3}
[ -x "$bin" ] || { echo "bf16.sh: $bin not found (make build, or set BUILD / RINGTRAIN)" >&2; exit 1; }
have_torch=0
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null && have_torch=1 ||
  echo "bf16.sh: no PyTorch at /usr/bin/python3: its columns are skipped" >&2
mkdir -p bench/results
out=${OUT:-bench/results/bf16-cpu-$(date -u +%Y%m%d).json}
common=(--arch resnet34 --stem imagenet --channels 1 --size 28 --threads "$threads" --steps "$steps")
rows="["
sep=""
for rep in $(seq "$repeat"); do
  for b in $batches; do
    for p in fp32 bf16; do
      o=$("$bin" bench model --json "${common[@]}" --batch "$b" --precision "$p" 2>/dev/null)
      rows="$rows$sep$o"; sep=","
    done
    if [ "$have_torch" = 1 ]; then
      for ac in "" --autocast; do
        # shellcheck disable=SC2086
        o=$(/usr/bin/python3 bench/model_torch.py "${common[@]}" --batch "$b" $ac)
        rows="$rows$sep$o"
      done
    fi
  done
  echo "bf16.sh: round $rep of $repeat done" >&2
done
rows="$rows]"
info=$("$bin" info --json)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
/usr/bin/python3 - "$out" "$commit" "$info" "$rows" <<'PY'
import json, sys
out, commit, info, rows = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
best = {}
for r in rows:
    key = (r["impl"], r.get("precision", "fp32"), r["batch"])
    if key not in best or r["images_per_s"] > best[key]["images_per_s"]:
        best[key] = r
json.dump({"benchmark": "bf16", "commit": commit, "info": info, "runs": rows,
           "note": "best of the interleaved runs per configuration; only same-run ratios mean anything"},
          open(out, "w"), indent=1)
print("batch | ringtrain fp32  bf16  (x) | torch fp32  autocast | bf16/torch-autocast  bf16/torch-fp32  (img/s)")
for b in sorted({k[2] for k in best}):
    g = lambda i, p: best.get((i, p, b), {}).get("images_per_s")  # noqa: E731
    f32, b16, tf, ta = g("ringtrain", "fp32"), g("ringtrain", "bf16"), g("torch", "fp32"), g("torch", "autocast_bf16")
    r = lambda a, c: "%.2f" % (a / c) if a and c else "-"  # noqa: E731
    print("%5d | %8s %8s %5s | %8s %8s | %8s %8s" % (b, f32, b16, r(b16, f32), tf, ta, r(b16, ta), r(b16, tf)))
print("wrote", out)
PY
