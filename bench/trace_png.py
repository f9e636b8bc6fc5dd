#!/usr/bin/env python3
"""Draws a merged ringtrain trace (`ringtrain trace` output, Chrome trace-event JSON) as a
PNG timeline with gnuplot: one row per rank and track (nested spans of the main thread on
rows of their own), one box per span, labelled where it is wide enough.

    bench/trace_png.py TRACE.json OUT.png [TITLE]

This is how docs/trace-resnet34-2rank.png was made (docs/debugging.md): no browser or
Perfetto UI can be reached where ringtrain is built, and matplotlib is not installed there,
so gnuplot (already needed by `ringtrain report`) draws it. The file opens in Perfetto as is."""
import json
import subprocess
import sys

COLORS = {
    "step": "#dddddd", "data": "#999999", "h2d": "#c8a878", "forward": "#4a7fc1", "backward": "#e8913a",
    "wait for gradient all_reduce": "#d9423b", "scalars all_reduce": "#8e5ec4", "optimizer": "#4aa35a",
    "all_reduce bucket": "#2aa9a0", "wait for the step's scalars": "#b07cc6", "scalars + optimizer": "#7a9a3a",
    "evaluation": "#f2c94c", "checkpoint": "#6d6d6d", "barrier": "#333333", "clock alignment": "#aaaaaa",
}
TRACKS = {0: "main", 1: "comm", 2: "stream"}


def main():
    src, out = sys.argv[1], sys.argv[2]
    title = sys.argv[3] if len(sys.argv) > 3 else src
    evs = [e for e in json.load(open(src))["traceEvents"] if e["ph"] == "X"]
    if not evs:
        sys.exit("trace_png.py: %s has no spans" % src)
    t0 = min(e["ts"] for e in evs)
    # depth of each span on its track (nested spans of the main thread go one row down)
    rows = {}
    for key in sorted({(e["pid"], e["tid"]) for e in evs}):
        stack = []
        for e in sorted((e for e in evs if (e["pid"], e["tid"]) == key), key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1] <= e["ts"] + 1e-6:
                stack.pop()
            e["_depth"] = len(stack)
            stack.append(e["ts"] + e["dur"])
            rows.setdefault((key[0], key[1], e["_depth"]), True)
    order = sorted(rows)
    y = {k: len(order) - 1 - i for i, k in enumerate(order)}
    end = max(e["ts"] + e["dur"] for e in evs) - t0
    g = ['set terminal pngcairo size 1600,%d font "sans,10"' % (140 + 42 * len(order)),
         'set output "%s"' % out, 'set title "%s"' % title.replace('"', "'"),
         'set xlabel "ms (rank 0 clock)"', "set xrange [0:%f]" % (end / 1000.0 * 1.01),
         "set yrange [-0.6:%f]" % (len(order) - 0.4), "unset key", "set grid xtics",
         "set ytics (%s)" % ", ".join('"rank %d %s%s" %d' % (p, TRACKS.get(t, t), " +%d" % d if d else "", y[(p, t, d)])
                                     for (p, t, d) in order)]
    n = 1
    for e in evs:
        x0, x1 = (e["ts"] - t0) / 1000.0, (e["ts"] + e["dur"] - t0) / 1000.0
        yy = y[(e["pid"], e["tid"], e["_depth"])]
        c = COLORS.get(e["name"], "#bbbbbb")
        g.append('set object %d rect from %f,%f to %f,%f fc rgb "%s" fs solid 0.9 border lc rgb "#222222"'
                 % (n, x0, yy - 0.38, max(x1, x0 + end / 1e6), yy + 0.38, c))
        n += 1
        label = e["name"]
        if e["name"] == "all_reduce bucket":
            label = "b%d %.1f MB" % (e["args"]["bucket"], e["args"]["bytes"] / 1e6)
        if (x1 - x0) > end / 1000.0 * 0.012 * max(4, len(label)) / 4:
            g.append('set label "%s" at %f,%f center front font ",8"' % (label, (x0 + x1) / 2, yy))
    g.append("plot NaN")
    p = subprocess.run(["gnuplot"], input="\n".join(g) + "\n", text=True, capture_output=True)
    if p.returncode != 0:
        sys.exit("trace_png.py: gnuplot failed: " + p.stderr[-2000:])
    print("wrote", out)


if __name__ == "__main__":
    main()
