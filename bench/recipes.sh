#!/usr/bin/env bash
# The recipe ablation (issue 23, item 3): the quickstart's budget (configs/quickstart.yaml:
# ResNet34 width 8, CIFAR stem, batch 128, one-cycle SGD, 2 ranks; EPOCHS epochs, 4 by default) trained from
# the baseline with no technique, then with each technique added on top of the previous
# row. Test-time augmentation changes only the evaluation, so its row evaluates the
# previous row's final checkpoint with eval.tta=flip instead of training again. Every row
# runs SEEDS seeds (train.seed); the table shows each seed and the mean, on the whole
# Fashion-MNIST test set.
# Writes bench/results/recipes-ablation-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/recipes.sh   (BUILD=build; SEEDS="0 1"; CONFIG=configs/quickstart.yaml; EPOCHS=4; NOTE="...")
# Accuracy does not depend on the machine's load; the times do (run it on a quiet machine
# to read them).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
seeds=${SEEDS:-0 1}
config=${CONFIG:-configs/quickstart.yaml}
epochs=${EPOCHS:-4}
note=${NOTE:-}
[ -x "$bin" ] || { echo "recipes.sh: $bin not found (make build)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/recipes-ablation-$(date -u +%Y%m%d).json
tmp=$(mktemp -d /tmp/rt-bench-recipes-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# cumulative rows: label|overrides added to the previous row ("eval:" = evaluate the
# previous row's checkpoint with these overrides, no training)
rows=(
  "baseline (crop only)|train.epochs=$epochs data.hflip=0 train.label_smoothing=0 train.ema_decay=0 eval.tta=none data.erasing=0"
  "+ horizontal flip|data.hflip=1"
  "+ label smoothing 0.1|train.label_smoothing=0.1"
  "+ EMA 0.998 (every step)|train.ema_decay=0.998 train.ema_every=1"
  "+ flip TTA|eval:eval.tta=flip"
  "+ random erasing p=0.25|data.erasing=0.25 eval.tta=flip"
)

acc_of_metrics() { # RUN_DIR -> "loss accuracy" of the last evaluation
  /usr/bin/python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1] + "/metrics.jsonl") if "\"eval\"" in l][-1]; print(r["loss"], r["accuracy"])' "$1"
}
acc_of_eval() { # eval output -> "loss accuracy"
  sed -n 's/.*test loss \([0-9.]*\), accuracy \([0-9.]*\)%.*/\1 \2/p' "$1" | tail -1 | awk '{printf "%s %.4f\n", $1, $2 / 100}'
}

results="["
sep=""
for seed in $seeds; do
  acc=()
  prev=""
  for i in "${!rows[@]}"; do
    label=${rows[$i]%%|*}
    ov=${rows[$i]#*|}
    dir=$tmp/s$seed-r$i
    t0=$(date +%s.%N)
    if [[ $ov == eval:* ]]; then
      ck=$(ls -d "$prev"/checkpoints/ckpt-* | tail -1)
      # shellcheck disable=SC2086
      "$bin" eval "$ck" --nproc 2 ${ov#eval:} >"$tmp/e.out" 2>"$tmp/e.err" || { cat "$tmp/e.err" >&2; exit 1; }
      read -r loss a < <(acc_of_eval "$tmp/e.out")
      kind=eval
      shown="${acc[*]} ${ov#eval:}"
    else
      acc+=($ov)
      "$bin" train "$config" "${acc[@]}" train.seed="$seed" log.progress=off "log.dir=$dir" >"$tmp/t.out" 2>"$tmp/t.err" ||
        { cat "$tmp/t.err" >&2; exit 1; }
      read -r loss a < <(acc_of_metrics "$dir")
      prev=$dir
      kind=train
      shown="${acc[*]}"
    fi
    t1=$(date +%s.%N)
    r=$(printf '{"row": %d, "label": "%s", "seed": %s, "kind": "%s", "overrides": "%s", "test_loss": %s, "test_accuracy": %s, "wall_s": %.1f}' \
      "$i" "$label" "$seed" "$kind" "$shown" "$loss" "$a" "$(echo "$t1 - $t0" | bc)")
    echo "$r"
    results+="$sep$r"
    sep=","
  done
done
results+="]"

info=$("$bin" info --json)
/usr/bin/python3 - "$out" "$info" "$results" "$note" "$config" <<'PY'
import json, statistics, sys
out, info, runs, note, config = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
rows = []
print("\n%-32s %s %8s %8s %9s" % ("row", "accuracy by seed (%)", "mean", "delta", "wall s"))
prev = None
for i in sorted({r["row"] for r in runs}):
    rs = [r for r in runs if r["row"] == i]
    m = statistics.mean(100 * r["test_accuracy"] for r in rs)
    row = {"row": i, "label": rs[0]["label"], "kind": rs[0]["kind"], "overrides": rs[0]["overrides"],
           "accuracy_by_seed": [100 * r["test_accuracy"] for r in rs], "mean_accuracy": m,
           "delta_vs_previous": None if prev is None else m - prev, "mean_wall_s": statistics.mean(r["wall_s"] for r in rs)}
    rows.append(row)
    print("%-32s %-20s %8.2f %8s %9.1f" % (row["label"], " ".join("%.2f" % a for a in row["accuracy_by_seed"]), m,
          "-" if prev is None else "%+.2f" % (m - prev), row["mean_wall_s"]))
    prev = m
json.dump({"benchmark": "recipes-ablation", "config": config, "machine": info, "note": note, "table": rows,
           "runs": runs}, open(out, "w"), indent=1)
print("wrote", out)
PY
