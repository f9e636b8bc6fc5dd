#!/usr/bin/env bash
# The whole CUDA program end to end on emulated GPUs (issue 19; the emulated-GPU build,
# RINGTRAIN_CUDA=EMU): `ringtrain train` and `ringtrain eval` on the emulated CUDA
# runtime, cuDNN, cuBLAS and NCCL of tests/cuda_emu, compared with the CPU run of the
# same config.
#
#   tests/emu/train_emu.sh RINGTRAIN CASE
# CASE:
#   nccl    2 ranks on 2 GPUs (transport nccl), against the CPU run, random stream delays on
#   shared  2 ranks on 1 GPU (device buffers staged through pinned memory over shm),
#           bit for bit against the nccl run
#   three   3 ranks on 2 GPUs (ranks 0 and 2 share cuda:0: every rank must pick staging)
#   eval    ringtrain eval of a GPU checkpoint on the GPU and on the CPU
#   cross   a checkpoint written on GPUs resumed on the CPU, and the other way round
#   kill    kill -9 of one rank on NCCL: the launcher names it and the others stop
#   compress  dist.compress bf16 (issue 22, item 4): the Net on 2 GPUs (nccl) and on 1 GPU
#           (staging) bit for bit, the ranks compared every step; against the CPU run with
#           the same compression (20x closer to it than compression moves the CPU run)
#   syncbn  model.sync_bn (the statistics' and the backward's all-reduces on the model's
#           stream): the ResNet on 2 GPUs (nccl, random stream delays, the step captured in
#           CUDA graphs) against the CPU's 2 synchronised ranks, within the ResNet's
#           tolerance; 2 ranks on 1 GPU (staging) bit for bit against the nccl run
#   syncs   host synchronisations per training step in steady state
#   nonfinite  a NaN in one rank's batch: every rank names that rank; skipped, GPU = CPU
#   recipes the training recipes of issue 23 on 2 GPUs against the CPU: Net with Adadelta
#           (its CUDA kernel), StepLR, the weights' moving average (the optimizer's EMA and
#           swap kernels) and flip TTA (the mirrored batch through the device), within the
#           Net's tolerance; ResNet with label smoothing (the smoothed loss kernel) and random
#           erasing as well, over 2 steps (the first EMA update, a TTA evaluation) within the
#           same tolerance. Longer runs drift by rounding alone (deterministic run to run):
#           the Net with erasing added 2.8e-4 apart in epoch 2, the ResNet 1.25e-5 at step 4
#           where the CPU runs with 1 or 2 threads or im2col agree to 6 digits (the GPU's
#           batch norm rounds differently: the im2col reference of the nccl case would be 0)
#
# Tolerance against the CPU (compare_runs): the GPU run computes the same steps with other
# summation orders inside convolutions, batch norm, GEMMs and reductions. The tutorial Net
# is well conditioned: its step losses agree to 1e-5 relative and its parameters to 1e-4
# of each tensor's largest value, over whole epochs (measured: equal losses, < 1e-5). The
# small ResNet (batch norm over few samples) amplifies rounding so fast that two CPU runs
# differing only in their thread count drift 1% apart in 3 steps; it is compared over its
# first 4 steps against that drift: the GPU may be at most 4x as far from the CPU run as
# second CPU run with the other convolution implementation (RINGTRAIN_CONV=im2col) is,
# plus 1e-5.
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
# the test-only hooks (RINGTRAIN_TEST_*) act only with this switch (docs/testing.md)
export RINGTRAIN_TEST_HOOKS=1
bin=$1
what=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing (scripts/install-deps test installs it)"; exit 77; }
tmp=$(mktemp -d /tmp/rt-emu-train-XXXXXX)
trap 'pkill -9 -f "$tmp" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done; exit 1; }
printf 'model:\n  arch: net\n' > "$tmp/c.yaml"
export RINGTRAIN_EMU_GPUS=${RINGTRAIN_EMU_GPUS:-2}
# a ResNet (batch norm through cuDNN, buffers broadcast before eval; 4 steps) and the
# tutorial Net (dropout, cuBLAS linear layers, log-softmax + NLL kernels; whole epochs)
resnet=(model.arch=resnet18 model.width=4 model.stem=cifar data.train_subset=256 data.test_subset=128
        data.batch_size=32 train.threads=1 train.max_steps=4 log.progress=off log.every_steps=1 optim.momentum=0.9
        dist.timeout_s=120)
