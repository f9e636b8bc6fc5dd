#!/usr/bin/env bash
# CIFAR-100 end to end on a tiny folder this test writes (64 training and 16 test records
# of random pixels; no download).
#
#   tests/data/cifar100.sh RINGTRAIN SOURCE_DIR CASE
# CASE train: `ringtrain data info` reads it (kind, format, 100 or 20 classes);
#   `ringtrain train` runs 2 steps on 2 CPU ranks with the fine and with the coarse labels
#   (the model's last layer has 100 or 20 outputs: the parameter counts differ by
#   (8 * width + 1) * 80); resuming the fine run with data.label=coarse is refused;
#   data.label=coarse on a CIFAR-10 folder is an error naming data.label.
# CASE fetch: `datasets/fetch cifar100` asks for the official archive and refuses one
#   whose MD5 is not the published one (a stand-in curl serves it), removing it.
set -u
bin=$1
src=$2
what=$3
command -v python3 >/dev/null || { echo "SKIP: python3 missing"; exit 77; }
tmp=$(mktemp -d /tmp/rt-cifar100-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/out "$tmp"/err; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done; exit 1; }
has() { grep -qF -- "$2" "$1" || fail "$1 lacks '$2'"; }

# DIR N_TRAIN N_TEST LABEL_BYTES: CIFAR binary files of random pixels, valid labels
write_cifar() {
  python3 - "$@" <<'PY'
import os, random, sys
d, ntrain, ntest, nl = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.makedirs(d, exist_ok=True)
r = random.Random(1)
def recs(n):
    lab = (lambda i: bytes([i % 20, (7 * i + 3) % 100])) if nl == 2 else (lambda i: bytes([i % 10]))
    return b"".join(lab(i) + bytes(r.randrange(256) for _ in range(3072)) for i in range(n))
if nl == 2:
    open(os.path.join(d, "train.bin"), "wb").write(recs(ntrain))
    open(os.path.join(d, "test.bin"), "wb").write(recs(ntest))
else:
    for k in range(1, 6):
        open(os.path.join(d, "data_batch_%d.bin" % k), "wb").write(recs(ntrain // 5))
    open(os.path.join(d, "test_batch.bin"), "wb").write(recs(ntest))
PY
}

# the "parameters" of metrics.jsonl's start record in run folder $1
params() { python3 -c 'import json,sys; print(next(json.loads(l)["parameters"] for l in open(sys.argv[1]) if "\"start\"" in l))' "$1/metrics.jsonl"; }

case $what in
train)
  d=$tmp/c100/cifar-100-binary
  write_cifar "$d" 64 16 2 || fail "could not write the folder"
  "$bin" data info "$tmp/c100" >"$tmp/out" 2>"$tmp/err" || fail "data info exited $?"
  has "$tmp/out" "dataset:    cifar100"
  has "$tmp/out" "format:     cifar100-binary (fine)"
  has "$tmp/out" "classes:    100"
  has "$tmp/out" "samples:    64"
  has "$tmp/out" "normalise:  mean 0.5071 0.4865 0.4409 std 0.2673 0.2564 0.2762"
  "$bin" data info "$tmp/c100" --label coarse --split test >"$tmp/out" 2>"$tmp/err" || fail "data info --label coarse exited $?"
  has "$tmp/out" "format:     cifar100-binary (coarse)"
  has "$tmp/out" "classes:    20"
  "$bin" data info "$tmp/c100" --label superclass >"$tmp/out" 2>"$tmp/err" && fail "--label superclass accepted"
  has "$tmp/err" "unknown dataset label 'superclass' (expected fine | coarse)"
  echo "ok: data info"

  printf 'model:\n  arch: resnet18\n  width: 4\n' >"$tmp/a.yaml"
  small=(data.path="$tmp/c100" data.batch_size=16 train.max_steps=2 train.threads=1 dist.nproc=2 dist.timeout_s=60)
  for label in fine coarse; do
    "$bin" train "$tmp/a.yaml" "${small[@]}" data.label=$label log.dir="$tmp/run-$label" >"$tmp/out" 2>"$tmp/err" ||
      fail "train with data.label=$label exited $?"
    has "$tmp/out" "after 2 steps"
    has "$tmp/run-$label/metrics.jsonl" '"kind": "end", "steps": 2'
    has "$tmp/run-$label/config.yaml" "label: \"$label\""
  done
  pf=$(params "$tmp/run-fine") pc=$(params "$tmp/run-coarse")
  [ $((pf - pc)) -eq $(((8 * 4 + 1) * 80)) ] || fail "parameters: $pf with the fine labels, $pc with the coarse ones (expected a difference of 33 x 80)"
  echo "ok: train 2 steps, fine ($pf parameters) and coarse ($pc)"

  # a resume of the fine run with the coarse labels: refused (another last layer)
  "$bin" train "$tmp/a.yaml" "${small[@]}" train.max_steps=3 data.label=coarse log.dir="$tmp/run-fine" >"$tmp/out" 2>"$tmp/err" &&
    fail "resume with another data.label accepted"
  grep -q "was trained with another config: data.label fine in the checkpoint, coarse in this run" "$tmp/err" ||
    fail "resume refused without naming data.label"
  echo "ok: resume with another data.label refused"

  write_cifar "$tmp/c10" 10 2 1 || fail "could not write the CIFAR-10 folder"
  "$bin" train "$tmp/a.yaml" "${small[@]}" data.path="$tmp/c10" data.label=coarse log.dir="$tmp/run-c10" >"$tmp/out" 2>"$tmp/err" &&
    fail "data.label=coarse on CIFAR-10 accepted"
  has "$tmp/err" "data.label coarse: only CIFAR-100 has coarse labels"
  echo "ok: coarse labels refused for CIFAR-10"
  ;;
fetch)
  mkdir -p "$tmp/bin"
  # a curl that logs its arguments and writes something that is not the archive to -o
  cat >"$tmp/bin/curl" <<EOF
#!/bin/sh
echo "\$@" >>"$tmp/curl.log"
out=; prev=
for a in "\$@"; do [ "\$prev" = -o ] && out=\$a; prev=\$a; done
printf 'not the archive' >"\$out"
EOF
  chmod +x "$tmp/bin/curl"
  PATH="$tmp/bin:$PATH" bash "$src/datasets/fetch" cifar100 "$tmp/dest" >"$tmp/out" 2>"$tmp/err" && fail "fetch accepted a wrong archive"
  has "$tmp/curl.log" "https://www.cs.toronto.edu/~kriz/cifar-100-binary.tar.gz"
  has "$tmp/err" "cifar-100-binary.tar.gz has the wrong MD5 sum (expected 03b5dce01913d631647c71ecec9e9cb8)"
  [ ! -e "$tmp/dest/cifar-100-binary.tar.gz" ] || fail "the wrong archive was kept"
  bash "$src/datasets/fetch" cifar1000 >"$tmp/out" 2>"$tmp/err" && fail "fetch cifar1000 accepted"
  has "$tmp/err" "usage: datasets/fetch mnist|mnist-5k|cifar10|cifar100 [DEST]"
  echo "ok: fetch cifar100 checks the archive's MD5"
  ;;
*) echo "unknown case $what"; exit 2 ;;
esac
