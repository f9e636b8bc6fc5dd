#!/usr/bin/env bash
# before/after (issue 37): bench model and 2-rank training, interleaved rounds, one quiet run
# usage: bench/tools/before_after.sh BEFORE_BINARY AFTER_BINARY OUT_PREFIX   (ROUNDS=3)
# Not part of `make bench` (bench/run runs bench/*.sh only): it needs two builds.
set -euo pipefail
B=$1; A=$2; OUT=$3; ROUNDS=${ROUNDS:-3}
tmp=$(mktemp -d /tmp/rt-ab-XXXXXX)
printf 'model:\n  arch: resnet34\n' > "$tmp/c.yaml"
echo '[' > "$OUT.runs"; sep=""
for round in $(seq 1 "$ROUNDS"); do
  for tag in before after; do
    bin=$B; [ $tag = after ] && bin=$A
    "$bin" bench model --batch 64,128 --steps 10 --threads 2 --json 2>/dev/null | while IFS= read -r l; do
      printf '%s{"bench": "model", "build": "%s", "round": %d, "row": %s}\n' "$sep" "$tag" "$round" "$l"; sep=","; done >> "$OUT.runs.$tag.$round.model"
    dir=$tmp/$tag-$round
    "$bin" train "$tmp/c.yaml" data.batch_size=128 train.threads=1 --nproc 2 train.max_steps=23 train.eval_every=0 \
      data.test_subset=256 log.progress=off "log.dir=$dir" dist.transport=shm >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; exit 1; }
    /usr/bin/python3 - "$dir/metrics.jsonl" "$tag" "$round" >> "$OUT.runs.$tag.$round.train" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
s = [r for r in rows if r["kind"] == "step"][3:]
step = sum(r["step_ms"] for r in s) / len(s)
print(json.dumps({"bench": "train-2rank", "build": sys.argv[2], "round": int(sys.argv[3]), "global_batch": 128, "steps": len(s),
                  "step_ms": step, "images_per_s": 128 / (step / 1000.0)}))
PY
  done
done
rm -rf "$tmp"