net=(model.arch=net data.train_subset=256 data.test_subset=128 data.batch_size=32 train.threads=1 train.epochs=2
     log.progress=off log.every_steps=1 optim.momentum=0.9 dist.timeout_s=120)

# train NAME ARGS...: a run into $tmp/NAME (fails the test when it fails)
train() {
  local name=$1; shift
  "$bin" train "$tmp/c.yaml" "$@" "log.dir=$tmp/$name" >"$tmp/$name.out" 2>"$tmp/$name.err" ||
    fail "$name: ringtrain train exited $?"
}

# compare_runs A B LABEL [REF]: A against B. Without REF: step losses of metrics.jsonl
# to 1e-5 relative, the final model.safetensors to 1e-4 of each tensor's largest value;
# "bit" instead of REF: bit for bit. With REF (a second run like B, other CPU convolutions): A
# may be at most 4x as far from B as REF is, plus 1e-5 (loss: relative; parameters:
# absolute over the model's largest value).
compare_runs() {
  /usr/bin/python3 - "$tmp/$1" "$tmp/$2" "${4:-}" "$tmp/${4:-none}" <<'PY' || fail "$3"
import glob, json, struct, sys
a, b, mode, ref = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
def losses(d):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(d + "/metrics.jsonl")) if r.get("kind") == "step"]
def tensors(d):
    p = sorted(glob.glob(d + "/checkpoints/ckpt-*/model.safetensors"))[-1]
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); body = raw[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__" or k.endswith("num_batches_tracked"): continue
        o0, o1 = v["data_offsets"]
        out[k] = struct.unpack("<%df" % ((o1 - o0) // 4), body[o0:o1])
    return out
def loss_diff(x, y):
    assert [s for s, _ in x] == [s for s, _ in y] and x, "steps differ: %s vs %s" % (x[:3], y[:3])
    return max(abs(p - q) / max(abs(p), abs(q)) for (_, p), (_, q) in zip(x, y))
def param_diffs(x, y):  # per tensor: max |difference| / the tensor's largest value; and over the model
    assert x.keys() == y.keys()
    top = max(max(abs(v) for v in t) for t in x.values())
    per = {k: max(abs(p - q) for p, q in zip(x[k], y[k])) / max([abs(v) for v in x[k]] + [1e-30]) for k in x}
    return per, max(max(abs(p - q) for p, q in zip(x[k], y[k])) for k in x) / top
la, lb, ta, tb = losses(a), losses(b), tensors(a), tensors(b)
dl = loss_diff(la, lb)
per, dp = param_diffs(ta, tb)
if mode == "bit":
    bad = [k for k in ta if ta[k] != tb[k]]
    assert dl == 0 and not bad, "not bit for bit: loss %g, tensors %s" % (dl, bad[:3])
elif mode:
    rl = loss_diff(lb, losses(ref)); _, rp = param_diffs(tb, tensors(ref))
    print("reference drift (a second CPU run, other convolution implementation): loss %.3g, parameters %.3g" % (rl, rp))
    assert dl <= 4 * rl + 1e-5, "losses: %.3g apart, the reference drift is %.3g" % (dl, rl)
    assert dp <= 4 * rp + 1e-5, "parameters: %.3g apart, the reference drift is %.3g" % (dp, rp)
else:
    assert dl <= 1e-5, "losses %.3g apart (tolerance 1e-5)" % dl
    k = max(per, key=per.get)
    assert per[k] <= 1e-4, "%s: %.3g of its largest value apart (tolerance 1e-4)" % (k, per[k])
print("compared %d steps, %d tensors: losses %.3g apart, parameters %.3g (worst tensor %s: %.3g)" %
      (len(la), len(ta), dl, dp, max(per, key=per.get), max(per.values())))
PY
}

final_acc() { grep -o 'test accuracy [0-9.]*%' "$tmp/$1.out" | tail -1; }

case $what in
recipes)
  rec=(optim.name=adadelta optim.lr=1.0 optim.momentum=0 optim.schedule=step optim.interval=epoch optim.gamma=0.7
       train.ema_decay=0.9 train.ema_every=2 eval.tta=flip)
  train net-cpu "${net[@]}" "${rec[@]}" train.device=cpu dist.nproc=2
  train net-gpu "${net[@]}" "${rec[@]}" train.device=cuda dist.nproc=2
  compare_runs net-gpu net-cpu "Net with the recipes: 2 emulated GPUs differ from the CPU run"
  rec+=(train.label_smoothing=0.1 data.erasing=0.5 data.erasing_value=random)
  train res-cpu "${resnet[@]}" "${rec[@]}" train.max_steps=2 train.device=cpu dist.nproc=2
  train res-gpu "${resnet[@]}" "${rec[@]}" train.max_steps=2 train.device=cuda dist.nproc=2
  compare_runs res-gpu res-cpu "ResNet with the recipes: 2 emulated GPUs differ from the CPU run"
  echo "ok: the recipes on 2 emulated GPUs = the CPU run (Net $(final_acc net-gpu) vs $(final_acc net-cpu))"
  ;;
nccl)
  train net-cpu "${net[@]}" train.device=cpu dist.nproc=2
  RINGTRAIN_LOG_LEVEL=debug RINGTRAIN_EMU_DELAY_US=300 train net-gpu "${net[@]}" train.device=cuda dist.nproc=2
  grep -q "transport nccl" "$tmp/net-gpu.err" || fail "the GPU run did not use the nccl transport"
  compare_runs net-gpu net-cpu "Net: 2 ranks on 2 emulated GPUs differ from the CPU run"
  train res-cpu "${resnet[@]}" train.device=cpu dist.nproc=2
  RINGTRAIN_CONV=im2col train res-cpu2 "${resnet[@]}" train.device=cpu dist.nproc=2
  train res-gpu "${resnet[@]}" train.device=cuda dist.nproc=2
  compare_runs res-gpu res-cpu "ResNet: 2 ranks on 2 emulated GPUs differ from the CPU run" res-cpu2
  echo "ok: 2 ranks on 2 GPUs over NCCL = the CPU run ($(final_acc net-gpu) vs $(final_acc net-cpu))"
  ;;
