#!/usr/bin/env bash
# docs/architecture.md against the tree, so that the map cannot drift (issue 24, item 6).
# Fails, naming each problem, when the page
#  - does not name a folder under src/ (as `src/<area>/` or `src/<area>/<sub>/`);
#  - lacks a public header (src/<area>/*.h) in its area's row of the public headers
#    table, or names a header there that the area does not have;
#  - does not name a source file of src/cli (the page lists the command's files);
#  - names a path that does not exist: `src/...`, `tests/...`, `docs/...` paths, paths
#    that start with an area (`core/cuda/cuda_check.h`), and file names in backticks
#    (`arch.c`, `internal/optim_kernels.h`: some file under src/ or tests/ must end so);
#  - links a page of docs/ that does not exist;
#  - has a row of the "Where to add" table without its count after issue 24;
#  - has a row of the table re-measured after issue 37 whose check (a grep in its last
#    column, run from the root) finds another number of files than the row counts, or a
#    file the row does not name;
#  - does not list, in the "Backends" section's paragraph "Outside the `cuda/` folders",
#    exactly the files of src/ outside cuda/ folders with an #if on RT_HAVE_CUDA.
# usage: check_architecture.sh SOURCE_DIR [PAGE]   (PAGE: docs/architecture.md by default)
set -u
root=${1:?usage: check_architecture.sh SOURCE_DIR [PAGE]}
doc=${2:-$root/docs/architecture.md}
cd "$root" || exit 2
[ -f "$doc" ] || { echo "docs: $doc not found"; exit 2; }
[ -d src/core ] && [ -d src/cli ] || { echo "docs: $root has no src/core or src/cli"; exit 2; }
bad=0
complain() { echo "docs/architecture.md: $*"; bad=1; }
areas=$(cd src && ls -d */ | tr -d /)

# 1. every folder under src/
while IFS= read -r d; do
  grep -qF "\`$d/\`" "$doc" || complain "folder $d/ is not named (expected \`$d/\` in the Folders table)"
done < <(find src -mindepth 1 -type d | sort)

# 2. the public headers table: one row per area, `| <area> | ... |`
for a in $areas; do
  row=$(grep -E "^\| $a \|" "$doc")
  if [ -z "$row" ]; then
    complain "no row for area $a in the public headers table (expected a line starting '| $a |')"
    continue
  fi
  for h in src/"$a"/*.h; do
    [ -e "$h" ] || continue
    grep -qF "\`${h##*/}\`" <<<"$row" || complain "public header $h is missing from the $a row of the public headers table"
  done
  for h in $(grep -oE '`[A-Za-z0-9_]+\.h`' <<<"$row" | tr -d '`'); do
    [ -f "src/$a/$h" ] || complain "the $a row names $h, but src/$a/$h does not exist"
  done
done

