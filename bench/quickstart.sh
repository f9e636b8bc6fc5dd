#!/usr/bin/env bash
# The quickstart's time and accuracy (issue 23, item 5; goals: <= 10 minutes on 2 CPU
# cores, >= 91.5% test accuracy): `ringtrain train configs/quickstart.yaml` (what
# `make train` runs) to the end, once per seed (train.seed; the config's own is 0), wall
# time from the launch to the exit, accuracy from the run's final evaluation.
# Writes bench/results/quickstart-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/quickstart.sh   (BUILD=build; SEEDS="0 1"; NOTE="..."; OVERRIDES="train.precision=bf16"
#                          adds config overrides to every run; OUT=file.json)
# Run it on a quiet machine: the time is the point.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
seeds=${SEEDS:-0 1}
note=${NOTE:-}
overrides=${OVERRIDES:-}
[ -x "$bin" ] || { echo "quickstart.sh: $bin not found (make build)" >&2; exit 1; }
mkdir -p bench/results
out=${OUT:-bench/results/quickstart-$(date -u +%Y%m%d).json}
tmp=$(mktemp -d /tmp/rt-bench-quickstart-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

runs="["
sep=""
for seed in $seeds; do
  t0=$(date +%s.%N)
  # shellcheck disable=SC2086
  "$bin" train configs/quickstart.yaml train.seed="$seed" log.progress=off "log.dir=$tmp/s$seed" $overrides >"$tmp/t.out" 2>"$tmp/t.err" ||
    { cat "$tmp/t.err" >&2; exit 1; }
  t1=$(date +%s.%N)
  r=$(/usr/bin/python3 -c 'import json, sys
e = [json.loads(l) for l in open(sys.argv[1]) if "\"eval\"" in l]
print(json.dumps({"seed": int(sys.argv[2]), "wall_s": float(sys.argv[3]), "epoch_accuracy": [100 * x["accuracy"] for x in e],
                  "test_accuracy": 100 * e[-1]["accuracy"], "test_loss": e[-1]["loss"]}))' \
    "$tmp/s$seed/metrics.jsonl" "$seed" "$(echo "$t1 - $t0" | bc)")
  echo "$r"
  runs+="$sep$r"
  sep=","
done
runs+="]"

info=$("$bin" info --json)
/usr/bin/python3 - "$out" "$info" "$runs" "$note" "$overrides" <<'PY'
import json, statistics, sys
out, info, runs, note, overrides = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
acc = [r["test_accuracy"] for r in runs]
wall = [r["wall_s"] for r in runs]
print("\nquickstart: test accuracy %s (mean %.2f%%, goal >= 91.5), wall time %s s (max %.0f s, goal <= 600)" %
      (" ".join("%.2f" % a for a in acc), statistics.mean(acc), " ".join("%.0f" % w for w in wall), max(wall)))
json.dump({"benchmark": "quickstart", "config": "configs/quickstart.yaml", "overrides": overrides, "machine": info, "note": note,
           "mean_accuracy": statistics.mean(acc), "min_accuracy": min(acc), "max_wall_s": max(wall),
           "goals_met": min(acc) >= 91.5 and max(wall) <= 600, "runs": runs}, open(out, "w"), indent=1)
print("wrote", out)
PY
