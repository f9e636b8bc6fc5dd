#!/usr/bin/env bash
# The cost of tracing (log.trace, issue 21 item 1; goal: steady-state step time with tracing
# on within 2% of off): the same 2-rank CPU run with tracing off (A) and on (B), interleaved
# A B A B ... in one session, for two models: the tutorial Net (steps of a few ms: the
# worst case for a per-span cost) and ResNet34 (1x28x28, the project's workload). The step
# time is taken from rank 0's metrics.jsonl after WARMUP steps; a traced run's
# span count and trace file size are recorded too. A run's step time is its median step
# (step_ms; the mean is kept as step_ms_mean). The recorder's own cost per span (a
# microbenchmark against the build's librt_core.a) gives its share of a step without the
# noise of whole runs.
# Writes bench/results/trace-cpu-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/trace.sh   (BUILD=build; REPEAT=3; NET_STEPS=150, RESNET_STEPS=12, WARMUP=3; NOTE="...")
# Only same-run ratios mean anything (the machines vary up to 2x between runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
repeat=${REPEAT:-3}
warmup=${WARMUP:-3}
net_steps=${NET_STEPS:-150}
res_steps=${RESNET_STEPS:-12}
note=${NOTE:-}
[ -x "$bin" ] || { echo "trace.sh: $bin not found (make build)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/trace-cpu-$(date -u +%Y%m%d).json
tmp=$(mktemp -d /tmp/rt-bench-trace-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"

# one run: model steps batch trace(true|false) tag -> a JSON line
one() {
  local model=$1 steps=$2 batch=$3 trace=$4 dir=$tmp/$5
  "$bin" train "$tmp/c.yaml" model.arch="$model" data.batch_size="$batch" train.threads=1 --nproc 2 \
    train.max_steps=$((steps + warmup)) train.eval_every=0 data.test_subset=64 log.progress=off \
    log.trace="$trace" "log.dir=$dir" dist.transport=shm >/dev/null 2>"$tmp/err" || { cat "$tmp/err" >&2; return 1; }
  /usr/bin/python3 - "$dir" "$warmup" "$model" "$batch" "$trace" <<'PY'
import json, os, sys
d, warm, model, batch, trace = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "true"
s = [r for r in map(json.loads, open(d + "/metrics.jsonl")) if r["kind"] == "step"][warm:]
ms = sorted(x["step_ms"] for x in s)
# the median step: other processes on a shared machine add spikes that a mean would carry
r = {"model": model, "global_batch": batch, "trace": trace, "steps": len(s), "step_ms": ms[len(ms) // 2],
     "step_ms_mean": sum(ms) / len(ms)}
if trace:
    f = d + "/trace-rank0.jsonl"
    r["trace_bytes_rank0"] = os.path.getsize(f)
    r["spans_rank0"] = sum(1 for l in open(f) if l.startswith('{"name"'))
print(json.dumps(r))
PY
}

# the recorder alone: ns per span (rt_trace_now + rt_trace_end) with tracing on and off,
# 2^20 spans into a buffer that holds them all (no flush inside the timed loop)
cat > "$tmp/span.c" <<'C'
#include "core/trace.h"
#include <stdio.h>
int main(int argc, char **argv) {
    enum { N = 1 << 20 };
    double ns[2];
    for (int on = 1; on >= 0; on--) {
        if (on && rt_trace_start(argv[1], N) != RT_OK) return 1;
        if (!on) rt_trace_stop();
        uint64_t t0 = rt_now_ns();
        for (int i = 0; i < N; i++) {
            uint64_t t = rt_trace_now();
            rt_trace_end(RT_TRACK_MAIN, "span", t);
        }
        ns[on] = (double)(rt_now_ns() - t0) / N;
    }
    printf("{\"ns_per_span_on\": %.2f, \"ns_per_span_off\": %.2f}\n", ns[1], ns[0]);
    (void)argc;
    return 0;
}
C
build_dir=$(dirname "$bin")
span_json=null
if cc -O2 -I src -I "$build_dir/generated" "$tmp/span.c" "$build_dir/librt_core.a" -lpthread -o "$tmp/span" 2>"$tmp/cc.err"; then
  span_json=$("$tmp/span" "$tmp/span.jsonl")
  echo "recorder: $span_json"
else
  echo "trace.sh: could not build the recorder microbenchmark (needs $build_dir/librt_core.a):" >&2; cat "$tmp/cc.err" >&2
fi

runs="["
sep=""
for rep in $(seq "$repeat"); do
  for cfg in "net $net_steps 64" "resnet34 $res_steps 128"; do
    # shellcheck disable=SC2086 # three words: model steps batch
    set -- $cfg
    for tr in false true; do
      r=$(one "$1" "$2" "$3" "$tr" "$1-$tr-$rep"); runs+="$sep$r"; sep=","; echo "$r"
    done
  done
done
runs+="]"

info=$("$bin" info --json)
/usr/bin/python3 - "$out" "$info" "$runs" "$note" "$span_json" <<'PY'
import json, statistics, sys
out, info, runs, note = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
span = json.loads(sys.argv[5])
rows = []
print("\n%-9s %6s %12s %12s %9s %12s %13s  %s" % ("model", "batch", "off ms/step", "on ms/step", "on/off",
      "spans/step", "recorder/step", "undisturbed pairs on/off"))
for m in sorted({r["model"] for r in runs}):
    off = [r["step_ms"] for r in runs if r["model"] == m and not r["trace"]]
    on = [r for r in runs if r["model"] == m and r["trace"]]
    # per pair (A then B of one repetition): the ratio; the median of the pairs' ratios
    ratios = [b["step_ms"] / a for a, b in zip(off, on)]
    spans = statistics.median(r["spans_rank0"] / (r["steps"] + 3) for r in on)
    row = {"model": m, "global_batch": on[0]["global_batch"], "off_step_ms_median": statistics.median(off),
           "on_step_ms_median": statistics.median(r["step_ms"] for r in on), "on_over_off_pairs": ratios,
           "on_over_off_median": statistics.median(ratios), "spans_per_step_rank0": spans}
    rows.append(row)
    # pairs that other processes left alone: both runs within 5% of the model's fastest run
    fast = min(off + [r["step_ms"] for r in on])
    quiet = [b["step_ms"] / a for a, b in zip(off, on) if max(a, b["step_ms"]) <= 1.05 * fast]
    row["undisturbed_pairs_on_over_off"] = quiet
    if span:  # the recorder's own cost per step, as a share of the step
        row["recorder_share_of_step"] = spans * span["ns_per_span_on"] * 1e-6 / row["off_step_ms_median"]
    print("%-9s %6d %12.2f %12.2f %8.3fx %12.1f %13s  %s" % (m, row["global_batch"], row["off_step_ms_median"],
          row["on_step_ms_median"], row["on_over_off_median"], spans,
          "%.4f%%" % (100 * row["recorder_share_of_step"]) if span else "-",
          " ".join("%.3f" % q for q in quiet) or "-"))
if span:
    print("recorder: %.1f ns per span with tracing on, %.1f ns off" % (span["ns_per_span_on"], span["ns_per_span_off"]))
json.dump({"benchmark": "trace-cpu", "machine": info, "note": note, "recorder": span, "table": rows, "runs": runs},
          open(out, "w"), indent=1)
print("wrote", out)
PY
