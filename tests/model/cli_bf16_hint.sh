#!/bin/sh
# precision bf16 where the CPU convolutions cannot use bf16 instructions: a warning says
# bf16 is emulated (same results, no faster than fp32), one line for the run's context, and `ringtrain info` says
# "bf16 emulated"; where they can, neither. ONEDNN_MAX_CPU_ISA=AVX2 takes oneDNN's bf16
# kernels away on any CPU. The native case is checked where /proc/cpuinfo lists
# avx512_bf16 and the build has oneDNN (else it is the emulated case too).
# usage: cli_bf16_hint.sh RINGTRAIN
set -u
bin=$1
# what the caller's environment could set that changes the answer
unset RINGTRAIN_CONV ONEDNN_MAX_CPU_ISA DNNL_MAX_CPU_ISA RINGTRAIN_LOG_LEVEL
err=$(mktemp) && out=$(mktemp) || exit 1
trap 'rm -f "$err" "$out"' EXIT
run="$bin bench model --arch resnet18 --width 4 --batch 2 --steps 1 --warmup 0 --precision bf16"
ONEDNN_MAX_CPU_ISA=AVX2 $run >"$out" 2>"$err" || { cat "$err"; exit 1; }
n=$(grep -c "precision bf16 on this CPU: .*so bf16 is emulated" "$err")
[ "$n" = 1 ] || { echo "ONEDNN_MAX_CPU_ISA=AVX2: $n emulation warnings (expected 1):"; cat "$err"; exit 1; }
ONEDNN_MAX_CPU_ISA=AVX2 "$bin" info >"$out" 2>"$err" || { cat "$err"; exit 1; }
grep -q "^  cpu .*bf16 emulated (" "$out" || { echo "info under ONEDNN_MAX_CPU_ISA=AVX2:"; cat "$out"; exit 1; }
# fp32 never warns
ONEDNN_MAX_CPU_ISA=AVX2 $run --precision fp32 >"$out" 2>"$err" || { cat "$err"; exit 1; }
if grep -q "bf16 is emulated" "$err"; then echo "fp32 run warned about bf16:"; cat "$err"; exit 1; fi
native=0
grep -qw avx512_bf16 /proc/cpuinfo 2>/dev/null && "$bin" info | grep -q "oneDNN  *[0-9]" && native=1
$run >"$out" 2>"$err" || { cat "$err"; exit 1; }
"$bin" info >"$out" 2>/dev/null
if [ "$native" = 1 ]; then
  if grep -q "bf16 is emulated" "$err"; then echo "AVX-512 BF16 CPU, oneDNN built: warned anyway:"; cat "$err"; exit 1; fi
  grep -q "^  cpu .*bf16 native (avx512_core_bf16\|^  cpu .*bf16 native (avx512_core_amx" "$out" ||
    { echo "info on an AVX-512 BF16 CPU:"; cat "$out"; exit 1; }
else
  grep -q "so bf16 is emulated" "$err" || { echo "no AVX-512 BF16 or no oneDNN, no warning:"; cat "$err"; exit 1; }
  grep -q "^  cpu .*bf16 emulated (" "$out" || { cat "$out"; exit 1; }
fi
echo "bf16 hint: emulated case warned once, native=$native case as expected"