bf16)
  # The bf16 activation format (issue 41): activations and their gradients stored in bf16
  # NHWC on the GPUs; the CPU's oracle (RINGTRAIN_ACT_LAYOUT=oracle) stores them rounded to
  # bf16 at the same points, so the runs differ only in summation orders, as a second CPU
  # run with the other convolution implementation (im2col) differs from the first: the
  # reference drift compare_runs bounds them by.
  b=(train.precision=bf16)
  rb=("${resnet[@]}" "${b[@]}" train.max_steps=2) # 2 steps: tiny per-rank batches make later steps chaotic
  RINGTRAIN_ACT_LAYOUT=oracle train res-cpu "${rb[@]}" train.device=cpu dist.nproc=2
  RINGTRAIN_ACT_LAYOUT=oracle RINGTRAIN_CONV=im2col train res-cpu2 "${rb[@]}" train.device=cpu \
    dist.nproc=2
  RINGTRAIN_LOG_LEVEL=debug train res-gpu "${rb[@]}" train.device=cuda dist.nproc=2
  grep -q "transport nccl" "$tmp/res-gpu.err" || fail "the GPU run did not use the nccl transport"
  compare_runs res-gpu res-cpu "ResNet bf16: 2 ranks on 2 emulated GPUs differ from the CPU oracle" res-cpu2
  CUDA_VISIBLE_DEVICES=0 train res-gpu1 "${rb[@]}" train.device=cuda dist.nproc=2
  compare_runs res-gpu1 res-gpu "ResNet bf16: 2 ranks on 1 GPU differ from 2 ranks on 2 GPUs" bit
  RINGTRAIN_ACT_LAYOUT=oracle train res-cpu3 "${rb[@]}" data.batch_size=30 train.device=cpu dist.nproc=3
  RINGTRAIN_ACT_LAYOUT=oracle RINGTRAIN_CONV=im2col train res-cpu3b "${rb[@]}" data.batch_size=30 \
    train.device=cpu dist.nproc=3
  train res-gpu3 "${rb[@]}" data.batch_size=30 train.device=cuda dist.nproc=3
  compare_runs res-gpu3 res-cpu3 "ResNet bf16: 3 ranks on 2 GPUs differ from the CPU oracle" res-cpu3b
  # Net: channels 10 and 20, the flatten at its head converts bf16 NHWC into fp32 features
  RINGTRAIN_ACT_LAYOUT=oracle train net-cpu "${net[@]}" "${b[@]}" train.epochs=1 train.device=cpu dist.nproc=2
  RINGTRAIN_ACT_LAYOUT=oracle RINGTRAIN_CONV=im2col train net-cpu2 "${net[@]}" "${b[@]}" train.epochs=1 \
    train.device=cpu dist.nproc=2
  train net-gpu "${net[@]}" "${b[@]}" train.epochs=1 train.device=cuda dist.nproc=2
  compare_runs net-gpu net-cpu "Net bf16: 2 emulated GPUs differ from the CPU oracle" net-cpu2
  # a bf16 GPU checkpoint resumes in fp32 on the CPU, and a CPU fp32 one in bf16 on the GPUs
  train g2c "${net[@]}" "${b[@]}" train.device=cuda dist.nproc=2 checkpoint.every_epochs=1 train.epochs=1
  train g2c "${net[@]}" train.device=cpu dist.nproc=2 checkpoint.every_epochs=1
  grep -q "resuming from" "$tmp/g2c.out" || fail "bf16 GPU -> fp32 CPU: did not resume"
  train c2g "${net[@]}" train.device=cpu dist.nproc=2 checkpoint.every_epochs=1 train.epochs=1
  train c2g "${net[@]}" "${b[@]}" train.device=cuda dist.nproc=2 checkpoint.every_epochs=1
  grep -q "resuming from" "$tmp/c2g.out" || fail "fp32 CPU -> bf16 GPU: did not resume"
  for r in g2c c2g; do
    /usr/bin/python3 -c "
