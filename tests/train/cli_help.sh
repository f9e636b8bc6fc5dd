#!/usr/bin/env bash
# `ringtrain train` and `ringtrain eval` each print their own usage (src/cli/train.c
# serves both; eval printed train's until issue 37): eval's lists the options that apply to
# an evaluation, not train's --max-restarts and --trace.
# usage: cli_help.sh RINGTRAIN SOURCE_DIR
bin=$1 src=$2
# shellcheck source=../cli_expect.sh
. "$src/tests/cli_expect.sh"

# lacks PATTERN: the output of the last expect has no line matching PATTERN (grep -E)
lacks() {
  if grep -Eq -- "$1" "$tmp/out"; then
    echo "FAIL: the output has /$1/:"; grep -E -- "$1" "$tmp/out"; fails=$((fails + 1))
  else
    echo "ok:   ... without /$1/"
  fi
}

expect 0 '^usage: ringtrain eval CHECKPOINT\|CONFIG \[section\.key=value \.\.\.\] \[options\]$' eval --help
lacks '^usage: ringtrain train'
lacks '--max-restarts'
lacks '--trace'
expect 0 '^  --nproc N  ' eval --help
expect 0 '^  --master-port P  ' eval --help
expect 0 '^  eval\.tta +none \| flip$' eval --help # the keys that take a name, as train's
expect 0 'test loss L, accuracy A% ' eval -h
# without a checkpoint or config: eval's usage on stderr, a usage error
expect 2 '^usage: ringtrain eval CHECKPOINT\|CONFIG' eval
lacks '^usage: ringtrain train'
# its errors name eval
expect 2 "^ringtrain eval: unknown option '--bogus' \(try --help\)$" eval ckpt --bogus
expect 2 "^ringtrain eval: --nproc 'x' \(expected a whole number" eval ckpt --nproc x

# train's own, unchanged
expect 0 '^usage: ringtrain train CONFIG \[section\.key=value \.\.\.\] \[options\]$' train --help
lacks '^usage: ringtrain eval'
expect 0 '^  --max-restarts N  ' train --help
expect 0 '^  --trace  ' train --help
expect 2 '^usage: ringtrain train CONFIG' train
expect 2 "^ringtrain train: unknown option '--bogus' \(try --help\)$" train cfg --bogus
expect_done
