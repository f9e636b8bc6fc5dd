#!/usr/bin/env python3
"""Fit the modelled GPU step time (docs/gpu.md "Modelled step time") to measured H200 runs.

The model, per operation the emulated GPUs' cost ledger recorded (a kernel launch, a
cuDNN / cuBLAS / NCCL call, a copy or a fill), with F its FLOPs, B its device bytes read
plus written, P[math] the H200's peak for its arithmetic and BW the measured copy
bandwidth:

    t_op = max(F / (eta * P[math]), B / (beta * BW), h)      (h only where not captured
                                                               in a CUDA graph)
    T    = sum of t_op + h * graph_launches + sync_s * host_syncs

eta, beta and h are fitted (least squares of log T_model - log T_measured over the fit
rows, a grid then a local refinement); P, BW and sync_s are fixed (below). The result goes
to a calibration file that `ringtrain bench model` reads (RINGTRAIN_COST_CALIBRATION or
the newest bench/results/gpu-cost-calibration-*.json), with the fit's error on every
point, fitted or held out.

Inputs:
  --ledger FILE       rows of `ringtrain bench model --device cuda --json --ledger-ops` on
                      the emulated GPUs, one per configuration (stem, channels, size,
                      precision, batch), with their layer rows where they have them
                      (bench/gpu_ledger.py writes them); default: the newest committed
                      bench/results/gpu-ledger-*.json (a GPU machine has no emulated build)
  --measured FILE     measured steps on a GPU: bench/gpu.sh's JSON ("ringtrain" rows with
                      step_ms) or scripts/gpu-perf's ("summary" rows); repeatable
  --gpu-perf FILE     scripts/gpu-perf's JSON: its steps and its per-layer tables (the
                      ringtrain rows' "layers"): the per-layer fit below, with the ledger's
                      layer rows (what scripts/gpu-perf runs after its timings)
  --fit-precision P   the precisions whose step rows are fitted (repeatable). Per step:
                      default tf32 (bench/gpu.sh's bf16 rows measure an older bf16 path),
                      the others held out: predicted and reported, never fitted; each
                      fitted row is also predicted by a fit without it (leave-one-out).
                      Per layer: default every precision
  --hold-out-batch N  per layer: the step rows of batch N are held out (default 128)
  --layers-ledger FILE, --layers-measured FILE
                      the per-layer fit from other files: the first bench model rows with
                      "layers" (--layers --json --ledger-ops, emulated GPUs), the second a
                      GPU run's layer rows {kind, shape, pass, ms_per_step} (a list, bench
                      model rows with "layers", or scripts/gpu-perf's JSON); each matched
                      layer row is a point (without --gpu-perf or --also-fit-steps the step
                      rows are all held out)
  --hold-out N        per layer: every N-th layer row held out (default 5)
  --also-fit-steps    with --layers-*: fit the step rows of --fit-precision too
  --out FILE          the calibration JSON to write

python3 with numpy (/usr/bin/python3 has it).
"""
import argparse
import fnmatch
import json
import math
import os
import sys

import numpy as np

# H200 SXM, dense: fp32 FMA on CUDA cores, tf32 and bf16 tensor cores (NVIDIA's data
# sheet); the copy bandwidth as measured here (bench/gpu_ceilings.py's device copy,
# read + written) -- the peaks are fixed, the efficiencies eta and beta absorb the rest.
PEAK_FLOPS = {"fp32": 67e12, "tf32": 495e12, "bf16": 990e12}
BANDWIDTH = 4.3e12
SYNC_S = 20e-6  # not fitted: no fitted step has a host synchronisation
MATHS = ("none", "fp32", "tf32", "bf16")


OP_FIELDS = ("name", "kind", "math", "bytes_read", "bytes_written", "flops", "captured", "n")


def parse_size(r):
    """(channels, size) of a row: bench model's ints, or scripts/gpu-perf's "3x32x32" """
    size = r.get("size")
    if isinstance(size, str) and "x" in size:
        c, h = size.split("x")[:2]
        return int(c), int(h)
    ch = r.get("channels") or (3 if r.get("stem") == "cifar" else 1)
    return int(ch), int(size)


