#!/usr/bin/env bash
# `ringtrain bench p2p` on emulated GPUs (issue 42, item 7). The emulator's topology
# (RINGTRAIN_EMU_TOPOLOGY, tests/cuda_emu/topology.cpp) gives every copy a modelled time
# and events read an emulated clock, so the matrices are the model's numbers exactly
# (compared to 1e-4, float milliseconds), whatever the machine's load.
#
#   tests/emu/p2p.sh RINGTRAIN CASE
# CASE:
#   puzzle     the puzzle of docs/bench.md on 5 GPUs: GPU 0 -> 1 NVLink, -> 4 PCIe, -> 2
#              across sockets (no peer access): every entry of the peer-on and peer-off
#              matrices is the model's, 0 -> 1 > 0 -> 4 > 0 -> 2, and the reading names
#              0 -> 2 against 0 -> 1 and why (no peer access)
#   transpose  a one-way link (4>0 slower than 0>4): the matrix's rows are sources
#   one        1 GPU: the host rows are measured, the GPU -> GPU matrices say there is no pair
#   bad        a topology naming a device that does not exist stops, naming it
set -u
bin=$1
what=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
puzzle='0-1=nvlink,62.4,2;0-4=pcie,31.6,5;0-2=sys,5.04,10;host=25,5;pageable=10,10'

run() { # TOPOLOGY GPUS: bench p2p into $tmp/out, $tmp/p2p.json
  RINGTRAIN_EMU_TOPOLOGY=$1 RINGTRAIN_EMU_GPUS=$2 "$bin" bench p2p --device cuda --size 1M --iters 2 \
    --json "$tmp/p2p.json" >"$tmp/out" 2>&1 || { echo "FAIL: bench p2p exited $?"; cat "$tmp/out"; exit 1; }
  cat "$tmp/out"
}

case $what in
puzzle)
  run "$puzzle" 5
  python3 - "$tmp/p2p.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
m = d["matrices"]
n, size = 5, 1 << 20
host = (25.0, 5.0)
links = {(0, 1): ("nvlink", 62.4, 2), (0, 4): ("pcie", 31.6, 5), (0, 2): ("sys", 5.04, 10)}
def ns(gbps, us, b): return us * 1000 + b / gbps
def model(i, j, peer, b):
    l = links.get((min(i, j), max(i, j)))
    if l and (l[0] == "sys" or peer): return ns(l[1], l[2], b)
    return 2 * ns(*host, b)  # staged through host memory
bad = []
for peer, key, lat in ((False, "gpu_bw_peer_off_serial", "gpu_lat_peer_off"), (True, "gpu_bw_peer_on_serial", "gpu_lat_peer_on"),
                       (False, "gpu_bw_peer_off_concurrent", None), (True, "gpu_bw_peer_on_concurrent", None)):
    for i in range(n):
        for j in range(n):
            got = m[key]["values"][i][j]
            if i == j:
                if got is not None: bad.append((key, i, j, got, None))
                continue
            want = size / model(i, j, peer, size)  # bytes/ns = GB/s
            if abs(got - want) > 1e-4 * want: bad.append((key, i, j, got, want))
            if lat:
                got_us, want_us = m[lat]["values"][i][j], model(i, j, peer, 8) / 1000
                if abs(got_us - want_us) > 1e-4 * want_us: bad.append((lat, i, j, got_us, want_us))
for b in bad: print("FAIL: %s[%d][%d] = %s, the model says %s" % b)
on = m["gpu_bw_peer_on_serial"]["values"][0]
assert on[1] > on[4] > on[2], "GPU 0's copies not ranked 1 > 4 > 2 (NVLink, PCIe, sockets): %s" % on
links_json = d["links"]
assert links_json[0][1]["access"] == 1 and links_json[0][4]["access"] == 1 and links_json[0][2]["access"] == 0, links_json[0]
assert links_json[0][1]["atomics"] == 1 and links_json[0][4]["atomics"] == 0 and links_json[0][4]["rank"] == 1, links_json[0]
assert d["reading_matrix"] == "gpu_bw_peer_on_serial", d["reading_matrix"]
hb = m["host_bw_serial"]["values"]
assert all(abs(hb[g][c] - size / ns(*(host if c < 2 else (10.0, 10.0)), size)) < 1e-4 * hb[g][c] for g in range(n) for c in range(4)), hb
sys.exit(1 if bad else 0)
PY
  grep -Eq '^reading: GPU 0 -> 2 is 11\.6x slower than 0 -> 1: 0 -> 1 goes peer-to-peer with native atomics \(an NVLink\), 0 -> 2 goes without peer access' "$tmp/out" ||
    { echo "FAIL: the reading does not name 0 -> 2 against 0 -> 1 and why"; exit 1; }
  ;;
transpose)
  run "$puzzle;4>0=pcie,10,5" 5
  python3 - "$tmp/p2p.json" <<'PY' || exit 1
import json, sys
m = json.load(open(sys.argv[1]))["matrices"]
for key in ("gpu_bw_peer_on_serial", "gpu_bw_peer_on_concurrent"):
    v = m[key]["values"]
    # rows are sources: 0 -> 4 over the 31.6 GB/s link, 4 -> 0 over the 10 GB/s one
    assert v[0][4] > 2.5 * v[4][0], "%s: 0 -> 4 %.3f, 4 -> 0 %.3f: rows and columns swapped?" % (key, v[0][4], v[4][0])
PY
  ;;
one)
  run "" 1
  grep -q 'one GPU: no GPU pair to measure' "$tmp/out" || { echo "FAIL: no word that there is no GPU pair"; exit 1; }
  python3 - "$tmp/p2p.json" <<'PY' || exit 1
import json, sys
d = json.load(open(sys.argv[1]))
m = d["matrices"]
assert d["n"] == 1 and "one GPU" in d["note"] and "no GPU pair" in d["reading"], (d["n"], d["note"], d["reading"])
assert all(v is None for k in m if k.startswith("gpu_") for row in m[k]["values"] for v in row), "a GPU pair measured on one GPU"
assert all(v is not None and v > 0 for k in ("host_bw_serial", "host_bw_concurrent", "host_lat") for v in m[k]["values"][0]), "host rows not measured"
PY
  ;;
bad)
  if RINGTRAIN_EMU_TOPOLOGY='0-1=nvlink,50,2;0-7=pcie,20,5' RINGTRAIN_EMU_GPUS=5 "$bin" bench p2p --device cuda --size 1M \
    >"$tmp/out" 2>&1; then
    echo "FAIL: a topology naming device 7 of 5 was accepted"; exit 1
  fi
  grep -q "entry '0-7=pcie,20,5': device 7 does not exist (RINGTRAIN_EMU_GPUS=5: devices 0..4)" "$tmp/out" ||
    { echo "FAIL: the error does not name the entry and the device"; cat "$tmp/out"; exit 1; }
  RINGTRAIN_EMU_TOPOLOGY='0-1=fibre,50,2' RINGTRAIN_EMU_GPUS=2 "$bin" bench p2p --device cuda >"$tmp/out" 2>&1
  grep -q "the kind must be nvlink, pcie or sys" "$tmp/out" || { echo "FAIL: an unknown link kind"; cat "$tmp/out"; exit 1; }
  ;;
*) echo "unknown case $what"; exit 2 ;;
esac
echo "ok: bench p2p $what"
