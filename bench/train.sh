#!/usr/bin/env bash
# Training benchmarks on the CPU (issue 12):
#  1. ringtrain vs PyTorch DDP (gloo): ResNet34, 1x28x28 imagenet stem, 2 ranks x 1 thread,
#     the same global batch (128 and 256), interleaved in one run; images/s and the ratio.
#     ringtrain's images/s is the global batch over its mean step time from metrics.jsonl
#     (steps after the first WARMUP), PyTorch's the same from bench/ddp_torch.py.
#  2. The share of step time in exposed communication (the comm stage) with 2 ranks, with
#     overlapped buckets (dist.bucket_mb 25) and with one all-reduce after backward (0).
#  3. (BF16=1, the default) the same in bf16: ringtrain train.precision=bf16 against PyTorch DDP
#     under CPU autocast bf16 (bench/ddp_torch.py --autocast), both against PyTorch fp32
#     (issue 22, item 3: goal >= 2x both).
#  4. (QUICKSTART=1, the default) configs/quickstart.yaml to the end: wall time and test accuracy.
# Writes bench/results/train-cpu-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/train.sh   (BUILD=build; STEPS=20, WARMUP=3, REPEAT=2, BATCHES="128 256", BF16=1, QUICKSTART=1)
# Run it on a quiet machine: the comparisons are ratios of runs side by side.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
steps=${STEPS:-20}
warmup=${WARMUP:-3}
repeat=${REPEAT:-2}
batches=${BATCHES:-128 256}
quick=${QUICKSTART:-1}
bf16=${BF16:-1}
[ -x "$bin" ] || { echo "train.sh: $bin not found (make build)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/train-cpu-$(date -u +%Y%m%d).json
tmp=$(mktemp -d /tmp/rt-bench-train-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf 'model:\n  arch: resnet34\n' > "$tmp/c.yaml"
have_torch=0
/usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null && have_torch=1 ||
  echo "train.sh: no PyTorch at /usr/bin/python3 (scripts/install-deps bench): DDP reference skipped" >&2

# ringtrain: mean step ms and comm ms of rank 0 over the steps after the warm-up
ours() { # batch bucket_mb tag [precision]
  local dir=$tmp/$3 prec=${4:-fp32}
  "$bin" train "$tmp/c.yaml" data.batch_size="$1" dist.bucket_mb="$2" train.threads=1 --nproc 2 train.precision="$prec" \
    train.max_steps=$((steps + warmup)) train.eval_every=0 data.test_subset=256 log.progress=off \
    "log.dir=$dir" dist.transport=shm >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; return 1; }
  /usr/bin/python3 - "$dir/metrics.jsonl" "$warmup" "$1" "$2" "$prec" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = [r for r in rows if r["kind"] == "step"][int(sys.argv[2]):]
step = sum(r["step_ms"] for r in s) / len(s)
comm = sum(r["comm_ms"] for r in s) / len(s)
busy = sum(r["comm_busy_ms"] for r in s) / len(s)
print(json.dumps({"impl": "ringtrain", "precision": sys.argv[5], "global_batch": int(sys.argv[3]), "bucket_mb": float(sys.argv[4]),
                  "steps": len(s), "step_ms": step, "comm_ms": comm, "comm_busy_ms": busy,
                  "comm_share": comm / step, "images_per_s": int(sys.argv[3]) / (step / 1000.0)}))
PY
}
theirs() { # batch [--autocast]
  # shellcheck disable=SC2086
  /usr/bin/python3 bench/ddp_torch.py --batch "$1" --steps "$steps" --warmup "$warmup" --port $((29600 + RANDOM % 300)) ${2:-}
}

runs="["
sep=""
for rep in $(seq "$repeat"); do
  for b in $batches; do
    r=$(ours "$b" 25 "ours-$b-$rep"); runs+="$sep$r"; sep=","; echo "$r"
    if [ "$have_torch" = 1 ]; then r=$(theirs "$b"); runs+=",$r"; echo "$r"; fi
    r=$(ours "$b" 0 "ours0-$b-$rep"); runs+=",$r"; echo "$r"
    if [ "$bf16" = 1 ]; then
      r=$(ours "$b" 25 "oursbf-$b-$rep" bf16); runs+=",$r"; echo "$r"
      if [ "$have_torch" = 1 ]; then r=$(theirs "$b" --autocast); runs+=",$r"; echo "$r"; fi
    fi
  done
done
runs+="]"

quick_json=null
if [ "$quick" = 1 ]; then
  start=$(date +%s.%N)
  "$bin" train configs/quickstart.yaml "log.dir=$tmp/quickstart" log.progress=off >"$tmp/quick.out" 2>"$tmp/quick.err" ||
    { cat "$tmp/quick.err" >&2; exit 1; }
  end=$(date +%s.%N)
  acc=$(tail -1 "$tmp/quick.out" | sed -n 's/^test accuracy \([0-9.]*\)%.*/\1/p')
  quick_json=$(/usr/bin/python3 -c "import json; print(json.dumps({'config': 'configs/quickstart.yaml', 'wall_s': $end - $start, 'test_accuracy_percent': $acc}))")
  echo "quickstart: $quick_json"
fi

info=$("$bin" info --json)
/usr/bin/python3 - "$out" "$info" "$runs" "$quick_json" <<'PY'
import json, sys
out, info, runs, quick = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), json.loads(sys.argv[4])
best = {}
for r in runs:
    key = (r["impl"], r.get("precision", "fp32"), r["global_batch"], r.get("bucket_mb"))
    if key not in best or r["images_per_s"] > best[key]["images_per_s"]:
        best[key] = r
