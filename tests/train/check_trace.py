"""Checks `ringtrain trace`'s output against the Chrome trace-event format and what a
traced ringtrain run must show (tests/train/trace.sh, docs/debugging.md).

    check_trace.py TRACE.json WORLD MODE [MODE...]
MODE: overlap (a bucket all-reduce overlaps backward in some step), nooverlap (none
does), stream (every rank has the GPU stream track), steps=A:B (every span's step in A..B),
full (the spans of a whole run are there: evaluation, checkpoint, barrier...)."""
import json
import sys

EPS = 0.0005  # microseconds: the file's times are whole nanoseconds


def fail(msg):
    print("FAIL: " + msg)
    sys.exit(1)


path, world, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
with open(path) as f:
    doc = json.load(f)
evs = doc.get("traceEvents")
if not isinstance(evs, list) or not evs:
    fail("no traceEvents list")
procs, threads, spans = {}, {}, []
for e in evs:
    for k in ("ph", "name", "pid", "tid"):
        if k not in e:
            fail("event without %r: %r" % (k, e))
    if e["ph"] == "M":
        if e["name"] == "process_name":
            procs[e["pid"]] = e["args"]["name"]
        elif e["name"] == "thread_name":
            threads[(e["pid"], e["tid"])] = e["args"]["name"]
    elif e["ph"] == "X":
        for k in ("ts", "dur"):
            if not isinstance(e.get(k), (int, float)) or e[k] < 0:
                fail("X event with a bad %r: %r" % (k, e))
        if not isinstance(e.get("args", {}).get("step"), int):
            fail("X event without args.step: %r" % e)
        spans.append(e)
    else:
        fail("unexpected phase %r" % e["ph"])
if sorted(procs) != list(range(world)):
    fail("processes %r, expected ranks 0..%d" % (sorted(procs), world - 1))
used = {(e["pid"], e["tid"]) for e in spans}
if sorted({p for p, _ in used}) != list(range(world)):
    fail("ranks with spans: %r, expected 0..%d" % (sorted({p for p, _ in used}), world - 1))
for key in used:
    if key not in threads:
        fail("track %r has spans but no thread_name" % (key,))

# one track: every two spans are nested or disjoint (no partial overlap)
for key in sorted(used):
    track = sorted((e for e in spans if (e["pid"], e["tid"]) == key), key=lambda e: (e["ts"], -e["dur"]))
    stack = []
    for e in track:
        end = e["ts"] + e["dur"]
        while stack and stack[-1][0] <= e["ts"] + EPS:
            stack.pop()
        if stack and end > stack[-1][0] + EPS:
            fail("rank %d track %d: %r [%.3f, %.3f] overlaps %r partly (it ends at %.3f)"
                 % (key[0], key[1], e["name"], e["ts"], end, stack[-1][1], stack[-1][0]))
        stack.append((end, e["name"]))

by_rank = {r: [e for e in spans if e["pid"] == r] for r in range(world)}
buckets = [e for e in spans if e["name"] == "all_reduce bucket"]
for b in buckets:
    a = b["args"]
    if not (isinstance(a.get("bucket"), int) and a.get("bytes", 0) > 0 and a.get("algo")):
        fail("bucket span without bucket/bytes/algo: %r" % b)


def overlaps(rank):
    """(step, bucket) pairs whose all-reduce overlaps that step's backward (the host's)"""
    bwd = {}
    for e in by_rank[rank]:
        if e["name"] == "backward" and e["tid"] == 0:
            bwd[e["args"]["step"]] = (e["ts"], e["ts"] + e["dur"])
    out = []
    for b in buckets:
        if b["pid"] != rank or b["args"]["step"] not in bwd:
            continue
        lo, hi = bwd[b["args"]["step"]]
        if min(hi, b["ts"] + b["dur"]) - max(lo, b["ts"]) > EPS:
            out.append((b["args"]["step"], b["args"]["bucket"]))
    return out


for m in modes:
    if m == "full":
        need = ["data", "h2d", "forward", "backward", "wait for gradient all_reduce", "scalars all_reduce",
                "optimizer", "step", "evaluation", "checkpoint", "barrier", "clock alignment", "all_reduce bucket"]
        for r in range(world):
            names = {e["name"] for e in by_rank[r]}
            missing = [n for n in need if n not in names]
            if missing:
                fail("rank %d has no span %r" % (r, missing))
        if not any(e["tid"] == 1 for e in buckets):
            fail("bucket spans are not on the comm track (tid 1)")
        # every step's gradients were all-reduced (on a GPU their spans are recorded a
        # step late: none may be lost at an epoch's or the run's end)
        for r in range(world):
            steps = {e["args"]["step"] for e in by_rank[r] if e["name"] == "step"}
            with_b = {e["args"]["step"] for e in buckets if e["pid"] == r}
            if steps != with_b:
                fail("rank %d: steps without bucket spans %r, bucket spans of no step %r"
                     % (r, sorted(steps - with_b)[:5], sorted(with_b - steps)[:5]))
        # an epoch's evaluation belongs to the step it follows: its epoch's last step
        for r in range(world):
            last = {}
            for e in by_rank[r]:
                if e["name"] == "step":
                    ep = e["args"]["epoch"]
                    last[ep] = max(last.get(ep, 0), e["args"]["step"])
            for e in by_rank[r]:
                if e["name"] == "evaluation" and e["args"]["step"] != last.get(e["args"]["epoch"]):
                    fail("rank %d: the evaluation of epoch %d is tagged step %d, its last step is %r"
                         % (r, e["args"]["epoch"], e["args"]["step"], last.get(e["args"]["epoch"])))
    elif m == "overlap":
        if not any(overlaps(r) for r in range(world)):
            fail("no bucket all-reduce overlaps backward in any step")
    elif m == "nooverlap":
        for r in range(world):
            if overlaps(r):
                fail("rank %d: bucket all-reduces overlap backward: %r" % (r, overlaps(r)[:5]))
        if not buckets:
            fail("no bucket spans at all")
    elif m == "stream":
        for r in range(world):
            st = {e["name"] for e in by_rank[r] if e["tid"] == 2}
            if not {"forward", "backward", "h2d"} <= st:
                fail("rank %d: the GPU stream track has %r" % (r, sorted(st)))
            if "stream" not in threads.get((r, 2), "").lower():
                fail("rank %d: tid 2 is named %r" % (r, threads.get((r, 2))))
    elif m.startswith("steps="):
        lo, hi = map(int, m[6:].split(":"))
        got = sorted({e["args"]["step"] for e in spans})
        if not got or got[0] < lo or got[-1] > hi:
            fail("--steps %d:%d kept steps %r" % (lo, hi, got))
    else:
        fail("unknown mode %r" % m)
print("ok: %s (%d ranks, %d spans, modes %s)" % (path, world, len(spans), " ".join(modes)))