def config_key(r):
    ch, size = parse_size(r)
    return (r.get("stem"), ch, size, r.get("precision"), int(r["batch"]))


def ops_of(groups):
    """a row's ledger_ops: dicts, or lists in OP_FIELDS order (bench/gpu_ledger.py's compact form)"""
    return [g if isinstance(g, dict) else dict(zip(OP_FIELDS, g)) for g in groups]


class Ops:
    """One point's operations as arrays: F / P, B, n, captured; plus the per-step counts."""

    def __init__(self, groups, graph_launches=0, host_syncs=0):
        groups = ops_of(groups)
        self.fp = np.array([g["flops"] / PEAK_FLOPS[g["math"]] if g["math"] in PEAK_FLOPS else 0.0 for g in groups])
        self.b = np.array([g["bytes_read"] + g["bytes_written"] for g in groups], dtype=float)
        self.n = np.array([g["n"] for g in groups], dtype=float)
        self.host = np.array([0.0 if g.get("captured") else 1.0 for g in groups])
        self.graphs = graph_launches
        self.syncs = host_syncs

    def time(self, eta, beta, h):
        t = np.maximum(np.maximum(self.fp / eta, self.b / (beta * BANDWIDTH)), h * self.host)
        return float(np.dot(self.n, t)) + h * self.graphs + SYNC_S * self.syncs

    def times(self, eta, beta, hs):
        """time() for every h of the array hs at once"""
        base = np.maximum(self.fp / eta, self.b / (beta * BANDWIDTH))
        t = np.maximum(base[None, :], hs[:, None] * self.host[None, :])
        return t @ self.n + hs * self.graphs + SYNC_S * self.syncs

    def parts(self, eta, beta, h):
        """seconds where compute, bandwidth and host cost is the maximum"""
        c, m = self.fp / eta, self.b / (beta * BANDWIDTH)
        hh = h * self.host
        t = np.maximum(np.maximum(c, m), hh)
        out = {}
        for name, w in (("compute", (c >= m) & (c >= hh)), ("bandwidth", (m > c) & (m >= hh)), ("host", (hh > c) & (hh > m))):
            out[name] = float(np.dot(self.n[w], t[w]))
        return out


def op_time(g, eta, beta, h):
    """one group's time per operation (the same formula, for rankings)"""
    p = PEAK_FLOPS.get(g["math"])
    t = g["flops"] / (eta * p) if p else 0.0
    t = max(t, (g["bytes_read"] + g["bytes_written"]) / (beta * BANDWIDTH))
    return t if g.get("captured") else max(t, h)


