#!/usr/bin/env bash
# Where a GPU training step's time goes, layer by layer, per precision: `ringtrain bench
# model --device cuda --layers` (a second run after the timed one, a pair of CUDA events
# around every layer call, one synchronisation per step: each layer's GPU time)
# for ResNet34 at 1x28x28 (imagenet stem) and 3x32x32 (cifar stem), each precision and
# batch, one process each. Prints, per input and batch, the TOP layer shapes and passes
# with the most time, their ms per step in each precision side by side, and writes
# bench/results/gpu-layers-<YYYYMMDD>.json (or --json FILE) with all the rows. Exits 1
# when a run failed (its entry then has "error" and "stderr_tail").
#
#   bench/gpu_layers.sh [--json FILE]
#
# Environment: RINGTRAIN_BUILD (build dir, default build), PRECISIONS ("tf32 bf16 bf16-nchw";
# bf16-nchw: bf16 with RINGTRAIN_CUDNN_LAYOUT=nchw, the copies' layout before NHWC),
# BATCHES ("256"), STEPS (10), WARMUP (3), DEVICE (cuda:0), TOP (rows printed, 25).
# Without an NVIDIA GPU it says so and exits 0 (a "skipped" JSON only with --json).
# It answers what bench/gpu.sh cannot: which layers make bf16 slower or faster than tf32.
set -euo pipefail
cd "$(dirname "$0")/.."
json_out=""
json_asked=0
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json_out=${2:?--json needs a file}; json_asked=1; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_layers.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done
bin=${RINGTRAIN_BUILD:-build}/ringtrain
precisions=${PRECISIONS:-tf32 bf16 bf16-nchw}
batches=${BATCHES:-256}
steps=${STEPS:-10}
warmup=${WARMUP:-3}
device=${DEVICE:-cuda:0}
top=${TOP:-25}
[ -n "$json_out" ] || json_out=bench/results/gpu-layers-$(date -u +%Y%m%d).json
skip() {
  echo "gpu_layers.sh: $1: skipped"
  [ "$json_asked" = 0 ] || printf '{"benchmark": "gpu-layers", "skipped": "%s"}\n' "$1" > "$json_out"
  exit 0
}
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi (no NVIDIA driver)"
nvidia-smi -L >/dev/null 2>&1 || skip "nvidia-smi finds no GPU"
[ -x "$bin" ] || { echo "gpu_layers.sh: $bin not found (build with CUDA, or set RINGTRAIN_BUILD)" >&2; exit 1; }
mkdir -p "$(dirname "$json_out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
configs="imagenet:1:28 cifar:3:32"
for cfg in $configs; do
  IFS=: read -r stem ch hw <<< "$cfg"
  for b in $batches; do
    for p in $precisions; do
      echo "== $stem $p $b"
      rc=0
      layout=auto prec=$p
      [ "$p" != bf16-nchw ] || { layout=nchw prec=bf16; }
      RINGTRAIN_CUDNN_LAYOUT=$layout "$bin" bench model --arch resnet34 --device "$device" --stem "$stem" \
        --channels "$ch" --size "$hw" --batch "$b" --steps "$steps" --warmup "$warmup" --precision "$prec" --layers --json \
        > "$tmp/$stem-$p-$b.json" 2> "$tmp/$stem-$p-$b.err" || rc=$?
      echo "$rc" > "$tmp/$stem-$p-$b.rc"
      [ "$rc" = 0 ] || echo "gpu_layers.sh: $stem $p $b failed (exit $rc): $(tail -n3 "$tmp/$stem-$p-$b.err" | tr '\n' ' ')" >&2
    done
  done
done
info=$("$bin" info --json 2>/dev/null || echo null)
failed=0
RT_INFO=$info python3 - "$tmp" "$json_out" "$configs" "$precisions" "$batches" "$top" <<'PY' || failed=1
import json, os, sys
tmp, out, configs, precisions, batches, top = sys.argv[1:7]
precs = precisions.split()
runs, bad = [], []
for cfg in configs.split():
    stem, ch, hw = cfg.split(":")
    for b in batches.split():
        per = {}
        for p in precs:
            path = os.path.join(tmp, f"{stem}-{p}-{b}.json")
            base = path[:-5]
            try:
                lines = [l for l in open(path).read().splitlines() if l.startswith("{")]
                d = json.loads(lines[-1])
            except (OSError, ValueError, IndexError) as e:
                d = {"error": f"no result: {e}"}
            try:
                rc = int(open(base + ".rc").read().strip())
            except (OSError, ValueError):
                rc = -1
            if rc != 0 or "layers" not in d or d.get("layers") is None:
                d.setdefault("error", f"exit code {rc}" if rc != 0 else "no per-layer rows")
                try:
                    d["stderr_tail"] = open(base + ".err").read()[-800:]
                except OSError:
                    pass
                bad.append(f"{stem} {p} {b}")
            d.update({"stem": stem, "input": f"{ch}x{hw}x{hw}", "batch": int(b), "precision": p})
            runs.append(d)
            per[p] = d
        print(f"\n{ch}x{hw}x{hw} {stem} batch {b}: step ms (timed run) " +
              ", ".join(f"{p} {per[p].get('step_ms', '-')}" for p in precs) + "; profiled run " +
              ", ".join(f"{p} {per[p].get('layers_step_ms', '-')}" for p in precs))
        keys, ms = [], {}
        for p in precs:
            for r in per[p].get("layers") or []:
                k = (r["kind"], r["shape"], r["pass"])
                if k not in ms:
                    keys.append(k)
                    ms[k] = {}
                ms[k][p] = r["ms_per_step"]
        keys.sort(key=lambda k: -max(ms[k].values()))
        print(f"  {'layer':<21} {'shape':<36} {'pass':<8} " + " ".join(f"{p + ' ms':>9}" for p in precs))
        for k in keys[:int(top)]:
            print(f"  {k[0]:<21} {k[1]:<36} {k[2]:<8} " +
                  " ".join(f"{ms[k][p]:9.3f}" if p in ms[k] else f"{'-':>9}" for p in precs))
        for p in precs:
            if per[p].get("layers"):
                print(f"  {'all layers':<66} {p}: {per[p]['layers_ms_per_step']:.3f} ms, optimizer in the step "
                      f"{per[p].get('optim_ms', 0):.3f} ms (timed run)")
try:
    info = json.loads(os.environ.get("RT_INFO", "null"))
except ValueError:
    info = None
doc = {"benchmark": "gpu-layers", "info": info,
       "note": "ringtrain bench model --device cuda --layers: after the timed run (events, no synchronisation), a "
               "second run with a pair of CUDA events around every layer call and one synchronisation per step; "
               "ms_per_step is each layer's GPU time from its first work to its last", "runs": runs}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print(f"wrote {out}")
if bad:
    print("gpu_layers.sh: failed: " + ", ".join(bad), file=sys.stderr)
    sys.exit(1)
PY
exit $failed
