#!/usr/bin/env bash
# Collectives: `ringtrain bench comm` (2 ranks, all_reduce ring/naive/rsag over shm, ring
# over tcp; 4 ranks ring over shm) side by side with Open MPI's MPI_Allreduce
# (bench/comm_mpi.c, mpicc, mpirun -np 2 / -np 4) at the same sizes in the same run,
# as ratios (best of ROUNDS=3 alternating rounds for each side). Targets (2 ranks, one host): ring over shm >= 1.5x Open MPI's busbw at
# 16 MiB and above; 8-byte latency <= 2x Open MPI's. Writes
# bench/results/comm-<YYYYMMDD>.json with `ringtrain info --json`.
#
#   bench/comm.sh        (BUILD=build by default; MAX_SIZE=256M, MAX_SIZE4=16M)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${RINGTRAIN:-${BUILD:-build}/ringtrain}
max=${MAX_SIZE:-256M}
max4=${MAX_SIZE4:-16M}
[ -x "$bin" ] || { echo "comm.sh: $bin not found (make build, or set BUILD / RINGTRAIN)" >&2; exit 1; }
mkdir -p bench/results
out=bench/results/comm-$(date -u +%Y%m%d).json
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

to_bytes() { /usr/bin/python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))" "$1"; }
maxb=$(to_bytes "$max")
max4b=$(to_bytes "$max4")

rounds=${ROUNDS:-3}
info=$("$bin" info --json)
havempi=0
if command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
  mpicc -O2 -o "$tmp/comm_mpi" bench/comm_mpi.c
  havempi=1
else
  echo "comm.sh: no mpicc/mpirun (Debian: openmpi-bin libopenmpi-dev): reference skipped" >&2
fi
# the machine is noisy (shared cores): alternate ours and Open MPI for a few rounds
# and keep each one's best time per size, so both sides see the same conditions
for r in $(seq 1 "$rounds"); do
  "$bin" bench comm --nproc 2 --transport shm --max-size "$max" --algo all --json "$tmp/shm2.$r.json" >&2
  [ "$havempi" = 1 ] && mpirun --allow-run-as-root --oversubscribe -np 2 "$tmp/comm_mpi" 8 "$maxb" > "$tmp/mpi2.$r.json"
  "$bin" bench comm --nproc 4 --transport shm --max-size "$max4" --algo ring --json "$tmp/shm4.$r.json" >&2
  [ "$havempi" = 1 ] && mpirun --allow-run-as-root --oversubscribe -np 4 "$tmp/comm_mpi" 8 "$max4b" > "$tmp/mpi4.$r.json"
done
"$bin" bench comm --nproc 2 --transport tcp --max-size "$max" --algo ring --json "$tmp/tcp2.json" >&2
"$bin" bench comm --nproc 2 --transport shm --max-size 16M --compare --json "$tmp/compare2.json" >&2

/usr/bin/python3 - "$out" "$info" "$tmp" "$rounds" "$havempi" <<'PY'
import json, sys, os
out, info, tmp, rounds, havempi = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4]), sys.argv[5] == "1"
load = lambda p: json.load(open(p)) if os.path.exists(p) else None
def best_ours(name):
    docs = [load(f"{tmp}/{name}.{r}.json") for r in range(1, rounds + 1)]
    docs = [d for d in docs if d]
    best = {}
    for d in docs:
        for row in d["rows"]:
            k = (row["collective"], row["algo"], row["size"])
            if k not in best or row["time_us"] < best[k]["time_us"]:
                best[k] = row
    doc = dict(docs[0])
    doc["rows"] = list(best.values())
    doc["rounds"] = [d["rows"] for d in docs]
    return doc
def best_mpi(name):
    docs = [load(f"{tmp}/{name}.{r}.json") for r in range(1, rounds + 1)] if havempi else []
    docs = [d for d in docs if d]
    if not docs: return None
    best = {}
    for d in docs:
        for row in d:
            if row["size"] not in best or row["time_us"] < best[row["size"]]["time_us"]:
                best[row["size"]] = row
    return sorted(best.values(), key=lambda r: r["size"])
shm2, shm4 = best_ours("shm2"), best_ours("shm4")
tcp2, cmp2 = load(f"{tmp}/tcp2.json"), load(f"{tmp}/compare2.json")
m2, m4 = best_mpi("mpi2"), best_mpi("mpi4")
def pick(doc, algo="ring"):
    return {r["size"]: r for r in doc["rows"] if r["collective"] == "all_reduce" and r["algo"] == algo}
