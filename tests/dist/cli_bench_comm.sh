#!/bin/sh
# The `ringtrain bench comm` command line: --opt=value as well as --opt value, strict
# numbers, an unwritable --json refused before the benchmark runs (with the errno
# text), RINGTRAIN_DIST_TIMEOUT as the default --timeout. usage: cli_bench_comm.sh RINGTRAIN
set -u
bin=$1
cmd="bench comm"
. "$(dirname "$0")/../cli_expect.sh"

small="--max-size=64 --iters=1 --warmup=0"
# --opt=value and --opt value mean the same
expect 0 '2 ranks, transport tcp, f32, sizes 8\.\.64 bytes' --nproc=2 --transport=tcp $small
expect 0 'all_reduce +ring' --nproc 2 --collective=all_reduce --algo=ring $small
expect 2 '--compare takes no value' --compare=yes
# numbers with spaces or trailing garbage are refused
expect 2 "--nproc ' 2': expected an integer" --nproc " 2"
expect 2 "--iters '3x': expected an integer" --iters 3x
expect 2 "--warmup '1 ': expected an integer" --warmup="1 "
expect 2 "--min-size ' 8': expected a size" --min-size " 8"
expect 2 "--max-size '-1': expected a size" --max-size -1
expect 2 "--timeout ' 5': expected seconds" --timeout " 5"
expect 2 "--timeout '0x10': expected seconds" --timeout=0x10
expect 2 "needs a value" --iters
# an output that cannot be written: refused before the benchmark (no table printed)
expect 1 "--json $tmp/none/out.json: cannot write: No such file or directory" --nproc 2 $small --json "$tmp/none/out.json"
if grep -q 'size(B)' "$tmp/out"; then echo "FAIL: the benchmark ran before the --json check"; fails=$((fails + 1)); fi
mkdir "$tmp/dir"
expect 1 "--json $tmp/dir: cannot write: Is a directory" --nproc 2 $small "--json=$tmp/dir"
expect 1 "cannot write: No such file or directory" --nproc 2 $small --json=/nonexistent-rt/x.json
# ... and a writable one is written, and no probe file is left behind when it fails
expect 0 'all_reduce' --nproc 2 $small --json "$tmp/ok.json"
[ -s "$tmp/ok.json" ] && echo "ok: --json written" || { echo "FAIL: --json not written"; fails=$((fails + 1)); }
# RINGTRAIN_DIST_TIMEOUT is the default --timeout (docs/dist.md); --timeout overrides it
# (exported and unset around the calls: an assignment before a shell function outlives
# the call in bash's POSIX mode)
export RINGTRAIN_DIST_TIMEOUT=7
expect 0 'timeout 7 s' --nproc 2 $small
expect 0 'timeout 9 s' --nproc 2 $small --timeout=9
unset RINGTRAIN_DIST_TIMEOUT
expect 0 'timeout 120 s' --nproc 2 $small
export RINGTRAIN_DIST_TIMEOUT=abc
expect 2 "RINGTRAIN_DIST_TIMEOUT='abc': expected a number" --nproc 2 $small
unset RINGTRAIN_DIST_TIMEOUT

expect_done
