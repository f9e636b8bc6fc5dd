#!/usr/bin/env bash
# A checkpoint is data (issue 38, item 1): nothing read from one writes, binds, connects,
# forks or chooses where output goes, and every metadata field is read strictly.
#
#   tests/train/ckpt_data.sh RINGTRAIN CASE
# CASE crafted: a real checkpoint of a tiny run whose train.safetensors metadata 'config'
#   is rewritten (tensor bytes untouched, crc32.metadata recomputed as a crafted file
#   can) to say dist.init_method: file:///<victim>, dist.nproc: 3, a bind address, a port
#   and log/checkpoint folders elsewhere. `ringtrain eval CKPT` leaves the victim file as
#   it was, runs with this command's defaults (not 3 ranks), writes nothing where the
#   checkpoint said, names the keys it did not use once, and still evaluates the model
#   to the training's accuracy; the command line still sets them (--nproc 1).
# CASE mutated: a malformed field ("step": "12abc"; "device": "gpu" with the crc
#   recomputed) is an error naming the file and the field; a value changed without its
#   crc (a flipped byte in the config text, another seed) is an error naming
#   crc32.metadata; a checkpoint without crc32.metadata (written before it) still loads.
# Exit 77 (skipped) when Debian's Fashion-MNIST is not installed.
set -u
bin=$1
what=$2
data=/usr/share/datasets/fashion-mnist
[ -r "$data" ] || { echo "SKIP: $data missing"; exit 77; }
edit="python3 $(cd "$(dirname "$0")" && pwd)/ckpt_meta_edit.py"
tmp=$(mktemp -d /tmp/rt-ckdata-XXXXXX)
trap '[ -n "${KEEP:-}" ] || rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.out "$tmp"/*.err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
cd "$tmp" || exit 1 # eval's own run folder (log.dir auto: runs/default) lands here

printf 'model:\n  arch: net\n' > c.yaml
"$bin" train c.yaml model.arch=net data.train_subset=256 data.test_subset=64 data.batch_size=32 train.epochs=1 \
  train.threads=1 log.progress=off dist.nproc=1 "log.dir=$tmp/run" >train.out 2>train.err || fail "training run"
acc=$(tail -1 train.out | sed -n 's/^test accuracy \([0-9.]*\)%.*/\1/p')
[ -n "$acc" ] || fail "no accuracy line from the training run"
ck=$(ls -d "$tmp"/run/checkpoints/ckpt-* | tail -1)
[ -d "$ck" ] || fail "no checkpoint"
fresh() { rm -rf "$tmp/ck" && cp -r "$ck" "$tmp/ck"; }

case $what in
crafted)
  fresh
  printf 'precious\n' >victim
  $edit ck/train.safetensors --seal \
    "config:init_method: \"env://\"=>init_method: \"file://$tmp/victim\"" \
    'config:  nproc: 1\n=>  nproc: 3\n' \
    'config:master_addr: "127.0.0.1"=>master_addr: "0.0.0.0"' \
    'config:master_port: 0\n=>master_port: 29431\n' \
    "config:dir: \"$tmp/run\"=>dir: \"$tmp/evil-logs\"" \
    'config:keep_last: 3\n=>keep_last: 1\n' || fail "editing the checkpoint"
  grep -q "file://$tmp/victim" ck/train.safetensors || fail "the crafted config is not in the file"
  "$bin" eval ck >crafted.out 2>crafted.err || fail "eval of the crafted checkpoint: exit $?"
  [ "$(cat victim)" = precious ] || fail "the victim file was overwritten: $(head -c 200 victim)"
  grep -q "rank(s))" crafted.out || fail "no result line"
  grep -q "3 rank(s)" crafted.out && fail "eval forked the checkpoint's dist.nproc 3: $(tail -1 crafted.out)"
  grep -q "accuracy $acc% (64 test samples" crafted.out || fail "eval: $(tail -1 crafted.out), training said $acc%"
  [ -e "$tmp/evil-logs" ] && fail "eval made the checkpoint's log.dir $tmp/evil-logs"
  n=$(grep -c "not used" crafted.out crafted.err | awk -F: '{s += $2} END {print s}')
  [ "$n" -eq 1 ] || fail "expected one line naming the keys not used, got $n"
  grep -h "not used" crafted.out crafted.err | grep -q "dist.nproc, dist.init_method" ||
    fail "the line does not name dist.nproc, dist.init_method: $(grep -h 'not used' crafted.out crafted.err)"
  # the command line, the config file's place, still sets them
  "$bin" eval ck --nproc 1 >one.out 2>one.err || fail "eval --nproc 1"
  grep -q "accuracy $acc% (64 test samples, 1 rank(s))" one.out || fail "eval --nproc 1: $(tail -1 one.out)"
  [ "$(cat victim)" = precious ] || fail "the victim file was overwritten by eval --nproc 1"
  echo "ok: a crafted checkpoint's dist/log/checkpoint keys are not used; the victim file is untouched"
  ;;
mutated)
  # expect_refused NAME FRAGMENT EDIT...: eval of ck after the edit fails naming the field
  expect_refused() {
    local name=$1 frag=$2 rc=0; shift 2
    fresh
    $edit ck/train.safetensors "$@" || fail "$name: editing the checkpoint"
    "$bin" eval ck --nproc 1 >"$name.out" 2>"$name.err" || rc=$?
    [ "$rc" -ne 0 ] || fail "$name: eval accepted it: $(tail -1 "$name.out")"
    grep -qF "ck/train.safetensors: metadata $frag" "$name.err" || fail "$name: the error does not name the file and $frag"
    echo "ok: $name refused: $(grep -F "metadata $frag" "$name.err" | head -1 | cut -c1-200)"
  }
  expect_refused step "'step' is \"12abc\", expected a decimal integer" --seal step=12abc
  expect_refused device "'device' is \"gpu\", expected cpu | cuda" --seal device=gpu
  expect_refused run_id "'run_id' is \"../x\"" --seal run_id=../x
  expect_refused flipped "'crc32.metadata' is " 'config:resolved=>resolveD'
  expect_refused seed "'crc32.metadata' is " seed=7
  # written before crc32.metadata: loads as before
  fresh
  $edit ck/train.safetensors -crc32.metadata || fail "removing crc32.metadata"
  "$bin" eval ck --nproc 1 >old.out 2>old.err || fail "eval of a checkpoint without crc32.metadata"
  grep -q "accuracy $acc% (64 test samples, 1 rank(s))" old.out || fail "old checkpoint: $(tail -1 old.out)"
  echo "ok: a checkpoint without crc32.metadata (older) still loads"
  ;;
*)
  echo "unknown case $what"; exit 2 ;;
esac
