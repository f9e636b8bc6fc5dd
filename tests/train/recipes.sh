#!/usr/bin/env bash
# The training recipes of issue 23 end to end with real ranks:
#   tta     eval.tta: flip: the evaluation (2 ranks in training, `ringtrain eval` with 1
#           and 3) gives PyTorch's loss and accuracy of the mean of model(x) and
#           model(x.flip(-1)) on the checkpoint's weights (torch_tta.py), and plain
#           evaluation gives PyTorch's model(x): a reference test
#   resume  ResNet on 2 ranks with Adadelta, label smoothing, random erasing (random
#           values), the weights' EMA (every 2 steps) and flip TTA: killed (kill -9 of the
#           launcher right after the checkpoint of step 10, mid-epoch) and resumed, it ends
#           bit for bit where the uninterrupted run does (both safetensors files); the
#           checkpoint's model.safetensors holds the moving average (not the raw weights,
#           which are train.safetensors' state.<p>.ema) and `ringtrain eval` of it gives the
#           training's final evaluation
#
#   tests/train/recipes.sh RINGTRAIN CASE
# Exit 77 (skipped) when Debian's Fashion-MNIST (or, for tta, torch) is missing.
set -u
# the test-only hooks (RINGTRAIN_TEST_*) act only with this switch (docs/testing.md)
export RINGTRAIN_TEST_HOOKS=1
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
# close A B: |A - B| <= 6e-5 (a loss printed with 4 decimals against one with 6 digits)
close() { /usr/bin/python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) > 6e-5)' "$1" "$2"; }
eval_of_line() { # the printed loss has 4 decimals: the metrics file has 6 digits
  sed -n 's/.*test loss \([0-9.]*\), accuracy \([0-9.]*\)%.*/\1 \2/p' "$1" | tail -1 |
    awk '{printf "%s %.4f\n", $1, $2 / 100}'
}

# same_run A B: the final checkpoints hold bitwise-identical tensors (both files)
. "$(dirname "$0")/../same_run.sh"