def load_json(path):
    with open(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except json.JSONDecodeError:  # JSON lines (bench model's output as it prints it)
        return [json.loads(l) for l in text.splitlines() if l.strip()]


def as_rows(d):
    """{"rows": [...]}, a list of rows, or one row"""
    if isinstance(d, dict):
        return d["rows"] if "rows" in d else [d]
    return d


def ledger_rows(path):
    out = {}
    for r in as_rows(load_json(path)):
        if r.get("ledger_ops") is None:
            sys.exit(f"{path}: a row ({config_key(r)}) has no ledger_ops: run bench model with --ledger-ops on the "
                     "emulated GPUs (RINGTRAIN_CUDA=EMU build)")
        out[config_key(r)] = r
    return out


def measured_steps(paths):
    """{config key: (measured ms per step, file)} from bench/gpu.sh or scripts/gpu-perf JSON"""
    out = {}
    for path in paths:
        d = load_json(path)
        if isinstance(d, dict) and "ringtrain" in d:  # bench/gpu.sh
            for r in d["ringtrain"]:
                if r.get("step_ms"):
                    out[config_key(r)] = (r["step_ms"], path)
        elif isinstance(d, dict) and "summary" in d:  # scripts/gpu-perf
            for r in d["summary"]:
                ips = r.get("ringtrain_images_per_s")
                if ips:
                    out[config_key(r)] = (1e3 * int(r["batch"]) / ips, path)
        else:
            sys.exit(f"{path}: neither bench/gpu.sh's JSON (\"ringtrain\" rows) nor scripts/gpu-perf's (\"summary\")")
    return out


def layer_key(cfg, l):
    return cfg + (l["kind"], l["shape"], l["pass"])


def ledger_layers(path):
    """{(config..., kind, shape, pass): layer row} of the ledger rows that have layers"""
    led = {}
    for r in as_rows(load_json(path)):
        for l in r.get("layers") or []:
            if l.get("ledger_ops") is not None:
                led[layer_key(config_key(r), l)] = l
    return led


def measured_layers(path):
    """[(config key or None, layer row)]: scripts/gpu-perf's runs (their ringtrain rows'
    layers), bench model rows with "layers", or bare rows {kind, shape, pass, ms_per_step}"""
    d = load_json(path)
    rows = []
    if isinstance(d, dict) and "runs" in d:  # scripts/gpu-perf
        rows = [run.get("ringtrain") or {} for run in d["runs"].values()]
    else:
        rows = as_rows(d)
    out = []
    for r in rows:
        if "layers" in r:
            cfg = config_key(r) if r.get("batch") else None
            out += [(cfg, l) for l in r["layers"] or []]
        elif "kind" in r:
            out.append((None, r))
    return out


def layer_points(ledger_path, measured_path):
    """[(name, Ops, measured seconds)] for every measured layer row the ledger has"""
    led = ledger_layers(ledger_path)
    if not led:
        sys.exit(f"{ledger_path}: no layer rows with ledger_ops (bench/gpu_ledger.py keeps them for batch 256; "
                 "or `bench model --layers --json --ledger-ops` on the emulated GPUs)")
    points = []
    for cfg, m in measured_layers(measured_path):
        if not m.get("ms_per_step"):
            continue
        if cfg is not None:
            l = led.get(layer_key(cfg, m))
        else:  # no configuration given: the shape (with its batch) and pass decide
            l = next((v for k, v in led.items() if k[5:] == (m["kind"], m["shape"], m["pass"])), None)
        if l is None:
            continue
        name = "%s%s %s %s" % ("%s %s %s " % (cfg[0], cfg[3], cfg[4]) if cfg else "", m["kind"], m["shape"], m["pass"])
        points.append((name, Ops(l["ledger_ops"], 0, l.get("host_syncs_per_step", 0)), float(m["ms_per_step"]) * 1e-3))
    return points


def fit(points):
    """(eta, beta, h) minimising the squared log errors of points [(name, Ops, seconds)]"""
    if not points:
        sys.exit("nothing to fit: no configuration is in both the ledger and the measurements")
    etas = np.geomspace(0.01, 1.0, 61)
    betas = np.geomspace(0.05, 1.0, 41)
    hs = np.concatenate([[0.0], np.geomspace(0.5e-6, 60e-6, 80)])
    best = (math.inf, None)
    logm = np.array([math.log(p[2]) for p in points])
    for eta in etas:
        for beta in betas:
            pred = np.array([p[1].times(eta, beta, hs) for p in points])  # (points, hs)
            err = ((np.log(pred) - logm[:, None]) ** 2).sum(axis=0)
            k = int(np.argmin(err))
            if err[k] < best[0]:
                best = (float(err[k]), (float(eta), float(beta), float(hs[k])))
    x = np.array(best[1])
    # local refinement: coordinate search in log space, steps halving
    def loss(v):
        eta, beta, h = v
        if not (0 < eta <= 1 and 0 < beta <= 1 and h >= 0):
            return math.inf
        return sum((math.log(p[1].time(eta, beta, h)) - math.log(p[2])) ** 2 for p in points)

    step = np.array([0.1, 0.1, 0.1])
    cur = loss(x)
    while step.max() > 1e-4:
        moved = False
        for i in range(3):
            for sgn in (1, -1):
                y = x.copy()
                y[i] = y[i] * math.exp(sgn * step[i]) if y[i] > 0 else (1e-6 if sgn > 0 else 0)
                v = loss(y)
                if v < cur:
                    x, cur, moved = y, v, True
        if not moved:
            step /= 2
    return tuple(float(v) for v in x)


def report(points, params, held):
    rows = []
    for name, ops, meas in points:
        pred = ops.time(*params)
        parts = ops.parts(*params)
        rows.append({"point": name, "measured_ms": round(meas * 1e3, 4), "modelled_ms": round(pred * 1e3, 4),
                     "error_percent": round(100 * (pred - meas) / meas, 1), "held_out": held,
                     "ms_bound_by": {k: round(v * 1e3, 3) for k, v in parts.items()}})
    return rows


def rms(rows):
    return round(math.sqrt(sum(r["error_percent"] ** 2 for r in rows) / len(rows)), 1) if rows else None


def weighted(rows):
    """sum |modelled - measured| / sum measured: the error where the time is (small rows,
    whose relative errors dominate an rms, weigh what they cost)"""
    m = sum(r["measured_ms"] for r in rows)
    return round(100 * sum(abs(r["modelled_ms"] - r["measured_ms"]) for r in rows) / m, 1) if rows and m else None


def newest(pattern):
    """the newest committed bench/results file matching pattern (dates sort by name)"""
    d = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "results")
    names = sorted(n for n in os.listdir(d) if fnmatch.fnmatch(n, pattern)) if os.path.isdir(d) else []
    return os.path.join(d, names[-1]) if names else None


