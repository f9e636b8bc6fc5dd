# Sourced by the command-line tests (tests/*/cli_*.sh). Before sourcing set $bin (the
# ringtrain binary) and optionally $cmd (words put before the arguments, e.g. "bench comm").
#   expect CODE PATTERN ARGS...  ringtrain $cmd ARGS exits CODE with PATTERN (grep -E) in stdout+stderr
#   expect_done                  exits 1 if any expect failed
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect() {
  code=$1 pat=$2
  shift 2
  # shellcheck disable=SC2086 # $cmd is a list of words
  "$bin" ${cmd:-} "$@" >"$tmp/out" 2>&1
  got=$?
  if [ "$got" -ne "$code" ]; then
    echo "FAIL: ringtrain ${cmd:-} $* exited $got, expected $code"; cat "$tmp/out"; fails=$((fails + 1)); return
  fi
  if ! grep -Eq -- "$pat" "$tmp/out"; then
    echo "FAIL: ringtrain ${cmd:-} $*: output lacks /$pat/"; cat "$tmp/out"; fails=$((fails + 1)); return
  fi
  echo "ok: ringtrain ${cmd:-} $*"
}

expect_done() {
  [ "$fails" -eq 0 ] || { echo "$fails check(s) failed"; exit 1; }
  echo "all checks passed"
}