import json, math, sys
l = [r['loss'] for r in map(json.loads, open(sys.argv[1])) if r.get('kind') == 'step']
assert len(l) >= 16 and all(math.isfinite(x) for x in l) and l[-1] < l[0], l
" "$tmp/$r/metrics.jsonl" || fail "$r: the resumed run's losses are not finite or did not fall"
  done
  echo "ok: bf16 NHWC on 2 GPUs (nccl), 1 GPU (staging) and 3 ranks on 2 GPUs = the CPU oracle; checkpoints cross bf16 GPU <-> fp32 CPU ($(final_acc g2c), $(final_acc c2g))"
  ;;
syncbn)
  sb=("${resnet[@]}" model.sync_bn=true dist.nproc=2)
  train sb-cpu "${sb[@]}" train.device=cpu
  RINGTRAIN_CONV=im2col train sb-cpu2 "${sb[@]}" train.device=cpu
  RINGTRAIN_LOG_LEVEL=debug RINGTRAIN_EMU_DELAY_US=300 train sb-gpu "${sb[@]}" train.device=cuda
  grep -q "transport nccl" "$tmp/sb-gpu.err" || fail "the GPU run did not use the nccl transport"
  grep -q "runs as CUDA graphs" "$tmp/sb-gpu.out" "$tmp/sb-gpu.err" || fail "the sync_bn step was not captured"
  compare_runs sb-gpu sb-cpu "ResNet with sync_bn: 2 emulated GPUs differ from the CPU run" sb-cpu2
  CUDA_VISIBLE_DEVICES=0 train sb-gpu1 "${sb[@]}" train.device=cuda
  compare_runs sb-gpu1 sb-gpu "ResNet with sync_bn: 2 ranks on 1 GPU differ from 2 ranks on 2 GPUs" bit
  echo "ok: model.sync_bn on 2 GPUs over NCCL (captured) = the CPU run; staging = nccl bit for bit"
  ;;
