#!/usr/bin/env bash
# The cost of model.sync_bn (issue 42, item 2): the CPU training step of a small ResNet
# (resnet18, 1x28x28 Fashion-MNIST, imagenet stem) on 2 ranks (1 thread each, shm),
# global batch BATCH, with synchronised batch norm off and on, alternated REPS times so
# that the machine's drift falls on both. Per run: the median of rank 0's step_ms over
# the steps after the first WARM (metrics.jsonl), and forward/backward/comm medians.
# sync_bn adds two all-reduces of 2C+1 doubles per batch norm per step (resnet18: 20
# batch norms, 40 small all-reduces), queued on the group behind the gradient buckets.
# Writes bench/results/syncbn-cpu-<YYYYMMDD>.json with `ringtrain info --json` and the
# commit; prints the table last.
#
#   bench/syncbn.sh   (BUILD=build; WIDTHS="16 64"; BATCH=64; STEPS=40; WARM=10; REPS=3)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
widths=${WIDTHS:-16 64}
batch=${BATCH:-64}
steps=${STEPS:-40}
warm=${WARM:-10}
reps=${REPS:-3}
[ -x "$bin" ] || { echo "syncbn.sh: $bin not found (make build)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/syncbn-cpu-$(date -u +%Y%m%d).json
tmp=$(mktemp -d /tmp/rt-bench-syncbn-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf 'model:\n  arch: resnet18\n' >"$tmp/c.yaml"

load0=$(cut -d' ' -f1-3 /proc/loadavg)
runs=""
for w in $widths; do
  for r in $(seq 1 "$reps"); do
    for sync in false true; do
      d=$tmp/w$w-$sync-$r
      "$bin" train "$tmp/c.yaml" model.width="$w" model.sync_bn=$sync data.batch_size="$batch" \
        train.max_steps="$steps" train.threads=1 dist.nproc=2 dist.transport=shm log.progress=off \
        log.every_steps=1 data.test_subset=64 "log.dir=$d" >"$d.out" 2>"$d.err" || { cat "$d.err" >&2; exit 1; }
      runs+="$w $sync $r $d"$'\n'
    done
  done
done

load1=$(cut -d' ' -f1-3 /proc/loadavg)
/usr/bin/python3 - "$out" "$batch" "$steps" "$warm" "$(git rev-parse HEAD)" "$("$bin" info --json)" "$load0" "$load1" <<PY
import json, statistics, sys
out, batch, steps, warm, commit, info = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], json.loads(sys.argv[6])
runs = [l.split() for l in """$runs""".strip().splitlines()]
rows = []
for w, sync, rep, d in runs:
    st = [json.loads(l) for l in open(d + "/metrics.jsonl") if '"kind": "step"' in l and '"rank": 0' in l]
    st = [s for s in st if s["step"] > warm]
    med = lambda k: statistics.median(s[k] for s in st)
    rows.append({"width": int(w), "sync_bn": sync == "true", "rep": int(rep), "steps": len(st),
                 "step_ms": med("step_ms"), "forward_ms": med("forward_ms"), "backward_ms": med("backward_ms"),
                 "comm_ms": med("comm_ms"), "images_per_s": med("images_per_s")})
summary = []
for w in sorted({r["width"] for r in rows}):
    off = [r["step_ms"] for r in rows if r["width"] == w and not r["sync_bn"]]
    on = [r["step_ms"] for r in rows if r["width"] == w and r["sync_bn"]]
    pairs = [b / a for a, b in zip(off, on)]
    summary.append({"width": w, "step_ms_off": statistics.median(off), "step_ms_on": statistics.median(on),
                    "ratio_on_off_per_pair": pairs, "ratio_median": statistics.median(pairs)})
doc = {"bench": "syncbn", "what": "CPU training step, resnet18 1x28x28 imagenet stem, 2 ranks x 1 thread over shm, "
       "model.sync_bn off vs on (alternated)", "global_batch": batch, "steps": steps, "warmup_steps_dropped": warm,
       "commit": commit, "info": info, "loadavg_before_after": [sys.argv[7], sys.argv[8]],
       "note": "${NOTE:-}", "runs": rows, "summary": summary}
json.dump(doc, open(out, "w"), indent=1)
print("width | step ms off | step ms on | on/off (median of %d pairs)" % len(summary[0]["ratio_on_off_per_pair"]))
for s in summary:
    print("%5d | %11.2f | %10.2f | %.3f  %s" % (s["width"], s["step_ms_off"], s["step_ms_on"], s["ratio_median"],
          " ".join("%.3f" % p for p in s["ratio_on_off_per_pair"])))
print("wrote", out)
PY
