#!/usr/bin/env bash
# GPU benchmark: ResNet34 training-step throughput, ringtrain's CUDA backend against
# PyTorch eager on the same GPU in the same run.
#
# For each input (1x28x28 with the imagenet stem, 3x32x32 with the cifar stem), batch
# (128, 256) and precision (fp32, tf32, bf16): `ringtrain bench model --device cuda:0` and
# bench/gpu_torch.py (cudnn.benchmark on, the same precision, default and
# channels_last memory formats), one process per configuration. Reports images/s, the
# ratio ringtrain / PyTorch, and peak GPU memory: PyTorch's max_memory_allocated, and
# for both processes the peak "used_memory" nvidia-smi shows for their pid (CUDA
# context included), sampled every 0.2 s, and ringtrain's own peak_gpu_mb. Both sides
# time their steps with CUDA events and synchronise once per run.
#
#   bench/gpu.sh [--json FILE]
#
# Without --json the result goes to bench/results/gpu-<YYYYMMDD>.json. Environment:
# RINGTRAIN_BUILD (build dir, default build), PYTHON (an interpreter with torch; else
# python3, then /usr/bin/python3), STEPS (timed steps, default 30), WARMUP (default 5),
# BATCHES ("128 256"), PRECISIONS ("fp32 tf32 bf16"), DEVICE (cuda:0). scripts/gpu-check
# runs it with --json and embeds the file in bench/results/gpu-<date>-<gpu>.json.
# Without an NVIDIA GPU it says so and exits 0 (writing a "skipped" JSON only with --json).
set -euo pipefail
cd "$(dirname "$0")/.."

json_out=""
json_asked=0
while [ $# -gt 0 ]; do
  case "$1" in
    --json) json_out=${2:?--json needs a file}; json_asked=1; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
  esac
done

build=${RINGTRAIN_BUILD:-${BUILD:-build}}
bin=$build/ringtrain
steps=${STEPS:-30}
warmup=${WARMUP:-5}
batches=${BATCHES:-"128 256"}
precisions=${PRECISIONS:-"fp32 tf32 bf16"}
device=${DEVICE:-cuda:0}
gpu_index=${device#cuda:}
[ "$gpu_index" = "$device" ] && gpu_index=0
[ -n "$json_out" ] || json_out=bench/results/gpu-$(date -u +%Y%m%d).json

skip() {
  echo "gpu.sh: $1: skipped"
  # a result file only when asked for one (scripts/gpu-check); bench/run leaves none
  [ "$json_asked" = 0 ] || printf '{"benchmark": "gpu", "skipped": "%s"}\n' "$1" > "$json_out"
  exit 0
}
command -v nvidia-smi >/dev/null 2>&1 || skip "no nvidia-smi (no NVIDIA driver)"
nvidia-smi -L >/dev/null 2>&1 || skip "nvidia-smi finds no GPU"
[ -x "$bin" ] || { echo "gpu.sh: $bin not found (build with CUDA, or set RINGTRAIN_BUILD)" >&2; exit 1; }

py=${PYTHON:-python3}
if ! "$py" -c 'import torch' >/dev/null 2>&1; then
  if /usr/bin/python3 -c 'import torch' >/dev/null 2>&1; then py=/usr/bin/python3; else py=""; fi
fi
[ -n "$py" ] || echo "gpu.sh: no python with torch (set PYTHON): the PyTorch reference is skipped" >&2
jpy=${py:-python3} # any python3 assembles the JSON

bench_help=$("$bin" bench model --help 2>&1 || true)
has_device_opt=0
[[ "$bench_help" == *--device* ]] && has_device_opt=1
has_precision_opt=0
[[ "$bench_help" == *--precision* ]] && has_precision_opt=1

mkdir -p "$(dirname "$json_out")"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# gpu_used: the GPU's memory.used (MiB), for the device-wide fallback
gpu_used() {
  nvidia-smi --id="$gpu_index" --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null |
    awk 'NR == 1 { print $1 + 0 }' || true
}

# sample_peak PID BASE: while process PID lives, the peak nvidia-smi used_memory of that
# pid and the peak device-wide memory.used minus BASE (MiB; works where nvidia-smi
# lists no processes, e.g. in containers: one benchmark process runs at a time)
sample_peak() {
  local pid=$1 base=$2 peak=0 dpeak=0 v d
  while kill -0 "$pid" 2>/dev/null; do
    v=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits 2>/dev/null |
        awk -F', *' -v p="$pid" '$1 == p && !done { print $2; done = 1 }' || true)
    if [[ "$v" =~ ^[0-9]+$ ]] && [ "$v" -gt "$peak" ]; then peak=$v; fi
    d=$(gpu_used)
    if [[ "$d" =~ ^[0-9]+$ ]] && [ $((d - base)) -gt "$dpeak" ]; then dpeak=$((d - base)); fi
    sleep 0.2
  done
  echo "$peak $dpeak"
}

