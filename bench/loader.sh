#!/usr/bin/env bash
# Loader throughput: `ringtrain bench loader` (one worker thread, augmentation on,
# 1x28x28 and 3x32x32) side by side with PyTorch's DataLoader + torchvision transforms
# (num_workers=0, one thread) on data of the same shapes, as a ratio. Writes
# bench/results/loader-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/loader.sh            (BUILD=build by default; IMAGES, TORCH_IMAGES, BATCH)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
images=${IMAGES:-1000000}
torch_images=${TORCH_IMAGES:-50000}
batch=${BATCH:-256}
[ -x "$bin" ] || { echo "loader.sh: $bin not found (make build, or set BUILD / RINGTRAIN)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/loader-$(date -u +%Y%m%d).json

info=$("$bin" info --json)
ours=$(taskset -c 0 "$bin" bench loader --json --images "$images" --batch "$batch" 2>/dev/null ||
       "$bin" bench loader --json --images "$images" --batch "$batch")
if /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null; then
  ref=$(/usr/bin/python3 bench/loader.py --images "$torch_images" --batch "$batch")
else
  echo "loader.sh: no PyTorch at /usr/bin/python3 (scripts/install-deps bench): reference skipped" >&2
  ref=null
fi

/usr/bin/python3 - "$out" "$info" "$ours" "$ref" <<'PY'
import json, sys
out, info, ours, ref = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
rows = []
for r in ours["results"]:
    t = next((x for x in (ref or {}).get("results", []) if x["shape"] == r["shape"]), None)
    rows.append({"shape": r["shape"], "ringtrain_images_per_s": r["images_per_s"],
                 "torch_images_per_s": t["images_per_s"] if t else None,
                 "ratio": round(r["images_per_s"] / t["images_per_s"], 2) if t else None,
                 "target_images_per_s": 50000 if r["shape"] == "1x28x28" else None})
doc = {"benchmark": "loader",
       "note": "one loader worker thread (ringtrain pinned to CPU 0 when taskset works) vs torch DataLoader "
               "num_workers=0 with torchvision RandomCrop+RandomHorizontalFlip+Normalize, 1 thread",
       "info": info, "ringtrain": ours, "torch": ref, "summary": rows}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(f"wrote {out}")
print(f"{'shape':<8} {'ringtrain img/s':>16} {'torch img/s':>12} {'ratio':>7} {'target':>8}")
for r in rows:
    tv = f"{r['torch_images_per_s']:.0f}" if r["torch_images_per_s"] else "-"
    ratio = f"{r['ratio']:.1f}x" if r["ratio"] else "-"
    tgt = f">={r['target_images_per_s']}" if r["target_images_per_s"] else ""
    print(f"{r['shape']:<8} {r['ringtrain_images_per_s']:>16.0f} {tv:>12} {ratio:>7} {tgt:>8}")
PY