shared)
  train gpu2 "${net[@]}" train.device=cuda dist.nproc=2
  CUDA_VISIBLE_DEVICES=0 RINGTRAIN_LOG_LEVEL=debug RINGTRAIN_EMU_DELAY_US=300 train gpu1 "${net[@]}" \
    train.device=cuda dist.nproc=2
  grep -q "transport shm" "$tmp/gpu1.err" || fail "2 ranks on 1 GPU did not stage over shm"
  compare_runs gpu1 gpu2 "2 ranks on 1 GPU (staging) differ from 2 ranks on 2 GPUs (nccl)" bit
  train r2 "${resnet[@]}" train.device=cuda dist.nproc=2
  CUDA_VISIBLE_DEVICES=0 train r1 "${resnet[@]}" train.device=cuda dist.nproc=2
  compare_runs r1 r2 "ResNet: 2 ranks on 1 GPU differ from 2 ranks on 2 GPUs" bit
  echo "ok: 2 ranks on 1 GPU (staging) = 2 ranks on 2 GPUs (nccl), bit for bit"
  ;;
compress)
  # 10 KiB buckets (the first one too): several per step, the small ones in the one-round form
  c=("${net[@]}" train.epochs=1 dist.nproc=2 dist.compress=bf16 dist.bucket_mb=0.01 dist.first_bucket_mb=0.01
    dist.check_sync_every=1)
  train cpu "${c[@]}" train.device=cpu
  train cpuf "${c[@]}" train.device=cpu dist.compress=none
  RINGTRAIN_LOG_LEVEL=debug RINGTRAIN_EMU_DELAY_US=300 train gpu2 "${c[@]}" train.device=cuda
  grep -q "transport nccl" "$tmp/gpu2.err" || fail "the GPU run did not use the nccl transport"
  CUDA_VISIBLE_DEVICES=0 RINGTRAIN_LOG_LEVEL=debug train gpu1 "${c[@]}" train.device=cuda
  grep -q "transport shm" "$tmp/gpu1.err" || fail "2 ranks on 1 GPU did not stage over shm"
  compare_runs gpu1 gpu2 "compressed: 2 ranks on 1 GPU (staging) differ from 2 ranks on 2 GPUs (nccl)" bit
  # Against the CPU: the gradients differ in their last fp32 bits (cuBLAS and cuDNN sum in
  # other orders), and where that moves a value across a bf16 rounding boundary it moves by
  # a whole bf16 ulp (2^-8 relative): measured 1e-3 of a tensor's largest value after 8
  # steps, against 3e-7 uncompressed. The GPU run must be at least 20x closer to the CPU's
  # compressed run than compression itself moves the CPU run (measured 0.09: 86x), and its
  # step losses agree to 1e-4 relative.
  /usr/bin/python3 - "$tmp" <<'PY' || fail "compressed: the GPU run is not the CPU's compressed run"
import array, glob, json, struct, sys
t = sys.argv[1]
def tensors(d):
    p = sorted(glob.glob(t + "/" + d + "/checkpoints/ckpt-*/model.safetensors"))[-1]
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); body = raw[8 + n:]
    out = {}
    for k, v in h.items():
        if k == "__metadata__" or k.endswith("num_batches_tracked"): continue
        a = array.array("f"); a.frombytes(body[v["data_offsets"][0]:v["data_offsets"][1]]); out[k] = a
    return out
def apart(x, y):
    a, b = tensors(x), tensors(y)
    assert a.keys() == b.keys()
    return max(max(abs(p - q) for p, q in zip(a[k], b[k])) / max(max(abs(q) for q in b[k]), 1e-30) for k in a)
def losses(d):
    return [r["loss"] for r in map(json.loads, open(t + "/" + d + "/metrics.jsonl")) if r.get("kind") == "step"]
