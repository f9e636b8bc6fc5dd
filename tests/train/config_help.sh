#!/usr/bin/env bash
# `ringtrain train --help` lists every key that takes a name with the names of its area's
# table (core/names.h), the same names docs/config.md's type column shows (test_config):
# usage: config_help.sh RINGTRAIN SOURCE_DIR
set -u
bin=$1 src=$2
out=$("$bin" train --help) || { echo "FAIL: ringtrain train --help exited $?"; exit 1; }
fails=0
# each choice row of docs/config.md: | `key` | a \| b \| c | ... |
while IFS=$'\t' read -r key names; do
  line=$(grep -E "^  $key +" <<<"$out")
  if [ "$(sed -E 's/^ +[^ ]+ +//' <<<"$line")" != "$names" ]; then
    echo "FAIL: --help lists '$line' for $key; docs/config.md says '$names'"
    fails=$((fails + 1))
  fi
done < <(sed -nE 's/^\| `([a-z_.]+)` \| ([a-z0-9_-]+( \\\| [a-z0-9_-]+)+) \|.*/\1\t\2/p' "$src/docs/config.md" |
  sed 's/\\|/|/g')
n=$(grep -cE '^  [a-z_]+\.[a-z_]+ +[a-z0-9_-]+( \| [a-z0-9_-]+)+$' <<<"$out")
[ "$n" -ge 15 ] || { echo "FAIL: --help lists $n keys with names (expected 15 or more)"; fails=$((fails + 1)); }
[ "$fails" -eq 0 ] || exit 1
echo "train --help: $n keys with their names, as docs/config.md"