rows = []
ips = lambda r: r and r["images_per_s"]  # noqa: E731
ratio = lambda a, b: a["images_per_s"] / b["images_per_s"] if a and b else None  # noqa: E731
fmt = lambda v, f: f % v if v is not None else "-"  # noqa: E731
print("\n%-6s %10s %10s %7s %14s %14s | %10s %10s %9s %9s" % ("batch", "ringtrain", "torch DDP", "ratio",
      "comm (25)", "comm (0)", "ours bf16", "autocast", "/torch32", "/autocast"))
for b in sorted({r["global_batch"] for r in runs}):
    o, o0 = best.get(("ringtrain", "fp32", b, 25.0)), best.get(("ringtrain", "fp32", b, 0.0))
    t, ob, ta = best.get(("torch-ddp-gloo", "fp32", b, None)), best.get(("ringtrain", "bf16", b, 25.0)), \
        best.get(("torch-ddp-gloo", "autocast_bf16", b, None))
    rows.append({"global_batch": b, "ringtrain_images_per_s": ips(o), "torch_ddp_images_per_s": ips(t),
                 "ratio": ratio(o, t), "comm_share_overlapped": o and o["comm_share"],
                 "comm_share_bucket0": o0 and o0["comm_share"], "ringtrain_bf16_images_per_s": ips(ob),
                 "torch_ddp_autocast_bf16_images_per_s": ips(ta), "bf16_over_torch_fp32": ratio(ob, t),
                 "bf16_over_torch_autocast": ratio(ob, ta), "bf16_over_ringtrain_fp32": ratio(ob, o)})
    print("%-6d %10.1f %10s %7s %13.1f%% %13.1f%% | %10s %10s %9s %9s" % (
        b, o["images_per_s"], fmt(ips(t), "%.1f"), fmt(ratio(o, t), "%.2fx"), 100 * o["comm_share"],
        100 * o0["comm_share"], fmt(ips(ob), "%.1f"), fmt(ips(ta), "%.1f"), fmt(ratio(ob, t), "%.2fx"),
        fmt(ratio(ob, ta), "%.2fx")))
if quick:
    print("\nquickstart: %.1f%% test accuracy in %.0f s" % (quick["test_accuracy_percent"], quick["wall_s"]))
json.dump({"benchmark": "train-cpu", "machine": info, "table": rows, "quickstart": quick, "runs": runs},
          open(out, "w"), indent=1)
print("wrote", out)
PY