case $what in
resume)
  args=(model.arch=resnet18 model.width=4 data.train_subset=1024 data.test_subset=256 data.batch_size=32
        train.threads=1 train.epochs=2 log.progress=off dist.nproc=2 optim.name=adadelta optim.lr=1.0
        optim.schedule=step optim.interval=epoch optim.gamma=0.7 train.label_smoothing=0.1 data.erasing=0.5
        data.erasing_value=random train.ema_decay=0.9 train.ema_every=2 eval.tta=flip)
  "$bin" train "$tmp/c.yaml" "${args[@]}" "log.dir=$tmp/full" >"$tmp/full.out" 2>"$tmp/full.err" || fail "straight run"
  rc=0
  RINGTRAIN_TEST_KILL_AFTER_CKPT=10 "$bin" train "$tmp/c.yaml" "${args[@]}" checkpoint.every_steps=5 "log.dir=$tmp/k" \
    >"$tmp/k.out" 2>"$tmp/k.err" || rc=$?
  [ "$rc" -eq 137 ] || fail "the run ended with exit $rc, not killed after the checkpoint of step 10"
  "$bin" train "$tmp/c.yaml" "${args[@]}" checkpoint.every_steps=5 "log.dir=$tmp/k" >"$tmp/k2.out" 2>"$tmp/k2.err" ||
    fail "resume"
  grep -q "resuming from .*ckpt-000000010 " "$tmp/k2.out" || fail "did not resume from step 10: $(grep resuming "$tmp/k2.out")"
  same_run "$tmp/full" "$tmp/k" "killed after step 10"
  ck=$(ls -d "$tmp"/full/checkpoints/ckpt-* | tail -1)
  cmp -s "$ck/model.safetensors" "$tmp/full/model.safetensors" || fail "the run's model.safetensors is not its final checkpoint's"
  /usr/bin/python3 - "$ck" <<'PY' || fail "model.safetensors does not hold the moving average"
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: d[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
m, t = tensors(sys.argv[1] + "/model.safetensors"), tensors(sys.argv[1] + "/train.safetensors")
raw = {k[len("state."):-len(".ema")]: v for k, v in t.items() if k.endswith(".ema")}
assert raw and all(k in m for k in raw), "no state.<p>.ema tensors"
same = [k for k in raw if raw[k] == m[k]]
assert len(same) < len(raw) / 2, "%d of %d parameters equal the raw weights" % (len(same), len(raw))
PY
  read -r tl ta < <(eval_of_metrics "$tmp/full/metrics.jsonl")
  "$bin" eval "$ck" --nproc 1 >"$tmp/e.out" 2>"$tmp/e.err" || fail "eval of the final checkpoint"
  read -r el ea < <(eval_of_line "$tmp/e.out")
  close "$el" "$tl" && close "$ea" "$ta" ||
    fail "eval of the final checkpoint: loss $el accuracy $ea, the training's final evaluation said $tl $ta"
  # the environment over the checkpoint's config, the command line over both (rt_config_apply_env)
  RINGTRAIN_LOG_LEVEL=debug "$bin" eval "$ck" --nproc 1 >/dev/null 2>"$tmp/d.err" || fail "eval with RINGTRAIN_LOG_LEVEL=debug"
  grep -q '\] D ' "$tmp/d.err" || fail "RINGTRAIN_LOG_LEVEL=debug did not reach ringtrain eval of a checkpoint (no debug lines)"
  RINGTRAIN_LOG_LEVEL=debug "$bin" eval "$ck" --nproc 1 log.level=info >/dev/null 2>"$tmp/i.err" || fail "eval, log.level=info"
  ! grep -q '\] D ' "$tmp/i.err" || fail "log.level=info on the command line did not win over RINGTRAIN_LOG_LEVEL=debug"
  echo "ok: adadelta + label smoothing + random erasing + EMA + flip TTA resume bit for bit; model.safetensors holds the average"
  ;;
tta)
  /usr/bin/python3 -c 'import torch, torchvision' 2>/dev/null || { echo "SKIP: no torch/torchvision"; exit 77; }
  # torchvision's ResNet34 (width 64, ImageNet stem), four steps so BN statistics move and
  # the model is far from mirror-symmetric (flip TTA must change the loss well past the tolerances)
  args=(model.arch=resnet34 model.width=64 model.stem=imagenet data.train_subset=128 data.test_subset=100
        data.batch_size=32 train.epochs=1 train.threads=1 log.progress=off optim.lr=0.01 optim.momentum=0.9
        dist.nproc=2)
  "$bin" train "$tmp/c.yaml" "${args[@]}" eval.tta=flip "log.dir=$tmp/r" >"$tmp/r.out" 2>"$tmp/r.err" || fail "train"
  ck=$(ls -d "$tmp"/r/checkpoints/ckpt-* | tail -1)
  read -r tl ta < <(eval_of_metrics "$tmp/r/metrics.jsonl")
  # train.tta: the key's old name, still read as eval.tta
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
  # the mirror must move the loss by 10x what torch_tta.py tolerates for flip (1e-5
  # relative), else a TTA that ignored the mirror could pass
  /usr/bin/python3 -c 'import sys; a, b = map(float, sys.argv[1:]); sys.exit(abs(a - b) <= 1e-4 * a)' "$pl" "$tl" ||
    fail "flip TTA loss $tl is within 1e-4 of the plain loss $pl: the test cannot tell whether the mirror was used"
  for n in 1 3; do
    "$bin" eval "$ck" --nproc $n >"$tmp/e$n.out" 2>"$tmp/e$n.err" || fail "eval with $n ranks"
    read -r el ea < <(eval_of_line "$tmp/e$n.out")
    close "$el" "$tl" && close "$ea" "$ta" ||
      fail "eval with $n rank(s): loss $el accuracy $ea, training's evaluation said $tl $ta"
  done
  echo "ok: flip TTA equals PyTorch's mean of model(x) and model(x.flip(-1)), with 1, 2 and 3 ranks"
  ;;
*)
  fail "unknown case $what"
  ;;
esac
