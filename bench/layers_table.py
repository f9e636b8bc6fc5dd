#!/usr/bin/env python3
"""The per-layer tables of bench/layers.sh: ringtrain's own per-layer profile (`bench model
--layers`: the wall time of each layer call by shape and pass), then oneDNN's verbose execution times grouped by
primitive, pass and shape, with each row's FLOPs (from the shape), GFLOP/s and share of
the CPU's peak for the precision, plus the reorders and the time outside oneDNN (our
own loops, and the convolutions that src/model/cpu/conv_cpu.c runs as im2col + GEMM:
their FLOPs are the model's count less the oneDNN rows').

oneDNN's times are per primitive execution on the thread that ran it. ringtrain splits
a layer into per-thread parts that run at the same time (src/model/cpu/conv_dnnl.c), so
a row's wall time per step is its summed time / threads; the share of the peak compares
the row's FLOPs with that wall time and the peak of all threads. That holds on a quiet
machine only: where the threads cannot run at once, the parts run one after the other
and the rows read faster than the peak."""
import argparse
import collections
import json
import re


NOMINAL = ("FLOPs are nominal, as PyTorch counts them: every tap of the kernel, the zero padding's "
           "included. On 4x4 and 2x2 maps a 3x3 kernel with padding 1 has only 69% and 44% of its taps on "
           "the image; kernels that skip the rest do fewer operations, so those rows can read above 100%.")


