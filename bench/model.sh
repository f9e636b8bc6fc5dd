#!/usr/bin/env bash
# Model training-step throughput on the CPU: `ringtrain bench model` (ResNet34, 1x28x28,
# imagenet stem, SGD momentum, --threads 2) side by side with PyTorch (bench/model_torch.py,
# torch.set_num_threads(2), the same model, batch and optimizer), batch 64 and 128, in
# the same run. Each configuration runs in its own process so its peak RSS is its own.
# Our step also runs with RINGTRAIN_CONV=im2col (the convolutions without oneDNN) and,
# on AVX-512 CPUs, with OPENBLAS_CORETYPE=SkylakeX.
# Prints images/s of both, the ratio and peak RSS, and writes
# bench/results/model-cpu-<YYYYMMDD>.json with `ringtrain info --json`.
#
# The machine may be shared: every configuration runs REPEAT times, interleaved, and the
# table shows the best run of each (all runs are in the JSON).
#
#   bench/model.sh     (BUILD=build by default; THREADS=2, STEPS=10, BATCHES="64 128", REPEAT=3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
threads=${THREADS:-2}
steps=${STEPS:-10}
batches=${BATCHES:-64 128}
repeat=${REPEAT:-3}
[ -x "$bin" ] || { echo "model.sh: $bin not found (make build, or set BUILD / RINGTRAIN)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/model-cpu-$(date -u +%Y%m%d).json
have_torch=0
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null && have_torch=1 ||
  echo "model.sh: no PyTorch at /usr/bin/python3 (scripts/install-deps bench): reference skipped" >&2

info=$("$bin" info --json)
# OpenBLAS picks its kernels when it loads; on AVX-512 CPUs it does not know (and where
# OPENBLAS_CORETYPE=Haswell is set) its SkylakeX kernels are faster: measure both.
avx512=0
grep -q avx512bw /proc/cpuinfo && grep -q avx512vl /proc/cpuinfo && avx512=1
ours="["
ours512="["
oursim="["
ref="["
sep=""
for rep in $(seq "$repeat"); do
for b in $batches; do
  # interleave the runs so that load drifts on a shared machine hit all of them alike
  o=$("$bin" bench model --json --arch resnet34 --stem imagenet --channels 1 --size 28 --batch "$b" \
        --threads "$threads" --steps "$steps" 2>/dev/null)
  if [ "$avx512" = 1 ]; then
    o512=$(OPENBLAS_CORETYPE=SkylakeX "$bin" bench model --json --arch resnet34 --stem imagenet --channels 1 \
             --size 28 --batch "$b" --threads "$threads" --steps "$steps" 2>/dev/null)
  else
    o512=null
  fi
  ours512="$ours512$sep$o512"
  # the im2col + OpenBLAS convolutions (the fallback without oneDNN), for comparison
  oim=$(RINGTRAIN_CONV=im2col "$bin" bench model --json --arch resnet34 --stem imagenet --channels 1 --size 28 \
          --batch "$b" --threads "$threads" --steps "$steps" 2>/dev/null)
  oursim="$oursim$sep$oim"
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
done
ours="$ours]"
ours512="$ours512]"
oursim="$oursim]"
ref="$ref]"
load=$(cut -d' ' -f1-3 /proc/loadavg)

/usr/bin/python3 - "$out" "$info" "$ours" "$ours512" "$ref" "$load" "${OPENBLAS_CORETYPE:-auto}" "$oursim" <<'PY'
import json, sys
out, info, ours, ours512, ref, load, coretype = (sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]),
                                                 json.loads(sys.argv[4]), json.loads(sys.argv[5]), sys.argv[6], sys.argv[7])
oursim = json.loads(sys.argv[8])
def best(runs, batch):
    runs = [x for x in runs if x and x["batch"] == batch]
    return max(runs, key=lambda x: x["images_per_s"]) if runs else None

rows = []
for batch in sorted({o["batch"] for o in ours}):
    o, o5, oi, r = best(ours, batch), best(ours512, batch), best(oursim, batch), best(ref or [], batch)
    for impl, x in ((f"ringtrain (OpenBLAS {coretype})", o), ("ringtrain (OpenBLAS SkylakeX)", o5),
                    (f"ringtrain im2col ({coretype})", oi)):
        if not x:
            continue
        rows.append({"impl": impl, "model": "resnet34 1x28x28 imagenet", "batch": x["batch"], "threads": x["threads"],
                     "ringtrain_images_per_s": x["images_per_s"],
                     "torch_images_per_s": r["images_per_s"] if r else None,
                     "ratio": round(x["images_per_s"] / r["images_per_s"], 2) if r else None,
                     "ringtrain_peak_rss_mb": x["peak_rss_mb"], "torch_peak_rss_mb": r["peak_rss_mb"] if r else None})
doc = {"benchmark": "model-cpu",
       "note": "training step = forward + cross-entropy + backward + SGD momentum; ringtrain --threads N vs "
               "torch.set_num_threads(N); each configuration in its own process, run several times interleaved, "
               "summary = best run of each; load average at the end: " + load +
               " (the machine may be shared with other jobs: compare the ratio, not the absolute numbers)",
       "openblas_coretype_env": coretype,
       "conv": "ringtrain: RINGTRAIN_CONV=auto (oneDNN where the build has it, dense unrolled matrix for layer4); "
               "ringtrain im2col: RINGTRAIN_CONV=im2col (im2col + OpenBLAS everywhere)",
       "info": info, "ringtrain": ours, "ringtrain_skylakex": ours512, "ringtrain_im2col": oursim, "torch": ref,
       "summary": rows}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(f"wrote {out}")
print(f"{'resnet34 1x28x28, imagenet stem':<32} {'batch':>5} {'img/s':>8} {'torch img/s':>12} {'ratio':>6} {'RSS MiB':>8} {'torch RSS MiB':>14}")
for r in rows:
    tv = f"{r['torch_images_per_s']:.1f}" if r["torch_images_per_s"] else "-"
    ratio = f"{r['ratio']:.2f}x" if r["ratio"] else "-"
    trss = f"{r['torch_peak_rss_mb']:.0f}" if r["torch_peak_rss_mb"] else "-"
    print(f"{r['impl']:<32} {r['batch']:>5} {r['ringtrain_images_per_s']:>8.1f} {tv:>12} {ratio:>6} "
          f"{r['ringtrain_peak_rss_mb']:>8.0f} {trss:>14}")
PY
