#!/usr/bin/env bash
# scripts/gpu-perf --emu BUILD on an emulated-GPU build: every configuration of both tiers
# runs (ResNet18, tiny), and the JSON has what docs/gpu.md promises: a summary row per
# configuration with the fields the issue names, the per-layer table and the algorithms
# chosen in tier 1's batch-256 rows, the PyTorch side null with the reason where torch has
# no CUDA. Without --emu on a machine without a GPU it exits 77. The Python helpers it
# runs on a GPU (bench/gpu_torch.py, bench/gpu_ceilings.py) must at least compile.
# usage: gpu_perf_emu.sh BUILD
set -u
build=$1
root=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
/usr/bin/python3 -m py_compile "$root/bench/gpu_torch.py" "$root/bench/gpu_ceilings.py" "$root/scripts/gpu-perf" ||
  fail "a GPU-side Python script does not compile"
if ! command -v nvidia-smi >/dev/null 2>&1; then
  "$root/scripts/gpu-perf" --out "$tmp/none.json" --logs "$tmp/none" >/dev/null 2>&1
  rc=$?
  [ $rc -eq 77 ] || fail "without a GPU and without --emu: exit $rc, expected 77"
fi
"$root/scripts/gpu-perf" --emu "$build" --out "$tmp/perf.json" --logs "$tmp/logs" > "$tmp/out.txt" 2>&1
rc=$?
cat "$tmp/out.txt"
[ $rc -eq 0 ] || { for f in "$tmp"/logs/rt-*.log; do tail -5 "$f"; done; fail "gpu-perf --emu exited $rc"; }
/usr/bin/python3 - "$tmp/perf.json" <<'PY' || fail "gpu-perf's JSON"
import json, sys
d = json.load(open(sys.argv[1]))
need = ["stem", "size", "precision", "batch", "graphs", "ringtrain_images_per_s", "ringtrain_graphed_images_per_s",
        "torch_eager_images_per_s",
        "torch_channels_last_images_per_s", "torch_graphed_images_per_s", "ringtrain_peak_gpu_mb",
        "torch_channels_last_peak_gpu_mb"]
rows = d["summary"]
assert len(rows) == 10, f"{len(rows)} summary rows, expected 10 (6 of tier 1, 4 of tier 2)"
for r in rows:
    missing = [k for k in need if k not in r]
    assert not missing, f"summary row {r['stem']} {r['precision']} {r['batch']} lacks {missing}"
    assert r["ringtrain_images_per_s"] and r["ringtrain_images_per_s"] > 0, r
key = lambda r: (r["stem"], r["precision"], r["tier"])
assert len({key(r) + (r["batch"],) for r in rows}) == 10, "two rows of one configuration"
for t, run in d["runs"].items():
    rt = run["ringtrain"]
    if run["tier"] == 1 and run["layers"]:
        assert rt.get("layers") and rt.get("conv_algos"), f"{t}: no per-layer table or algorithms"
        assert "pair of CUDA events" in rt["layers_timing"], rt["layers_timing"]
    if run["tier"] == 1:
        g = run.get("ringtrain_graphed", {})
        assert g.get("images_per_s") and g.get("graphs") is True, f"{t}: no graphed ringtrain run: {g}"
    if run["tier"] == 1 and run["batch"] == 4:
        for k in ("ringtrain_heuristic", "ringtrain_timed_deterministic"):
            assert run.get(k, {}).get("images_per_s"), f"{t}: tier 2's {k} run is missing"
    if run["tier"] == 1 and run["precision"] == "bf16":
        assert run.get("ringtrain_nchw", {}).get("images_per_s"), f"{t}: tier 2's NCHW bf16 run is missing"
if d.get("torch_skipped"):
    assert all(r["torch_graphed_images_per_s"] is None for r in rows), "a PyTorch figure without PyTorch"
assert d["calibration"] == {"skipped": "emulated GPUs (--emu): no measured times"}, d["calibration"]
assert d["check"]["passed"] is None and d["cut_by_budget"] == [] or all("compile" in c for c in d["cut_by_budget"])
print(f"gpu-perf --emu: {len(rows)} summary rows, per-layer tables in tier 1, JSON as documented")
PY
echo "ok"