def conv_flops(shape):
    """2 x multiply-adds of a convolution pass from oneDNN's problem descriptor
    (mbN_icNocN_ihNohNkhN..._iwNowNkwN...; g for groups)."""
    v = {k: int(n) for k, n in re.findall(r"(mb|g|ic|oc|oh|ow|kh|kw|od|kd)(\d+)", shape)}
    g = v.get("g", 1)
    return 2.0 * v["mb"] * v["oc"] * v["oh"] * v["ow"] * (v["ic"] // g) * v["kh"] * v["kw"] * v.get("od", 1) * v.get("kd", 1)


def parse_verbose(path, steps):
    """exec lines of the last `steps` steps (the warmup step's come first): rows keyed by
    (primitive, pass, datatypes, shape) with calls and summed ms"""
    lines = []
    with open(path) as f:
        for ln in f:
            if ln.startswith(("onednn_verbose,exec,", "dnnl_verbose,exec,")):
                lines.append(ln.rstrip("\n").split(","))
    n = len(lines)
    assert n % (steps + 1) == 0, "%s: %d exec lines for %d steps" % (path, n, steps + 1)
    lines = lines[n // (steps + 1):]
    rows = collections.OrderedDict()
    for p in lines:
        prim, impl, prop, mem, shape, ms = p[3], p[4], p[5], p[6], p[-2], float(p[-1])
        dt = " ".join(sorted({m.split("::")[0].split("_", 1)[1] for m in mem.split() if "::" in m and "undef" not in m}))
        key = (prim, prop if prim != "reorder" else "reorder", dt, shape)
        r = rows.setdefault(key, {"primitive": prim, "pass": key[1], "impl": impl, "types": dt, "shape": shape,
                                  "calls": 0, "ms": 0.0})
        r["calls"] += 1
        r["ms"] += ms
    return rows


def main():
    ap = argparse.ArgumentParser()
    for a in ("--dir", "--out", "--commit", "--batches", "--precisions"):
        ap.add_argument(a, required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--steps", type=int, required=True)
    a = ap.parse_args()
    peaks = {}
    with open(a.dir + "/peak.json") as f:
        for ln in f:
            r = json.loads(ln)
            peaks[r["precision"]] = r
    info = json.load(open(a.dir + "/info.json"))
    result = {"benchmark": "layers-cpu", "commit": a.commit, "info": info, "peak": peaks, "threads": a.threads,
              "steps": a.steps, "runs": [],
              "note": "oneDNN verbose times per primitive execution; per-step wall = summed ms / threads / steps"}
    for prec in a.precisions.split():
        peak = peaks.get(prec, {}).get("gflops") if peaks.get(prec, {}).get("available") else None
        for b in a.batches.split():
            model = json.loads(open("%s/model-%s-%s.json" % (a.dir, prec, b)).read().strip().splitlines()[-1])
            rows = parse_verbose("%s/verbose-%s-%s.txt" % (a.dir, prec, b), a.steps)
            table, dnnl_ms = [], 0.0
            for r in rows.values():
                wall = r["ms"] / a.threads / a.steps
                dnnl_ms += wall
                fl = conv_flops(r["shape"]) * r["calls"] / a.steps if r["primitive"] == "convolution" else 0.0
                gfs = fl / wall * 1e-6 if wall > 0 and fl else None
                table.append(dict(r, calls_per_step=r["calls"] / a.steps, ms_per_step=wall,
                                  gflop_per_step=fl * 1e-9, gflops=gfs,
                                  peak_share_percent=100.0 * gfs / peak if gfs and peak else None))
            step = model["step_ms"]
            prof = json.loads(open("%s/layers-%s-%s.json" % (a.dir, prec, b)).read().strip().splitlines()[-1])
            conv_gflop = sum(r["gflop_per_step"] for r in table)
            other_gflop = model["gflop_per_image"] * int(b) - conv_gflop
            run = {"precision": prec, "batch": int(b), "step_ms": step, "images_per_s": model["images_per_s"],
                   "gflop_per_image": model["gflop_per_image"], "gflops": model["gflops"],
                   "peak_gflops": peak, "peak_share_percent": model.get("peak_share_percent"),
                   "onednn_ms_per_step": dnnl_ms, "outside_onednn_ms_per_step": step - dnnl_ms,
                   "outside_onednn_gflop_per_step": other_gflop, "rows": table,
                   "profile_step_ms": prof["step_ms"], "profile_layers_ms_per_step": prof["layers_ms_per_step"],
                   "profile_optim_ms": prof["optim_ms"], "layers": prof["layers"]}
            result["runs"].append(run)
            print("\n== ResNet34 1x28x28, %s, batch %s, %d threads: step %.1f ms, %.1f GFLOP/s = %s of the %s peak "
                  "(%s GFLOP/s)" % (prec, b, a.threads, step, model["gflops"],
                                    "%.1f%%" % model["peak_share_percent"] if peak else "-", prec,
                                    "%.0f" % peak if peak else "-"))
            pstep = prof["step_ms"]
            print("ringtrain's per-layer profile (bench model --layers: step %.1f ms, layers %.1f ms, optimizer %.1f "
                  "ms), the rows over 1%% of the step, largest first:" % (pstep, prof["layers_ms_per_step"],
                                                                      prof["optim_ms"]))
            print("%-22s %-36s %-8s %6s %8s %6s %8s %7s" % ("layer", "shape", "pass", "calls", "ms/step", "%step",
                                                           "GFLOP/s", "%peak"))
            for r in sorted(prof["layers"], key=lambda r: -r["ms_per_step"]):
                if r["step_share_percent"] < 1.0:
                    continue
                print("%-22s %-36s %-8s %6.0f %8.2f %6.1f %8s %7s" % (
                    r["kind"], r["shape"], r["pass"], r["calls_per_step"], r["ms_per_step"], r["step_share_percent"],
                    "%.1f" % r["gflops"] if r["gflops"] else "-",
                    "%.1f" % r["peak_share_percent"] if r["peak_share_percent"] else "-"))
            print("oneDNN's primitives (ONEDNN_VERBOSE; its logging inflates the times):")
            print("%-10s %-16s %-9s %-52s %6s %8s %6s %8s %7s" % ("primitive", "pass", "types", "shape", "calls",
                                                                   "ms/step", "%step", "GFLOP/s", "%peak"))
            agg = collections.defaultdict(float)
            for r in sorted(table, key=lambda r: -r["ms_per_step"]):
                agg[r["pass"]] += r["ms_per_step"]
                if r["primitive"] == "convolution":
                    print("%-10s %-16s %-9s %-52s %6.0f %8.2f %6.1f %8.1f %7s" % (
                        r["primitive"], r["pass"], r["types"], r["shape"][:52], r["calls_per_step"], r["ms_per_step"],
                        100 * r["ms_per_step"] / step, r["gflops"] or 0,
                        "%.1f" % r["peak_share_percent"] if r["peak_share_percent"] else "-"))
            print("by pass: " + ", ".join("%s %.1f ms (%.1f%%)" % (k, v, 100 * v / step)
                                          for k, v in sorted(agg.items(), key=lambda kv: -kv[1])))
            print("outside oneDNN: %.1f ms (%.1f%%): batch norm, ReLU, pooling, loss, optimizer, and the "
                  "convolutions ringtrain runs as im2col + GEMM (%.2f GFLOP of the step's %.2f)"
                  % (step - dnnl_ms, 100 * (step - dnnl_ms) / step, other_gflop, model["gflop_per_image"] * int(b)))
    result["flops_note"] = NOMINAL
    json.dump(result, open(a.out, "w"), indent=1)
    print("\n" + NOMINAL)
    print("wrote", a.out)


if __name__ == "__main__":
    main()
