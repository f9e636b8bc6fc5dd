#!/usr/bin/env bash
# Layering of docs/architecture.md: cli -> train -> {data, model, dist, optim} -> core.
# Fails, naming file:line, when a source under src/ includes a header of an area it may
# not use: core includes only core; each middle area only itself and core; train
# everything but cli; nothing but cli includes cli/ or calls rt_cli_*.
set -u
src=${1:?usage: check_includes.sh SRC_DIR}
cd "$src" || exit 2
bad=0
allowed() { # area -> regex of the include prefixes it may use
  case $1 in
    core) echo 'core' ;;
    data|model|dist|optim) echo "core|$1" ;;
    train) echo 'core|data|model|dist|optim|train' ;;
    cli) echo 'core|data|model|dist|optim|train|cli' ;;
  esac
}
for area in core data model dist optim train cli; do
  [ -d "$area" ] || continue
  ok=$(allowed "$area")
  while IFS= read -r hit; do
    file=${hit%%:*}; rest=${hit#*:}; line=${rest%%:*}; inc=${rest#*:}
    target=$(sed -n 's/.*#include "\([a-z_]*\)\/.*/\1/p' <<<"$inc")
    [ -n "$target" ] || continue
    case $target in core|data|model|dist|optim|train|cli) ;; *) continue ;; esac
    if ! grep -Eqx "$ok" <<<"$target"; then
      echo "layering: src/$file:$line: $area includes $target/ ($inc)"
      bad=1
    fi
  done < <(grep -rn --include='*.c' --include='*.h' --include='*.cu' --include='*.in' '#include "' "$area")
  if [ "$area" != cli ]; then
    while IFS= read -r hit; do
      echo "layering: src/$hit: rt_cli_* used outside src/cli"
      bad=1
    done < <(grep -rn --include='*.c' --include='*.h' --include='*.cu' 'rt_cli_' "$area")
  fi
done
# the checker must have seen the areas (a wrong SRC_DIR passes nothing)
[ -d core ] && [ -d cli ] || { echo "layering: $src has no core/ or cli/"; exit 2; }
exit $bad
