#!/usr/bin/env bash
# The cost of gradient accumulation (train.accumulate; issue 42, item 1) on the CPU: the
# time of one optimizer step at the same global batch with K = 1 and K micro-batches
# (2 ranks x 1 thread over shm, a small ResNet on Fashion-MNIST), interleaved REPEAT
# times; the mean step time of rank 0 over the steps after WARMUP (metrics.jsonl), its
# forward/backward/comm stages, and the ratio to K = 1. What K costs: K smaller GEMMs and
# convolutions instead of one, K-1 folds of the gradient arena (a scale and an add), and
# less of the all-reduce hidden (it overlaps only the last micro-batch's backward).
# Writes bench/results/accumulate-cpu-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/accumulate.sh   (BUILD=build; ARCH=resnet18 WIDTH=32 BATCH=128 KS="1 2 4" STEPS=12 WARMUP=3 REPEAT=2)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
arch=${ARCH:-resnet18}
width=${WIDTH:-32}
batch=${BATCH:-128}
ks=${KS:-1 2 4}
steps=${STEPS:-12}
warmup=${WARMUP:-3}
repeat=${REPEAT:-2}
[ -x "$bin" ] || { echo "accumulate.sh: $bin not found (make build)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/accumulate-cpu-$(date -u +%Y%m%d).json
tmp=$(mktemp -d /tmp/rt-bench-accum-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf 'model:\n  arch: %s\n' "$arch" > "$tmp/c.yaml"

one() { # K repeat: one run's rank-0 means, as JSON
  local dir=$tmp/k$1-$2
  "$bin" train "$tmp/c.yaml" model.width="$width" data.batch_size="$batch" train.accumulate="$1" train.threads=1 \
    --nproc 2 dist.transport=shm train.max_steps=$((steps + warmup)) train.eval_every=0 data.test_subset=128 \
    log.progress=off "log.dir=$dir" >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; return 1; }
  /usr/bin/python3 - "$dir/metrics.jsonl" "$warmup" "$1" <<'PY'
import json, sys
s = [r for r in map(json.loads, open(sys.argv[1])) if r["kind"] == "step"][int(sys.argv[2]):]
mean = lambda k: sum(r[k] for r in s) / len(s)
print(json.dumps({"accumulate": int(sys.argv[3]), "steps": len(s), "images_per_step": s[0]["images"],
                  **{k: mean(k) for k in ("step_ms", "forward_ms", "backward_ms", "comm_ms", "optim_ms", "comm_busy_ms")}}))
PY
}

runs=()
for r in $(seq "$repeat"); do
  for k in $ks; do runs+=("$(one "$k" "$r")"); done
done
info=$("$bin" info --json)
printf '%s\n' "${runs[@]}" > "$tmp/runs.jsonl"
/usr/bin/python3 - "$tmp/runs.jsonl" "$out" "$arch" "$width" "$batch" <<PY
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
info = json.loads('''$info''')
ks = sorted({r["accumulate"] for r in runs})
table = []
for k in ks:
    rs = [r for r in runs if r["accumulate"] == k]
    row = {"accumulate": k, "micro_batch_per_rank": int(sys.argv[5]) // 2 // k, "runs": len(rs)}
    for f in ("step_ms", "forward_ms", "backward_ms", "comm_ms", "optim_ms", "comm_busy_ms"):
        row[f] = sum(r[f] for r in rs) / len(rs)
    table.append(row)
base = table[0]["step_ms"]
for row in table:
    row["step_over_k1"] = row["step_ms"] / base
    row["images_per_s"] = int(sys.argv[5]) / (row["step_ms"] / 1000.0)
    print("K=%d (micro-batch %d per rank): %.1f ms per optimizer step (x%.3f of K=1), comm exposed %.1f ms"
          % (row["accumulate"], row["micro_batch_per_rank"], row["step_ms"], row["step_over_k1"], row["comm_ms"]))
json.dump({"benchmark": "accumulate-cpu", "machine": info,
           "setup": {"arch": sys.argv[3], "width": int(sys.argv[4]), "global_batch": int(sys.argv[5]), "ranks": 2,
                     "threads_per_rank": 1, "transport": "shm", "dataset": "fashion-mnist (1x28x28, imagenet stem)",
                     "steps_measured": runs[0]["steps"]},
           "table": table, "runs": runs}, open(sys.argv[2], "w"), indent=1)
print("wrote", sys.argv[2])
PY
