#!/usr/bin/env bash
# Model training-step throughput on the CPU: `ringtrain bench model` (ResNet34, 1x28x28,
# imagenet stem, SGD momentum, --threads 2) side by side with PyTorch (bench/model_torch.py,
# torch.set_num_threads(2), the same model, batch and optimizer), batch 64 and 128, in
# the same run. Each configuration runs in its own process so its peak RSS is its own.
# Prints images/s of both, the ratio and peak RSS, and writes
# bench/results/model-cpu-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/model.sh     (BUILD=build by default; THREADS=2, STEPS=10, BATCHES="64 128")
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
threads=${THREADS:-2}
steps=${STEPS:-10}
batches=${BATCHES:-64 128}
[ -x "$bin" ] || { echo "model.sh: $bin not found (make build, or set BUILD / RINGTRAIN)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/model-cpu-$(date -u +%Y%m%d).json
have_torch=0
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null && have_torch=1 ||
  echo "model.sh: no PyTorch at /usr/bin/python3 (scripts/install-deps bench): reference skipped" >&2

info=$("$bin" info --json)
ours="["
ref="["
sep=""
for b in $batches; do
  # alternate the two so that machine load drifts hit both alike
  o=$("$bin" bench model --json --arch resnet34 --stem imagenet --channels 1 --size 28 --batch "$b" \
        --threads "$threads" --steps "$steps")
  if [ "$have_torch" = 1 ]; then
    r=$(/usr/bin/python3 bench/model_torch.py --arch resnet34 --stem imagenet --channels 1 --size 28 \
          --batch "$b" --threads "$threads" --steps "$steps")
  else
    r=null
  fi
  ours="$ours$sep$o"
  ref="$ref$sep$r"
  sep=","
done
ours="$ours]"
ref="$ref]"
load=$(cut -d' ' -f1-3 /proc/loadavg)

/usr/bin/python3 - "$out" "$info" "$ours" "$ref" "$load" <<'PY'
import json, sys
out, info, ours, ref, load = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4]), sys.argv[5]
rows = []
for o, r in zip(ours, ref):
    rows.append({"model": "resnet34 1x28x28 imagenet stem", "batch": o["batch"], "threads": o["threads"],
                 "ringtrain_images_per_s": o["images_per_s"],
                 "torch_images_per_s": r["images_per_s"] if r else None,
                 "ratio": round(o["images_per_s"] / r["images_per_s"], 2) if r else None,
                 "ringtrain_peak_rss_mb": o["peak_rss_mb"], "torch_peak_rss_mb": r["peak_rss_mb"] if r else None})
doc = {"benchmark": "model-cpu",
       "note": "training step = forward + cross-entropy + backward + SGD momentum; ringtrain --threads N vs "
               "torch.set_num_threads(N); each configuration in its own process; load average at the end: " + load +
               " (the machine may be shared with other jobs: compare the ratio, not the absolute numbers)",
       "info": info, "ringtrain": ours, "torch": ref, "summary": rows}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(f"wrote {out}")
print(f"{'model':<32} {'batch':>5} {'ringtrain img/s':>16} {'torch img/s':>12} {'ratio':>6} {'RSS ours MiB':>13} {'RSS torch MiB':>14}")
for r in rows:
    tv = f"{r['torch_images_per_s']:.1f}" if r["torch_images_per_s"] else "-"
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
    trss = f"{r['torch_peak_rss_mb']:.0f}" if r["torch_peak_rss_mb"] else "-"
    print(f"{r['model']:<32} {r['batch']:>5} {r['ringtrain_images_per_s']:>16.1f} {tv:>12} {ratio:>6} "
          f"{r['ringtrain_peak_rss_mb']:>13.0f} {trss:>14}")
PY
