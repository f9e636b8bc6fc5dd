#!/bin/bash
# Settings cannot drift (docs/settings.md): usage: settings_docs.sh RINGTRAIN SOURCE_DIR
#  1. the table in docs/settings.md is exactly `ringtrain info --settings --markdown`;
#  2. no getenv in src/ outside src/core/settings.c (every read goes through the table);
#  3. every "RINGTRAIN_..." name quoted in src/ is a row of the table.
bin=$1 src=$2
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$bin" info --settings --markdown >"$tmp/table" || { echo "FAIL: ringtrain info --settings --markdown"; exit 1; }
sed -n '/^<!-- settings:begin/,/^<!-- settings:end/p' "$src/docs/settings.md" | grep '^|' >"$tmp/doc"
if [ ! -s "$tmp/table" ] || ! diff -u "$tmp/doc" "$tmp/table"; then
  echo "FAIL: docs/settings.md's table differs from the settings table (-: the doc, +: the code);"
  echo "      paste 'ringtrain info --settings --markdown' between its settings:begin/end markers"
  fails=$((fails + 1))
fi

if grep -rn --include='*.c' --include='*.h' --include='*.cu' --include='*.cpp' 'getenv *(' "$src/src" |
  grep -v "^$src/src/core/settings.c:"; then
  echo "FAIL: getenv outside src/core/settings.c: read the variable through core/settings.h"
  fails=$((fails + 1))
fi

"$bin" info --settings | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/\1/p' | sort -u >"$tmp/declared"
grep -rhoE --include='*.c' --include='*.h' --include='*.cu' '"RINGTRAIN_[A-Z0-9_]+"' "$src/src" | tr -d '"' |
  sort -u >"$tmp/used"
undeclared=$(comm -23 "$tmp/used" "$tmp/declared")
if [ -n "$undeclared" ]; then
  echo "FAIL: named in src/ but not declared in core/settings.h: $undeclared"
  fails=$((fails + 1))
fi
[ "$(wc -l <"$tmp/declared")" -gt 40 ] || { echo "FAIL: too few settings listed"; fails=$((fails + 1)); }

[ "$fails" -eq 0 ] || exit 1
echo "settings: $(wc -l <"$tmp/declared") declared, docs table in step, no stray getenv"
