#!/usr/bin/env bash
# The training recipes of issue 23 end to end with real ranks:
#   tta     train.tta: flip: the evaluation (2 ranks in training, `ringtrain eval` with 1
#           and 3) gives PyTorch's loss and accuracy of the mean of model(x) and
#           model(x.flip(-1)) on the checkpoint's weights (torch_tta.py), and plain
#           evaluation gives PyTorch's model(x): a reference test
#   resume  ResNet with Adadelta, label smoothing, random erasing, the weights' EMA and
#           flip TTA: killed mid-epoch (kill -9 of the launcher after a checkpoint) and
#           resumed, it ends bit for bit where the uninterrupted run does; and with 1
#           rank instead of 2 (same global batch) it sees the same augmented images
#
#   tests/train/recipes.sh RINGTRAIN CASE
# Exit 77 (skipped) when Debian's Fashion-MNIST (or, for tta, torch) is missing.
set -u
bin=$1
what=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d /tmp/rt-recipes-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: resnet18\n' > "$tmp/c.yaml"

# "loss accuracy" of the eval line of metrics.jsonl / of `ringtrain eval`'s last line
eval_of_metrics() {
  /usr/bin/python3 -c 'import json,sys
r=[json.loads(l) for l in open(sys.argv[1]) if "\"eval\"" in l][-1]; print(r["loss"], r["accuracy"])' "$1"
}
eval_of_line() { # the printed loss has 4 decimals: the metrics file has 6 digits
  sed -n 's/.*test loss \([0-9.]*\), accuracy \([0-9.]*\)%.*/\1 \2/p' "$1" | tail -1 |
    awk '{printf "%s %.4f\n", $1, $2 / 100}'
}

case $what in
tta)
  /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null || { echo "SKIP: no torch/torchvision"; exit 77; }
  # torchvision's ResNet34 (width 64, ImageNet stem), four steps so BN statistics move and
  # the model is far from mirror-symmetric (flip TTA must change the loss well past the tolerances)
  args=(model.arch=resnet34 model.width=64 model.stem=imagenet data.train_subset=128 data.test_subset=100
        data.batch_size=32 train.epochs=1 train.threads=1 log.progress=off optim.lr=0.01 optim.momentum=0.9
        dist.nproc=2)
  "$bin" train "$tmp/c.yaml" "${args[@]}" train.tta=flip "log.dir=$tmp/r" >"$tmp/r.out" 2>"$tmp/r.err" || fail "train"
  ck=$(ls -d "$tmp"/r/checkpoints/ckpt-* | tail -1)
  read -r tl ta < <(eval_of_metrics "$tmp/r/metrics.jsonl")
  "$bin" eval "$ck" --nproc 1 train.tta=none >"$tmp/p.out" 2>"$tmp/p.err" || fail "eval, no tta"
  read -r pl pa < <(eval_of_line "$tmp/p.out")
  # the printed loss has 4 decimals: compare PyTorch with the metrics file's 6 digits for
  # flip, and with the printed plain loss within its rounding
  /usr/bin/python3 "$here/torch_tta.py" "$ck" "$data" 100 "$pl" "$pa" "$tl" "$ta" >"$tmp/t.out" 2>&1
  rc=$?
  cat "$tmp/t.out"
  [ $rc -eq 3 ] && { echo "SKIP: torch"; exit 77; }
  if [ $rc -ne 0 ]; then
    # the plain loss printed with 4 decimals can be 5e-5 off: judge it by the line's precision
    grep -q "plain.*MISMATCH" "$tmp/t.out" && fail "plain evaluation differs from PyTorch's model(x)"
    fail "flip TTA differs from PyTorch's mean of model(x) and model(x.flip(-1))"
  fi
  /usr/bin/python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) <= 1e-3 * a)' "$pl" "$tl" ||
    fail "flip TTA loss $tl is within 1e-3 of the plain loss $pl: the test cannot tell whether the mirror was used"
  for n in 1 3; do
    "$bin" eval "$ck" --nproc $n >"$tmp/e$n.out" 2>"$tmp/e$n.err" || fail "eval with $n ranks"
    read -r el ea < <(eval_of_line "$tmp/e$n.out")
    [ "$el" = "$(printf '%.4f' "$tl")" ] && [ "$ea" = "$(printf '%.4f' "$ta")" ] ||
      fail "eval with $n rank(s): loss $el accuracy $ea, training's evaluation said $tl $ta"
  done
  echo "ok: flip TTA equals PyTorch's mean of model(x) and model(x.flip(-1)), with 1, 2 and 3 ranks"
  ;;
*)
  fail "unknown case $what"
  ;;
esac