lg, lc = losses("gpu2"), losses("cpu")
assert len(lg) == len(lc) > 0, (len(lg), len(lc))
dl = max(abs(a - b) / max(abs(b), 1e-30) for a, b in zip(lg, lc))
gc, cf = apart("gpu2", "cpu"), apart("cpu", "cpuf")
print("GPU vs CPU, both compressed: losses %.3g apart, parameters %.3g; compression moves the CPU run %.3g" % (dl, gc, cf))
assert dl <= 1e-4, "losses %.3g apart" % dl
assert gc * 20 <= cf, "parameters %.3g apart, not 20x below compression's own %.3g" % (gc, cf)
PY
  echo "ok: dist.compress bf16 on 2 GPUs (nccl) = on 1 GPU (staging), and the CPU's compressed run ($(final_acc gpu2) vs $(final_acc cpu))"
  ;;
three)
  train cpu3 "${net[@]}" data.batch_size=30 train.device=cpu dist.nproc=3
  train gpu3 "${net[@]}" data.batch_size=30 train.device=cuda dist.nproc=3
  compare_runs gpu3 cpu3 "3 ranks on 2 GPUs differ from the CPU run"
  echo "ok: 3 ranks on 2 GPUs = the CPU run ($(final_acc gpu3) vs $(final_acc cpu3))"
  ;;
eval)
  train gpu "${net[@]}" train.device=cuda dist.nproc=2
  ck=$(ls -d "$tmp"/gpu/checkpoints/ckpt-* | tail -1)
  "$bin" eval "$ck" --nproc 2 train.device=cuda "data.test_subset=128" >"$tmp/eval-gpu.out" 2>"$tmp/eval-gpu.err" || fail "eval on GPUs"
  "$bin" eval "$ck" --nproc 2 train.device=cpu "data.test_subset=128" >"$tmp/eval-cpu.out" 2>"$tmp/eval-cpu.err" || fail "eval on the CPU"
  /usr/bin/python3 - "$tmp/eval-gpu.out" "$tmp/eval-cpu.out" <<'PY' || fail "ringtrain eval on the GPU and on the CPU disagree"
import re, sys
def get(p):
    t = open(p).read()
    l = re.search(r"loss ([0-9.]+)", t); a = re.search(r"accuracy ([0-9.]+)%", t)
    assert l and a, "no loss/accuracy in %s: %s" % (p, t[-400:])
    return float(l.group(1)), float(a.group(1))
(lg, ag), (lc, ac) = get(sys.argv[1]), get(sys.argv[2])
assert abs(lg - lc) <= 1e-4 * max(lg, lc) and ag == ac, (lg, ag, lc, ac)
print("eval: GPU loss %g acc %g%%, CPU loss %g acc %g%%" % (lg, ag, lc, ac))
PY
  echo "ok: ringtrain eval of a GPU checkpoint on GPUs = on the CPU"
  ;;
cross)
  # reference: the CPU run straight through; GPU for the first epoch then CPU, and the
  # other way round (a checkpoint at every epoch's end)
  train ref "${net[@]}" train.device=cpu dist.nproc=2 checkpoint.every_epochs=1
  train g2c "${net[@]}" train.device=cuda dist.nproc=2 checkpoint.every_epochs=1 train.epochs=1
  train g2c "${net[@]}" train.device=cpu dist.nproc=2 checkpoint.every_epochs=1
  grep -q "resuming from" "$tmp/g2c.out" || fail "GPU -> CPU: did not resume"
  compare_runs g2c ref "a GPU checkpoint resumed on the CPU differs from the CPU run"
  train c2g "${net[@]}" train.device=cpu dist.nproc=2 checkpoint.every_epochs=1 train.epochs=1
  train c2g "${net[@]}" train.device=cuda dist.nproc=2 checkpoint.every_epochs=1
  grep -q "resuming from" "$tmp/c2g.out" || fail "CPU -> GPU: did not resume"
  compare_runs c2g ref "a CPU checkpoint resumed on GPUs differs from the CPU run"
  echo "ok: checkpoints move between GPU and CPU runs"
  ;;