# run_one NAME CMD...: stdout's last JSON line, the exit code and the sampled peak
# memory go to $tmp/NAME.{json,rc,mem}; stderr to $tmp/NAME.err
run_one() {
  local name=$1 pid rc
  shift
  local base
  base=$(gpu_used)
  [[ "$base" =~ ^[0-9]+$ ]] || base=0
  "$@" > "$tmp/$name.out" 2> "$tmp/$name.err" &
  pid=$!
  sample_peak "$pid" "$base" > "$tmp/$name.mem"
  rc=0
  wait "$pid" || rc=$?
  echo "$rc" > "$tmp/$name.rc"
  grep '^{' "$tmp/$name.out" | tail -n1 > "$tmp/$name.json" || true
  if [ "$rc" != 0 ]; then
    echo "gpu.sh: $name failed (exit $rc): $(tail -n3 "$tmp/$name.err" | tr '\n' ' ')" >&2
  fi
}

configs="imagenet:1:28 cifar:3:32"
for cfg in $configs; do
  IFS=: read -r stem ch hw <<< "$cfg"
  for prec in $precisions; do
    for b in $batches; do
      tag=$stem-$prec-$b
      echo "== $tag: ringtrain"
      if [ "$has_device_opt" = 1 ]; then
        args=(bench model --arch resnet34 --device "$device" --stem "$stem" --channels "$ch" --size "$hw"
              --batch "$b" --steps "$steps" --warmup "$warmup" --json)
        [ "$has_precision_opt" = 1 ] && args+=(--precision "$prec")
        if [ "$has_precision_opt" = 1 ] || [ "$prec" = fp32 ]; then
          run_one "rt-$tag" "$bin" "${args[@]}"
        else
          echo '{"error": "ringtrain bench model has no --precision option"}' > "$tmp/rt-$tag.json"
        fi
      else
        echo '{"error": "ringtrain bench model has no --device option"}' > "$tmp/rt-$tag.json"
      fi
      if [ -n "$py" ]; then
        for mf in contiguous channels_last; do
          echo "== $tag: torch $mf"
          run_one "pt-$tag-$mf" "$py" bench/gpu_torch.py --arch resnet34 --device "cuda:$gpu_index" --stem "$stem" \
            --channels "$ch" --size "$hw" --batch "$b" --precision "$prec" --memory-format "$mf" \
            --steps "$steps" --warmup "$warmup"
        done
      fi
    done
  done
done

info=$("$bin" info --json 2>/dev/null || echo null)
nvsmi=$(nvidia-smi --id="$gpu_index" --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n1 || true)

RT_GPU_BENCH_INFO=$info "$jpy" - "$tmp" "$json_out" "$configs" "$precisions" "$batches" "$steps" "$warmup" "$nvsmi" <<'PY'
import json, os, sys
tmp, out, configs, precisions, batches, steps, warmup, nvsmi = sys.argv[1:9]

def load(name):
    res = {}
    p = os.path.join(tmp, name + ".json")
    try:
        with open(p) as f:
            text = f.read().strip()
        res = json.loads(text) if text else {"error": "no JSON output"}
    except (OSError, ValueError) as e:
        res = {"error": f"unreadable result: {e}"}
    try:
        with open(os.path.join(tmp, name + ".rc")) as f:
            rc = int(f.read().strip())
        if rc != 0:
            res.setdefault("error", f"exit code {rc}")
            with open(os.path.join(tmp, name + ".err")) as f:
                res["stderr_tail"] = f.read()[-800:]
    except (OSError, ValueError):
        pass
    try:
        with open(os.path.join(tmp, name + ".mem")) as f:
            fields = (f.read().split() + ["0", "0"])[:2]
        mem, dmem = int(fields[0]), int(fields[1])
        res["nvidia_smi_peak_mb"] = mem if mem > 0 else None
        res["device_used_delta_peak_mb"] = dmem if dmem > 0 else None
    except (OSError, ValueError):
        pass
    return res