def step_points(led, meas, fit_prec, held_batches):
    """[(name, Ops, seconds, fitted?)] of the measured steps the ledger has"""
    out = []
    for key, (ms, _) in sorted(meas.items()):
        if key not in led:
            continue
        r = led[key]
        name = "%s %dx%dx%d %s batch %d" % (key[0], key[1], key[2], key[2], key[3], key[4])
        fitted = key[3] in fit_prec and key[4] not in held_batches
        out.append((name, Ops(r["ledger_ops"], r.get("graph_launches_per_step", 0), r.get("host_syncs_per_step", 0)),
                    ms * 1e-3, fitted))
    return out


def fit_layers(layers, steps, hold_out, fit_layer_rows):
    """the fitted step rows, and (fit_layer_rows) the layer rows but every hold_out-th; the
    rest held out"""
    fitted = [p for i, p in enumerate(layers) if fit_layer_rows and (hold_out <= 0 or i % hold_out != hold_out - 1)]
    held = [p for p in layers if p not in fitted]
    fit_steps = [s[:3] for s in steps if s[3]]
    params = fit(fitted + fit_steps)
    points = report(fit_steps + fitted, params, False) + report([s[:3] for s in steps if not s[3]], params, True)
    return params, points + report(held, params, True)


def fit_steps_only(steps):
    """per step: the unfitted rows held out, and each fitted row predicted without it"""
    fitted = [s[:3] for s in steps if s[3]]
    params = fit(fitted)
    points = report(fitted, params, False) + report([s[:3] for s in steps if not s[3]], params, True)
    for i, p in enumerate(fitted):
        if len(fitted) > 3:
            q = fit(fitted[:i] + fitted[i + 1:])
            points[i]["leave_one_out_error_percent"] = round(100 * (p[1].time(*q) - p[2]) / p[2], 1)
    return params, points


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ledger")
    ap.add_argument("--measured", action="append", default=[])
    ap.add_argument("--gpu-perf")
    ap.add_argument("--fit-precision", action="append", default=None)
    ap.add_argument("--hold-out-batch", action="append", type=int, default=None)
    ap.add_argument("--layers-ledger")
    ap.add_argument("--layers-measured")
    ap.add_argument("--hold-out", type=int, default=5)
    ap.add_argument("--also-fit-steps", action="store_true")
    ap.add_argument("--fit-layers", action="store_true")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    a.ledger = a.ledger or newest("gpu-ledger-*.json")
    if not a.ledger:
        sys.exit("no --ledger and no bench/results/gpu-ledger-*.json (bench/gpu_ledger.py writes one)")
    if a.gpu_perf:
        a.measured.append(a.gpu_perf)
        a.layers_measured = a.layers_measured or a.gpu_perf
        a.layers_ledger = a.layers_ledger or a.ledger
    per_layer = bool(a.layers_ledger or a.layers_measured)
    if per_layer and not (a.layers_ledger and a.layers_measured):
        sys.exit("--layers-ledger and --layers-measured go together")
    # per layer: every precision's steps (a GPU run of today's code), batch 128 held out;
    # per step: tf32's (bench/gpu.sh's bf16 rows measure an older bf16 path), no batch held out
    fit_prec = a.fit_precision or (["fp32", "tf32", "bf16"] if per_layer else ["tf32"])
    held_batches = a.hold_out_batch if a.hold_out_batch is not None else ([128] if per_layer else [])
    fit_layer_rows = a.fit_layers or (per_layer and not a.gpu_perf)
    if per_layer and not a.gpu_perf and not a.also_fit_steps:
        fit_prec = []  # --layers-* alone: the layers only, every step row held out
    steps = step_points(ledger_rows(a.ledger), measured_steps(a.measured), fit_prec, held_batches)
    if per_layer:
        params, points = fit_layers(layer_points(a.layers_ledger, a.layers_measured), steps, a.hold_out,
                                    fit_layer_rows)
        how = "step rows of %s (batch %s held out); layer rows %s" % (
            ", ".join(fit_prec) or "no precision", ", ".join(map(str, held_batches)) or "none",
            "fitted but every %d-th" % a.hold_out if fit_layer_rows else "held out (reported only)")
    else:
        params, points = fit_steps_only(steps)
        how = "step rows of precision %s; the others held out" % ", ".join(fit_prec)
    eta, beta, h = params
    fit_rows = [p for p in points if not p["held_out"]]
    held_rows = [p for p in points if p["held_out"]]
    step_names = {s[0] for s in steps}
    held_steps = [p for p in held_rows if p["point"] in step_names]
    held_layers = [p for p in held_rows if p["point"] not in step_names]
    out = {
        "what": "the modelled GPU step time's calibration (docs/gpu.md, Modelled step time), written by "
                "bench/gpu_cost_fit.py",
        "formula": "T = sum over operations of max(F/(eta*peak_flops[math]), B/(beta*bandwidth), h if not captured) "
                   "+ h*graph_launches + sync_s*host_syncs; F FLOPs, B device bytes read + written (the cost ledger)",
        "peak_flops": PEAK_FLOPS,
        "bandwidth_bytes_per_s": BANDWIDTH,
        "eta": round(eta, 5),
        "beta": round(beta, 5),
        "h_s": round(h, 9),
        "sync_s": SYNC_S,
        "fixed": "peak_flops (H200 data sheet, dense), bandwidth (measured device copy, read + written), "
                 "sync_s (a guess: no fitted step has a host synchronisation)",
        "fitted_on": how,
        "inputs": {"ledger": os.path.relpath(a.ledger), "measured": a.measured, "layers_ledger": a.layers_ledger,
                   "layers_measured": a.layers_measured},
        "fit_rms_error_percent": rms(fit_rows),
        "held_out_rms_error_percent": rms(held_rows),
        "held_out_steps_rms_error_percent": rms(held_steps),
        "held_out_layers_rms_error_percent": rms(held_layers),
        "held_out_layers_time_weighted_error_percent": weighted(held_layers),
        "points": points,
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("eta %.4f  beta %.4f  h %.2f us  (sync_s %.0f us fixed)" % (eta, beta, h * 1e6, SYNC_S * 1e6))
    print("%-44s %10s %10s %7s %7s  %s" % ("point", "measured", "modelled", "error", "LOO", "held out"))
    for p in points:
        loo = p.get("leave_one_out_error_percent")
        print("%-44s %8.3f ms %8.3f ms %6.1f%% %7s  %s" % (p["point"][:44], p["measured_ms"], p["modelled_ms"],
              p["error_percent"], "" if loo is None else "%.1f%%" % loo, "yes" if p["held_out"] else ""))
    print("rms error: fitted %s%%, held out %s%% (steps %s%%, layers %s%%; layers weighted by their time %s%%); "
          "wrote %s" % (out["fit_rms_error_percent"], out["held_out_rms_error_percent"],
                        out["held_out_steps_rms_error_percent"], out["held_out_layers_rms_error_percent"],
                        out["held_out_layers_time_weighted_error_percent"], a.out))


if __name__ == "__main__":
    main()