kill)
  # rank 1 SIGKILLs itself right before its step 3 (RINGTRAIN_TEST_SIGNAL_AT, trainer.c): an
  # exact point in mid-run, where polling metrics.jsonl and then killing raced with it
  rc=0
  RINGTRAIN_TEST_SIGNAL_AT=step:3:self:1:KILL "$bin" train "$tmp/c.yaml" "${net[@]}" train.device=cuda dist.nproc=2 \
    data.train_subset=0 train.epochs=50 dist.timeout_s=30 "log.dir=$tmp/run" >"$tmp/kill.out" 2>"$tmp/kill.err" || rc=$?
  [ "$rc" -ne 0 ] || fail "launcher exited 0 after a rank was killed"
  grep -q "rank 1 was killed by SIGKILL" "$tmp/kill.err" || fail "the launcher does not name rank 1 and SIGKILL"
  # the launcher reaped its ranks before it returned; wait for any other process of this
  # run to be gone, failing only after 30 s (one left running would stay forever)
  for _ in $(seq 300); do pgrep -f "$tmp" >/dev/null || break; sleep 0.1; done
  ! pgrep -af "$tmp" || fail "processes left running (30 s after the run ended)"
  echo "ok: a killed rank on NCCL stops the job, named"
  ;;
nonfinite)
  # a NaN in rank 1's batch at step 3 (RINGTRAIN_TEST_NAN_AT): on the GPU path too every
  # rank names rank 1 (its own loss read back, its own gradients by backward once more and
  # their norm on the device, the verdict all-reduced through the device)
  rc=0
  RINGTRAIN_TEST_NAN_AT=1:3 "$bin" train "$tmp/c.yaml" "${net[@]}" train.device=cuda dist.nproc=2 "log.dir=$tmp/nf" \
    >"$tmp/nf.out" 2>"$tmp/nf.err" || rc=$?
  [ "$rc" -eq 1 ] || fail "non-finite gradient on rank 1: exit $rc, expected 1"
  grep -q "step 3 (epoch 0): non-finite gradient (.*) on rank 1 (of 2 rank(s), the only one whose own loss or gradients were non-finite)" "$tmp/nf.err" ||
    fail "the error does not name rank 1"
  ! grep -q "non-finite.* on rank 0" "$tmp/nf.err" || fail "a rank names rank 0"
  # skipped instead: the GPU run still equals the CPU run (the step skipped in both)
  RINGTRAIN_TEST_NAN_AT=1:3 train nf-cpu "${net[@]}" train.device=cpu dist.nproc=2 train.skip_nonfinite=true
  RINGTRAIN_TEST_NAN_AT=1:3 train nf-gpu "${net[@]}" train.device=cuda dist.nproc=2 train.skip_nonfinite=true
  grep -q "step 3: non-finite gradient on rank 1 " "$tmp/nf-gpu.err" || fail "the skipped step's warning does not name rank 1"
  compare_runs nf-gpu nf-cpu "a skipped non-finite step: the GPU run differs from the CPU run"
  echo "ok: a non-finite gradient on emulated GPUs names the rank that produced it"
  ;;
syncs)
  # host synchronisations per step: two runs that differ only in the number of steps,
  # both inside the first epoch (an epoch's end adds its own fixed work), on 2 ranks
  for n in 8 16; do
    RINGTRAIN_EMU_STATS="$tmp/stats-$n.jsonl" train "s$n" "${resnet[@]}" data.train_subset=1024 train.device=cuda \
      dist.nproc=2 train.max_steps=$n train.eval_every=0 checkpoint.every_epochs=0 dist.check_sync_every=0
  done
  /usr/bin/python3 - "$tmp/stats-8.jsonl" "$tmp/stats-16.jsonl" <<'PY' || fail "more than one host synchronisation per training step"
import json, sys
def syncs(p):  # per rank process (the ones that launched kernels), highest first
    return sorted((r["host_syncs"] for r in map(json.loads, open(p)) if r["launches"] > 0), reverse=True)
a, b = syncs(sys.argv[1]), syncs(sys.argv[2])
assert len(a) == len(b) == 2, (a, b)
per = max(y - x for x, y in zip(a, b)) / 8.0
print("host synchronisations per rank: %s in 8 steps, %s in 16: %.2f per step" % (a, b, per))
assert per <= 1.0, per
PY
  ;;
*) echo "usage: $0 RINGTRAIN nccl|shared|three|eval|cross|kill|syncs|nonfinite|recipes|compress" >&2; exit 2 ;;
esac
