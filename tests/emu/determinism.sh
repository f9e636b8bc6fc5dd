#!/usr/bin/env bash
# train.deterministic on emulated GPUs (issue 19, defect 4): the emulated cuDNN's Find
# offers several algorithms, one of them non-deterministic (its results really differ
# in the last bits from call to call) and one hungry for workspace.
#
#   tests/emu/determinism.sh RINGTRAIN [one|ranks|timed]
#
# Shows, on 1 emulated GPU (RINGTRAIN_EMU_GPUS=1), with `one` (the default) 1-2 and 4-6,
# with `ranks` 3, with `timed` 7-10:
#   1. deterministic (the default) twice: identical final checkpoints, and the checkpoint
#      records the choice (cudnn.deterministic: true, cudnn.conv_algos);
#   2. stopped at step 5 (train.max_steps) and resumed to the end: identical to the
#      uninterrupted run, and the resume took the checkpoint's algorithms;
#   3. the same with 2 ranks sharing the GPU (rank 0's choice reaches rank 1);
#   4. a recorded algorithm this cuDNN does not know is an error naming it;
#   5. train.deterministic=false: the checkpoint records what was chosen (maybe the
#      non-deterministic algorithm) and says it was not a deterministic choice; a
#      deterministic resume of it searches afresh and says so;
#   6. a GPU checkpoint resumes on the CPU (the record is ignored).
# train.cudnn_benchmark (issue 40), with the emulated Find measuring forward
# IMPLICIT_GEMM (0) and the non-deterministic backward-filter ALGO_0 fastest
# (RINGTRAIN_EMU_CUDNN_FAST, no jitter), where the heuristics rank forward 1 first:
#   7. the default (heuristic) measures nothing: no forward 0 recorded;
#   8. timed, deterministic: forward 0 everywhere and backward filter 1, never the faster
#      non-deterministic 0; the checkpoint says cudnn.benchmark: true;
#   9. stopped at step 5 and resumed while Find would measure forward GEMM (2) fastest:
#      the resume takes the record and times nothing, equal to the uninterrupted run;
#  10. 2 ranks on 2 GPUs (NCCL), only GPU 0 measuring forward 0 fastest: rank 1 takes rank
#      0's choice (given, not timed), so the run equals one where both GPUs measure alike.
# No timing windows: runs stop through train.max_steps and resume with more steps. (With
# checkpoint.every_steps at the same step: the end-of-run checkpoint of a max_steps stop
# mid-epoch records the epoch as finished, so a resume from it skips the epoch's rest.)
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
bin=$1
what=${2:-one}
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
export RINGTRAIN_EMU_GPUS=1
tmp=$(mktemp -d /tmp/rt-determinism-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
printf 'model:\n  arch: resnet18\n' > "$tmp/c.yaml"
# 256 samples / 32 = 8 steps per epoch, 16 in all; the stop at step 5 is mid-epoch
args=(model.arch=resnet18 model.width=4 data.train_subset=256 data.test_subset=64 data.batch_size=32
      train.epochs=2 train.device=cuda train.threads=1 log.progress=off dist.nproc=1 optim.momentum=0.9)

train() { # name extra-args...: log.dir=$tmp/name
  local name=$1; shift
  "$bin" train "$tmp/c.yaml" "${args[@]}" "$@" "log.dir=$tmp/$name" >>"$tmp/$name.out" 2>>"$tmp/$name.err"
}

# same_run A B WHAT: the newest checkpoints of two runs hold bitwise-identical tensors
# (parameters, buffers, optimizer state) and identical model files (as tests/train/resume.sh)
same_run() {
  local a b
  a=$(ls -d "$tmp/$1"/checkpoints/ckpt-* | tail -1); b=$(ls -d "$tmp/$2"/checkpoints/ckpt-* | tail -1)
  [ "$(basename "$a")" = "$(basename "$b")" ] || fail "$3: final checkpoints differ: $a vs $b"
  /usr/bin/python3 - "$a" "$b" <<'PY' || fail "$3: the tensors differ"
import json, struct, sys
def tensors(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n]); d = b[8 + n:]
    return {k: d[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items() if k != "__metadata__"}
for f in ("model.safetensors", "train.safetensors"):
    x, y = tensors(sys.argv[1] + "/" + f), tensors(sys.argv[2] + "/" + f)
    assert x.keys() == y.keys(), f
    bad = [k for k in x if x[k] != y[k]]
    assert not bad, "%s: %d tensors differ, e.g. %s" % (f, len(bad), bad[:3])
PY
  cmp -s "$a/model.safetensors" "$b/model.safetensors" || fail "$3: model.safetensors differ"
}

# meta CKPT_DIR KEY: a train.safetensors metadata value ("<absent>" when missing)
meta() {
  /usr/bin/python3 - "$1/train.safetensors" "$2" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read(); n = struct.unpack("<Q", b[:8])[0]
print(json.loads(b[8:8 + n]).get("__metadata__", {}).get(sys.argv[2], "<absent>"))
PY
}

# set_meta CKPT_DIR KEY VALUE: rewrite one metadata value (the crc32s cover tensor data
# only) and seal the metadata's own checksum again, as the writer would (a test of what the
# loader makes of the value, not of corruption)
set_meta() {
  /usr/bin/python3 "$(dirname "$0")/../train/ckpt_meta_edit.py" "$1/train.safetensors" --seal "$2=$3"
}

newest() { ls -d "$tmp/$1"/checkpoints/ckpt-* | tail -1; }

if [ "$what" = ranks ]; then
  # 3. two ranks on the one GPU (staging through host memory): rank 1 runs rank 0's
  #    choice (broadcast), so rank 0's record is every rank's and the resume is exact
  RINGTRAIN_LOG_LEVEL=debug train two-a dist.nproc=2 || fail "2 ranks"
  grep -q "rank 1\] D conv2d .*: given fwd algo" "$tmp/two-a.err" || fail "rank 1 did not take rank 0's algorithms"
  ! grep -q "rank 1\] D conv2d .*(heuristic, deterministic): fwd algo" "$tmp/two-a.err" || fail "rank 1 chose its own algorithms"
  train two-b dist.nproc=2 || fail "2 ranks, again"
  same_run two-a two-b "two deterministic 2-rank runs"
  train two-r dist.nproc=2 train.max_steps=5 checkpoint.every_steps=5 || fail "2 ranks to step 5"
  train two-r dist.nproc=2 || fail "2 ranks, resume"
  grep -q "the convolution algorithms of .*ckpt-000000005" "$tmp/two-r.out" || fail "the resume did not take the recorded algorithms"
  same_run two-a two-r "2 ranks, resumed at step 5"
  echo "ok: 2 ranks on 1 emulated GPU: identical runs, exact resume"
  exit 0
fi
# entries CKPT_DIR: the recorded choice, one convolution shape a line
entries() { meta "$1" cudnn.conv_algos | sed 's/; /\n/g'; }

if [ "$what" = timed ]; then
  export RINGTRAIN_EMU_CUDNN_JITTER=0
  fast=fwd:0,filter:0
  # 7. heuristic: the measurement does not matter
  RINGTRAIN_EMU_CUDNN_FAST=$fast train heur train.max_steps=2 checkpoint.every_steps=2 || fail "heuristic run"
  ck=$(newest heur)
  [ "$(meta "$ck" cudnn.benchmark)" = false ] || fail "cudnn.benchmark is '$(meta "$ck" cudnn.benchmark)', expected false"
  ! entries "$ck" | grep -q "fwd=0/" || fail "the heuristic choice took the measured fastest: $(meta "$ck" cudnn.conv_algos)"
  echo "ok: train.cudnn_benchmark=false measures nothing: $(meta "$ck" cudnn.conv_algos)"
  # 8. timed among the deterministic algorithms
  RINGTRAIN_EMU_CUDNN_FAST=$fast train tim train.cudnn_benchmark=true || fail "timed run"
  ck=$(newest tim)
  [ "$(meta "$ck" cudnn.benchmark)" = true ] || fail "cudnn.benchmark is '$(meta "$ck" cudnn.benchmark)', expected true"
  [ "$(meta "$ck" cudnn.deterministic)" = true ] || fail "cudnn.deterministic is '$(meta "$ck" cudnn.deterministic)'"
  n=$(entries "$ck" | wc -l)
  [ "$n" -gt 0 ] && [ "$(entries "$ck" | grep -c " fwd=0/.* filter=1/")" = "$n" ] ||
    fail "timed deterministic choice: expected forward 0 and backward filter 1 for every shape: $(meta "$ck" cudnn.conv_algos)"
  grep -q "timed the convolution algorithms of $n shapes (train.cudnn_benchmark): another fresh run may" "$tmp/tim.out" ||
    fail "the timed run did not say that it timed its choice"
  ! grep -q "timed the convolution algorithms" "$tmp/heur.out" || fail "the heuristic run says it timed"
  echo "ok: train.cudnn_benchmark=true takes the measured fastest deterministic algorithms ($n shapes)"
  # 9. resumed under another measurement: the record, untimed, bit for bit
  RINGTRAIN_EMU_CUDNN_FAST=$fast train tim-r train.cudnn_benchmark=true train.max_steps=5 checkpoint.every_steps=5 ||
    fail "timed run to step 5"
  RINGTRAIN_EMU_CUDNN_FAST=fwd:2 RINGTRAIN_LOG_LEVEL=debug train tim-r train.cudnn_benchmark=true || fail "timed resume"
  grep -q "the convolution algorithms of .*ckpt-000000005" "$tmp/tim-r.out" || fail "the resume did not take the recorded algorithms"
  ! grep -q "D conv2d .*(timed" "$tmp/tim-r.err" || fail "the resume timed the algorithms again"
  same_run tim tim-r "timed, resumed at step 5"
  [ "$(meta "$(newest tim-r)" cudnn.conv_algos)" = "$(meta "$ck" cudnn.conv_algos)" ] ||
    fail "the resumed run recorded other algorithms than the uninterrupted one"
  echo "ok: a timed run resumed at step 5 takes its record untimed and equals the uninterrupted one"
  # 10. 2 ranks on 2 GPUs that measure differently
  export RINGTRAIN_EMU_GPUS=2
  RINGTRAIN_EMU_CUDNN_FAST=fwd:0@0,filter:0 RINGTRAIN_LOG_LEVEL=debug train two-0 dist.nproc=2 \
    train.cudnn_benchmark=true || fail "2 ranks, GPU 0 measuring forward 0 fastest"
  grep -q "transport nccl" "$tmp/two-0.err" || fail "the 2-GPU run did not use the nccl transport"
  grep -q "rank 1\] D conv2d .*: given fwd algo 0" "$tmp/two-0.err" || fail "rank 1 did not take rank 0's algorithms"
  ! grep -q "rank 1\] D conv2d .*(timed" "$tmp/two-0.err" || fail "rank 1 timed its own algorithms"
  RINGTRAIN_EMU_CUDNN_FAST=$fast train two-all dist.nproc=2 train.cudnn_benchmark=true || fail "2 ranks, both measuring alike"
  same_run two-0 two-all "2 ranks: GPU 1 measuring otherwise"
  echo "ok: 2 ranks on 2 GPUs run rank 0's timed choice"
  exit 0
fi
[ "$what" = one ] || { echo "usage: $0 RINGTRAIN [one|ranks|timed]" >&2; exit 2; }

# 1. deterministic twice
train det-a || fail "deterministic run"
train det-b || fail "deterministic run, again"
same_run det-a det-b "two deterministic runs"
ck=$(newest det-a)
[ "$(meta "$ck" device)" = cuda ] || fail "checkpoint device is '$(meta "$ck" device)', expected cuda"
[ "$(meta "$ck" cudnn.deterministic)" = true ] || fail "cudnn.deterministic is '$(meta "$ck" cudnn.deterministic)'"
algos=$(meta "$ck" cudnn.conv_algos)
[[ "$algos" == *"fwd="*"data="*"filter="* ]] || fail "no convolution algorithms recorded: '$algos'"
echo "ok: two deterministic runs are identical; recorded: $algos"

# 2. stopped at step 5, resumed to the end
train det-r train.max_steps=5 checkpoint.every_steps=5 || fail "run to step 5"
[ -d "$tmp/det-r/checkpoints/ckpt-000000005" ] || fail "no checkpoint of step 5"
train det-r || fail "resume"
grep -q "resuming from .*ckpt-000000005" "$tmp/det-r.out" || fail "did not resume from step 5"
grep -q "the convolution algorithms of .*ckpt-000000005" "$tmp/det-r.out" || fail "the resume did not take the recorded algorithms"
same_run det-a det-r "resumed at step 5"
[ "$(meta "$(newest det-r)" cudnn.conv_algos)" = "$(meta "$tmp/det-r/checkpoints/ckpt-000000005" cudnn.conv_algos)" ] ||
  fail "the resumed run recorded other algorithms than the checkpoint it resumed from"
echo "ok: a deterministic run stopped at step 5 and resumed equals the uninterrupted one"

# 4. an algorithm this cuDNN does not know: an error naming it
mkdir -p "$tmp/bad/checkpoints"
cp -r "$tmp/det-r/checkpoints/ckpt-000000005" "$tmp/bad/checkpoints/"
bad=$(meta "$tmp/bad/checkpoints/ckpt-000000005" cudnn.conv_algos | sed 's/fwd=[0-9]*/fwd=99/')
set_meta "$tmp/bad/checkpoints/ckpt-000000005" cudnn.conv_algos "$bad"
train bad && fail "a resume with an unknown recorded algorithm succeeded"
grep -q "forward algorithm 99 is unknown" "$tmp/bad.err" || fail "the error does not name the algorithm"
train bad train.deterministic=false || fail "train.deterministic=false does not resume afresh"
echo "ok: an unknown recorded algorithm is refused by name; train.deterministic=false searches afresh"

# 5. non-deterministic: the checkpoint records the choice and that it was not deterministic
train nd train.deterministic=false train.max_steps=5 checkpoint.every_steps=5 || fail "non-deterministic run"
ck=$(newest nd)
[ "$(meta "$ck" cudnn.deterministic)" = false ] || fail "cudnn.deterministic is '$(meta "$ck" cudnn.deterministic)', expected false"
nd_algos=$(meta "$ck" cudnn.conv_algos)
[[ "$nd_algos" == *"fwd="*"data="*"filter="* ]] || fail "no algorithms recorded without determinism: '$nd_algos'"
[ "$nd_algos" != "$algos" ] && echo "note: without determinism other algorithms were chosen: $nd_algos"
train nd || fail "deterministic resume of a non-deterministic checkpoint"
grep -q "chose its convolution algorithms with train.deterministic off: choosing afresh" "$tmp/nd.out" ||
  fail "a deterministic resume of a non-deterministic checkpoint did not say it chooses afresh"
[ "$(meta "$(newest nd)" cudnn.deterministic)" = true ] || fail "the deterministic resume recorded a non-deterministic choice"
echo "ok: train.deterministic=false records its choice; a deterministic resume of it chooses afresh"

# 6. the GPU checkpoint of step 5 resumes on the CPU (the record is not used there)
mkdir -p "$tmp/cpu/checkpoints"
cp -r "$tmp/det-r/checkpoints/ckpt-000000005" "$tmp/cpu/checkpoints/"
train cpu train.device=cpu || fail "the GPU checkpoint does not resume on the CPU"
grep -q "resuming from .*ckpt-000000005" "$tmp/cpu.out" || fail "the CPU run did not resume"
! grep -q "the convolution algorithms of" "$tmp/cpu.out" || fail "the CPU run took GPU algorithms"
[ "$(meta "$(newest cpu)" device)" = cpu ] || fail "the CPU run's checkpoint says device '$(meta "$(newest cpu)" device)'"
[ "$(meta "$(newest cpu)" cudnn.conv_algos)" = "<absent>" ] || fail "a CPU checkpoint records cuDNN algorithms"
echo "ok: a GPU checkpoint resumes on the CPU, which ignores its algorithms"