rows, rt_all, pt_all = [], [], []
for cfg in configs.split():
    stem, ch, hw = cfg.split(":")
    for prec in precisions.split():
        for b in batches.split():
            tag = f"{stem}-{prec}-{b}"
            rt = load("rt-" + tag)
            rt.update({"tag": tag})
            rt_all.append(rt)
            row = {"input": f"{ch}x{hw}x{hw}", "stem": stem, "precision": prec, "batch": int(b),
                   "ringtrain_images_per_s": rt.get("images_per_s"),
                   "ringtrain_gpu_peak_mb": rt.get("peak_gpu_mb"),
                   "ringtrain_nvidia_smi_peak_mb": rt.get("nvidia_smi_peak_mb") or rt.get("device_used_delta_peak_mb")}
            for mf in ("contiguous", "channels_last"):
                pt = load(f"pt-{tag}-{mf}") if os.path.exists(os.path.join(tmp, f"pt-{tag}-{mf}.rc")) else {"error": "not run"}
                pt.update({"tag": f"{tag}-{mf}"})
                pt_all.append(pt)
                key = "torch" if mf == "contiguous" else "torch_cl"
                ips = pt.get("images_per_s")
                row[f"{key}_images_per_s"] = ips
                row[f"{key}_peak_allocated_mb"] = pt.get("peak_allocated_mb")
                row[f"{key}_nvidia_smi_peak_mb"] = pt.get("nvidia_smi_peak_mb") or pt.get("device_used_delta_peak_mb")
                r = row["ringtrain_images_per_s"]
                row[f"ratio_vs_{key}"] = round(r / ips, 3) if r and ips else None
            rows.append(row)

try:
    info = json.loads(os.environ.get("RT_GPU_BENCH_INFO", "null"))
except ValueError:
    info = None
doc = {"benchmark": "gpu",
       "note": "ResNet34 training step (forward, cross-entropy, backward, SGD momentum 0.9) on one random batch; "
               "ringtrain `bench model --device` vs PyTorch eager (cudnn.benchmark=True, same TF32 setting, "
               "contiguous and channels_last), one process per configuration, same GPU, same run. "
               "ratio = ringtrain images/s / torch images/s. Memory: the peak nvidia-smi used_memory of each "
               "process (CUDA context included), or where nvidia-smi lists no processes (containers) the peak rise "
               "of the GPU's memory.used during the run; plus torch max_memory_allocated, and ringtrain's own "
               "count (peak_gpu_mb) when `bench model` reports one.",
       "steps": int(steps), "warmup": int(warmup), "nvidia_smi": nvsmi, "info": info,
       "summary": rows, "ringtrain": rt_all, "torch": pt_all}
with open(out, "w") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
print(f"wrote {out}")

def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-".rjust(int(spec.split(".")[0]))

print(f"{'input':<8} {'stem':<8} {'prec':<5} {'batch':>5} | {'ringtrain':>9} {'torch':>9} {'torch_cl':>9} "
      f"{'ratio':>6} {'r/cl':>6} | {'rt MiB':>7} {'pt MiB':>7} {'rt own':>7} {'pt alloc':>8}")
for r in rows:
    print(f"{r['input']:<8} {r['stem']:<8} {r['precision']:<5} {r['batch']:>5} | "
          f"{fmt(r['ringtrain_images_per_s'], '9.0f')} {fmt(r['torch_images_per_s'], '9.0f')} "
          f"{fmt(r['torch_cl_images_per_s'], '9.0f')} {fmt(r['ratio_vs_torch'], '6.2f')} "
          f"{fmt(r['ratio_vs_torch_cl'], '6.2f')} | {fmt(r['ringtrain_nvidia_smi_peak_mb'], '7.0f')} "
          f"{fmt(r['torch_nvidia_smi_peak_mb'], '7.0f')} {fmt(r['ringtrain_gpu_peak_mb'], '7.0f')} "
          f"{fmt(r['torch_peak_allocated_mb'], '8.0f')}")
print("MiB: peak GPU memory of the process (nvidia-smi, CUDA context included); rt own: ringtrain's peak_gpu_mb "
      "(device memory it holds, CUDA context and library handles excluded); pt alloc: "
      "torch.cuda.max_memory_allocated")
PY