# 3. the files of src/cli
for f in src/cli/*.c; do
  grep -qF "${f##*/}" "$doc" || complain "$f is not named (the page lists the command's files)"
done

# 4. every path the page names exists
exists_path() { # path relative to the root; a trailing glob part is cut off
  local p=${1%%\**}
  [ -e "$p" ]
}
while IFS= read -r p; do
  exists_path "$p" || complain "names $p, which does not exist"
done < <(grep -oE '(^|[^A-Za-z0-9_/.-])(src|tests|docs|scripts|bench|configs)/[A-Za-z0-9_./*-]*' "$doc" |
  sed -E 's/^[^a-z]//' | sort -u)
for a in $areas; do
  while IFS= read -r p; do
    exists_path "src/$p" || complain "names $p, but src/$p does not exist"
  done < <(grep -oE "(^|[^A-Za-z0-9_/.<>-])$a/[A-Za-z0-9_./*-]+" "$doc" | sed -E 's/^[^a-z]//' | sort -u)
done
all_files=$(find src tests -type f | sed 's|^|/|')$'\n'
while IFS= read -r f; do
  [[ $all_files == *"/$f"$'\n'* ]] || complain "names \`$f\`, but no file under src/ or tests/ is called so"
done < <(grep -oE '`[A-Za-z0-9_./-]+\.(c|h|cu|sh|cmake|in)`' "$doc" | tr -d '`' | sort -u)

# 5. links to other pages
while IFS= read -r l; do
  [ -f "docs/$l" ] || complain "links $l, which is not in docs/"
done < <(grep -oE '\]\([A-Za-z0-9_.-]+\.md' "$doc" | sed 's/^](//' | sort -u)

# 6. the "Where to add" table: every row has its count after issue 24 (the last column)
while IFS= read -r row; do
  last=$(sed -E 's/\|[[:space:]]*$//; s/.*\|//' <<<"$row" | tr -d '[:space:]')
  [ -n "$last" ] || complain "the 'Where to add' row '${row:0:40}...' has no 'after issue 24' value"
done < <(awk '/^## Where to add/{on=1; next} /^## /{on=0} on && /^\| (a|an) /' "$doc")

# 8. the re-measured "Where to add" rows: each row's grep finds exactly the files it counts
rows=0
while IFS= read -r row; do
  rows=$((rows + 1))
  IFS='|' read -r _ what count files _ <<<"${row//\\|/$'\x01'}"
  cmd=$(sed -E 's/.*\|[[:space:]]*`([^`]*)`[[:space:]]*\|[[:space:]]*$/\1/' <<<"$row")
  cmd=${cmd//\\|/|}
  n=$(grep -oE '^[[:space:]]*[0-9]+' <<<"$count" | tr -d '[:space:]')
  case $cmd in grep\ *) ;; *) complain "re-measured row '${what}': its check is not a grep ($cmd)"; continue ;; esac
  found=$(bash -c "$cmd" | sort)
  got=$(grep -c . <<<"$found")
  [ "$got" = "$n" ] || complain "re-measured row '${what}': its check finds $got file(s), the row counts ${n:-none}: $(tr '\n' ' ' <<<"$found")"
  for f in $found; do
    grep -qF "\`${f#src/}\`" <<<"$files" || complain "re-measured row '${what}': its check finds $f, which the row does not name"
  done
done < <(awk '/^### Re-measured after issue 37/{on=1; next} /^##/{on=0} on && /^\| (a|an) /' "$doc")
[ "$rows" -gt 0 ] || complain "no table 'Re-measured after issue 37' in 'Where to add'"

# 7. RT_HAVE_CUDA outside the cuda/ folders: exactly the files the Backends section lists
listed=$(awk '/^## Backends/{on=1; next} /^## /{on=0} on && /^Outside the `cuda\/` folders/{p=1} p && /^$/{p=0} p' "$doc" |
  grep -oE 'src/[A-Za-z0-9_/.-]+\.(c|h|cu)' | sort -u)
[ -n "$listed" ] || complain "the Backends section has no paragraph 'Outside the \`cuda/\` folders' listing the files with RT_HAVE_CUDA"
used=$(grep -rlE '^[[:space:]]*#[[:space:]]*(if|ifdef|ifndef|elif)[[:space:](!]?.*RT_HAVE_CUDA' src \
  --include='*.c' --include='*.h' --include='*.cu' | grep -v '/cuda/' | sort -u)
for f in $(comm -23 <(echo "$used") <(echo "$listed")); do
  complain "$f has an #if on RT_HAVE_CUDA outside a cuda/ folder, but the Backends section does not list it"
done
for f in $(comm -13 <(echo "$used") <(echo "$listed")); do
  complain "the Backends section lists $f among the files with RT_HAVE_CUDA, but it has no #if on it"
done

[ $bad = 0 ] && echo "docs/architecture.md: every folder, public header and src/cli file named; every path named exists; RT_HAVE_CUDA's files listed"
exit $bad
