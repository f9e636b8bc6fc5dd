#!/bin/sh
# The `ringtrain data` and `ringtrain bench loader` command lines: help, output, and
# exit code 2 with a message for bad arguments. usage: cli_data.sh RINGTRAIN
set -u
bin=$1
. "$(dirname "$0")/../cli_expect.sh"

expect 0 'sampler' data --help
expect 2 'info' data
expect 2 'unknown command' data frobnicate
expect 0 'usage: ringtrain data info' data info --help
expect 0 'usage: ringtrain data sampler' data sampler --help
expect 0 'usage: ringtrain bench loader' bench loader --help

# sampler: torch's layout without shuffle (10 samples, 4 ranks: pad with 0, 1)
"$bin" data sampler --world-size 4 --rank 2 --epoch 0 --no-shuffle 10 >"$tmp/s" 2>&1
printf '2\n6\n0\n' | cmp -s - "$tmp/s" && echo "ok: sampler rank 2 of 4" || { echo "FAIL: sampler output"; cat "$tmp/s"; fails=$((fails + 1)); }
"$bin" data sampler --world-size 4 --rank 3 --epoch 0 --no-shuffle --drop-last 10 >"$tmp/s" 2>&1
printf '3\n7\n' | cmp -s - "$tmp/s" && echo "ok: sampler drop-last" || { echo "FAIL: sampler drop-last"; cat "$tmp/s"; fails=$((fails + 1)); }
# shuffled: a permutation across ranks, the same for the same seed, another for another epoch
for r in 0 1 2; do "$bin" data sampler --world-size 3 --rank $r --epoch 5 --seed 7 --drop-last 30 >>"$tmp/all"; done
sort -n "$tmp/all" | tr '\n' ' ' >"$tmp/sorted"
seq 0 29 | tr '\n' ' ' | cmp -s - "$tmp/sorted" && echo "ok: shuffled ranks cover 0..29" || { echo "FAIL: coverage"; cat "$tmp/all"; fails=$((fails + 1)); }
a=$("$bin" data sampler --world-size=3 --rank=1 --epoch=5 --seed=7 30 | tr '\n' ' ')
b=$("$bin" data sampler --world-size 3 --rank 1 --epoch 5 --seed 7 30 | tr '\n' ' ')
c=$("$bin" data sampler --world-size 3 --rank 1 --epoch 6 --seed 7 30 | tr '\n' ' ')
[ "$a" = "$b" ] && [ "$a" != "$c" ] && echo "ok: seed/epoch" || { echo "FAIL: seed/epoch: '$a' '$b' '$c'"; fails=$((fails + 1)); }
expect 0 '^12$' data sampler --world-size 5 --rank 2 --epoch 0 --mode eval 13 --no-shuffle

# bad arguments: exit 2 and say what is wrong
expect 2 'missing N' data sampler --world-size 2 --rank 0 --epoch 0
expect 2 'missing --world-size' data sampler --rank 0 --epoch 0 10
expect 2 'missing --epoch' data sampler --world-size 2 --rank 0 10
expect 2 'rank 2: expected 0..1' data sampler --world-size 2 --rank 2 --epoch 0 10
expect 2 "world-size 'x'" data sampler --world-size x --rank 0 --epoch 0 10
expect 2 "world-size '0'" data sampler --world-size 0 --rank 0 --epoch 0 10
expect 2 "N '-3'" data sampler --world-size 1 --rank 0 --epoch 0 -- -3
expect 2 "unknown option '--frob'" data sampler --frob --world-size 1 --rank 0 --epoch 0 10
expect 2 "needs a value" data sampler --world-size
expect 2 "mode 'foo'" data sampler --world-size 1 --rank 0 --epoch 0 --mode foo 10
expect 2 "split 'dev'" data info --split dev
expect 2 "unknown dataset kind 'svhn'" data info --kind svhn
expect 2 "unknown argument" bench loader --frob
expect 2 "batch '0'" bench loader --batch 0
# numbers are whole: no spaces, no trailing garbage, no sign but '-'; --opt=value too
expect 2 "world-size ' 2'" data sampler --world-size " 2" --rank 0 --epoch 0 10
expect 2 "rank '0 '" data sampler --world-size 2 --rank "0 " --epoch 0 10
expect 2 "epoch '1x'" data sampler --world-size=2 --rank=0 --epoch=1x 10
expect 2 "seed ' 7'" data sampler --world-size 1 --rank 0 --epoch 0 --seed " 7" 10
expect 2 "seed '\+7'" data sampler --world-size 1 --rank 0 --epoch 0 --seed +7 10
expect 2 "N ' 10'" data sampler --world-size 1 --rank 0 --epoch 0 " 10"
expect 2 "batch '3x'" bench loader --batch 3x
expect 2 "batch ' 3'" bench loader --batch=" 3"
expect 2 "prefetch '\+4'" bench loader --prefetch=+4
expect 2 "needs a value" bench loader --images

# a missing dataset: exit 1 and how to get it
expect 1 'scripts/install-deps.*data.path' data info "$tmp/nowhere"

# a dataset written here: format, counts, shape, histogram
/usr/bin/python3 - "$tmp" <<'PY' || { echo "FAIL: python"; fails=$((fails + 1)); }
import struct, sys
d = sys.argv[1]
open(d + "/t10k-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, 4, 2, 3) + bytes([0, 255] * 12))
open(d + "/t10k-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, 4) + bytes([1, 1, 3, 9]))
PY
expect 0 'samples: +4' data info "$tmp" --split test
expect 0 'image: +1 x 2 x 3' data info "$tmp" --split test
expect 0 '^ +1  2$' data info "$tmp" --split test
expect 0 'pixel mean: 0.5000' data info "$tmp" --split test
expect 0 'format: +idx$' data info --split=test "$tmp"
expect 1 'train-images-idx3-ubyte' data info "$tmp"
expect 0 'format: +idx$' data info --split=test --kind=mnist "$tmp"
# a FIFO, a directory or a symlink loop where a file should be: named, never "missing",
# and the FIFO does not block the reader
mkdir -p "$tmp/odd"
cp "$tmp/t10k-labels-idx1-ubyte" "$tmp/odd/"
mkfifo "$tmp/odd/t10k-images-idx3-ubyte"
expect 1 't10k-images-idx3-ubyte is a FIFO \(named pipe\)' data info --split test "$tmp/odd"
rm "$tmp/odd/t10k-images-idx3-ubyte" && mkdir "$tmp/odd/t10k-images-idx3-ubyte"
expect 1 't10k-images-idx3-ubyte is a directory' data info --split test "$tmp/odd"
rmdir "$tmp/odd/t10k-images-idx3-ubyte" && ln -s t10k-images-idx3-ubyte "$tmp/odd/t10k-images-idx3-ubyte"
expect 1 'Too many levels of symbolic links' data info --split test "$tmp/odd"
# without --split: train, then test when present
mkdir -p "$tmp/tr"
cp "$tmp/t10k-images-idx3-ubyte" "$tmp/tr/train-images-idx3-ubyte"
cp "$tmp/t10k-labels-idx1-ubyte" "$tmp/tr/train-labels-idx1-ubyte"
expect 0 'split test: not found' data info "$tmp/tr"
cp "$tmp/t10k-images-idx3-ubyte" "$tmp/t10k-labels-idx1-ubyte" "$tmp/tr/"
expect 0 'split: +test' data info "$tmp/tr"

# the real Fashion-MNIST, when installed
if [ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
  expect 0 'samples: +60000' data info
  expect 0 'pixel mean: 0.2860' data info /usr/share/datasets/fashion-mnist
fi

expect_done
