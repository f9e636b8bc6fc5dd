#!/bin/sh
# `ringtrain bench model --layers` (docs/model.md): the per-layer table after the row, the
# "layers" list in the JSON (on a GPU: cli_bench_layers_gpu.sh).
# usage: cli_bench_layers.sh RINGTRAIN
set -u
bin=$1
out=$(mktemp) && err=$(mktemp) || exit 1
trap 'rm -f "$out" "$err"' EXIT
run="$bin bench model --arch resnet18 --width 4 --batch 2 --steps 1 --warmup 0 --layers"
$run >"$out" 2>"$err" || { cat "$err"; exit 1; }
for want in 'conv2d  *4->4 k3 s1 p1 on 7x7, n 2  *forward  *4 ' 'conv2d  *4->4 k3 s1 p1 on 7x7, n 2  *backward  *4 ' \
  'maxpool2d  *4 ch 14x14 k3 s2 p1, n 2  *forward' '^  all layers' '^  optimizer'; do
  grep -q -- "$want" "$out" || { echo "no line matching '$want' in:"; cat "$out"; exit 1; }
done
$run --json >"$out" 2>"$err" || { cat "$err"; exit 1; }
grep -q '"layers": \[{"kind": "conv2d", "shape": "1->4 k7 s2 p3 on 28x28, n 2", "pass": "forward"' "$out" ||
  { echo "no layers list in the JSON:"; cat "$out"; exit 1; }
exit 0