ring2, naive2, rsag2, tcpr, ring4 = pick(shm2), pick(shm2, "naive"), pick(shm2, "rsag"), pick(tcp2), pick(shm4)
mp2 = {r["size"]: r for r in (m2 or [])}
mp4 = {r["size"]: r for r in (m4 or [])}
summary = []
for size in sorted(ring2):
    r, m = ring2[size], mp2.get(size)
    summary.append({"ranks": 2, "size": size, "mpi_time_us": m and m["time_us"], "mpi_busbw": m and m["busbw_GBps"],
                    "shm_ring_time_us": r["time_us"], "shm_ring_busbw": r["busbw_GBps"],
                    "shm_naive_busbw": naive2[size]["busbw_GBps"], "shm_rsag_busbw": rsag2[size]["busbw_GBps"],
                    "tcp_ring_busbw": tcpr[size]["busbw_GBps"] if size in tcpr else None,
                    "busbw_ratio_vs_mpi": round(r["busbw_GBps"] / m["busbw_GBps"], 2) if m and m["busbw_GBps"] else None,
                    "time_ratio_vs_mpi": round(r["time_us"] / m["time_us"], 2) if m and m["time_us"] else None})
for size in sorted(ring4):
    r, m = ring4[size], mp4.get(size)
    summary.append({"ranks": 4, "size": size, "mpi_time_us": m and m["time_us"], "mpi_busbw": m and m["busbw_GBps"],
                    "shm_ring_time_us": r["time_us"], "shm_ring_busbw": r["busbw_GBps"],
                    "busbw_ratio_vs_mpi": round(r["busbw_GBps"] / m["busbw_GBps"], 2) if m and m["busbw_GBps"] else None,
                    "time_ratio_vs_mpi": round(r["time_us"] / m["time_us"], 2) if m and m["time_us"] else None})
big = [s for s in summary if s["ranks"] == 2 and s["size"] >= 16 << 20 and s["busbw_ratio_vs_mpi"]]
lat = next((s for s in summary if s["ranks"] == 2 and s["size"] == 8), None)
targets = {"busbw_ratio_min_at_16MiB_and_above": min((s["busbw_ratio_vs_mpi"] for s in big), default=None),
           "busbw_target": 1.5,
           "latency_8B_ratio": lat and lat["time_ratio_vs_mpi"], "latency_target": 2.0}
doc = {"benchmark": "comm",
       "note": "2 CPU cores shared with other jobs while measuring: absolute numbers are noisy. Ours and Open MPI "
               f"alternated for {rounds} rounds in the same script; each side's best time per size is kept. Ranks "
               "pinned one per core (ours: bench comm's default; Open MPI: mpirun's default binding). f32 SUM, "
               "time = mean of timed iterations on the slowest rank; busbw = algbw * 2(n-1)/n.",
       "info": info, "targets": targets, "summary": summary,
       "ringtrain": {"shm2": shm2, "tcp2": tcp2, "shm4": shm4, "compare2": cmp2}, "mpi": {"np2": m2, "np4": m4}}
with open(out, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
print(f"wrote {out}")
print("all_reduce f32, 2 ranks (busbw GB/s; ratio = ringtrain shm ring / Open MPI)")
print(f"{'size(B)':>10} {'mpi us':>9} {'ring us':>9} {'mpi bw':>7} {'shm ring':>8} {'naive':>6} {'rsag':>6} {'tcp ring':>8} {'bw ratio':>8} {'t ratio':>7}")
f = lambda v, p=2: "-" if v is None else f"{v:.{p}f}"
for s in summary:
    if s["ranks"] != 2 or (s["size"] not in (8, 1024, 65536) and s["size"] < 1 << 20): continue
    print(f"{s['size']:>10} {f(s['mpi_time_us'],1):>9} {f(s['shm_ring_time_us'],1):>9} {f(s['mpi_busbw']):>7} "
          f"{f(s['shm_ring_busbw']):>8} {f(s['shm_naive_busbw']):>6} {f(s['shm_rsag_busbw']):>6} "
          f"{f(s['tcp_ring_busbw']):>8} {f(s['busbw_ratio_vs_mpi']):>8} {f(s['time_ratio_vs_mpi']):>7}")
print(f"4 ranks shm ring vs Open MPI -np 4, busbw ratio at {max(ring4) if ring4 else 0} B: "
      f"{f(next((s['busbw_ratio_vs_mpi'] for s in summary if s['ranks'] == 4 and s['size'] == max(ring4)), None))}")
print(f"targets: busbw ratio >= 1.5 at >= 16 MiB: min {f(targets['busbw_ratio_min_at_16MiB_and_above'])}; "
      f"8-byte latency ratio <= 2: {f(targets['latency_8B_ratio'])}")
PY
