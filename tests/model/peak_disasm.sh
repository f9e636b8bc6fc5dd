#!/usr/bin/env bash
# The loops of `ringtrain bench peak` (src/cli/bench_peak.c) are what the peak's FLOP
# count assumes: in the binary's machine code each loop body holds exactly 12
# multiply-add instructions of its kind on distinct accumulators and one backward branch,
# so neither the compiler nor a careless edit can have folded or shortened them (the
# kernel here has no instruction counter to check it at run time). Then a short run
# reports a positive fp32 peak. Usage: peak_disasm.sh RINGTRAIN_BINARY
set -euo pipefail
bin=$1
command -v objdump >/dev/null || { echo "SKIP: no objdump (binutils)"; exit 77; }
dis=$(objdump -d --no-show-raw-insn "$bin")
fail=0
check() { # symbol instruction register-prefix
  local body n acc back
  body=$(awk -v s="<$1>:" '$2 == s {on = 1; next} on && NF == 0 {exit} on' <<<"$dis")
  [ -n "$body" ] || { echo "FAIL: $1 not found in $bin"; fail=1; return; }
  n=$(grep -c -- "$2 " <<<"$body" || true)
  acc=$(grep -- "$2 " <<<"$body" | sed -E 's/.*,%//' | sort -u | wc -l)
  back=$(grep -cE '\sj(ne|nz)\s' <<<"$body" || true)
  if [ "$n" -ne 12 ] || [ "$acc" -ne 12 ] || [ "$back" -ne 1 ] || ! grep -q -- "%$3" <<<"$body"; then
    echo "FAIL: $1: $n x $2 on $acc accumulators, $back loop branches (expected 12, 12, 1, on $3 registers)"
    echo "$body"
    fail=1
  else
    echo "ok: $1: 12 x $2 on 12 $3 accumulators, one loop"
  fi
}
check rt_peak_loop_fma512 vfmadd231ps zmm
check rt_peak_loop_fma256 vfmadd231ps ymm
check rt_peak_loop_dpbf16 vdpbf16ps zmm
out=$("$bin" bench peak --json --seconds 0.01 --repeats 1)
echo "$out"
grep -qE '"precision": "fp32", "available": true, .*"gflops": [1-9]' <<<"$out" ||
  { echo "FAIL: no positive fp32 peak"; fail=1; }
grep -qE '"precision": "bf16", "available": (true|false)' <<<"$out" || { echo "FAIL: no bf16 row"; fail=1; }
exit $fail
