#!/usr/bin/env python3
"""The tables of bench/kernels.sh: the kernels' fp32 and bf16 times per shape and pass
(best of the rounds), their bf16/fp32 ratios per library and the best of all libraries,
then a bf16 step projected from ringtrain's measured fp32 step (the run with the best
step time) by dividing each convolution row of its per-layer profile by the best kernel
ratio of its shape and pass, and the same with the nominal 2x for every convolution.
Everything outside the convolutions (batch norm, pooling, relu, the loss, the optimizer)
is kept as measured in fp32: under autocast semantics it stays fp32."""
import argparse
import collections
import json

# ringtrain's dense layers at 1x28x28 (docs/model.md): their products are the matmuls
DENSE = {"256->256 k3 s1 p1 on 2x2": "layer3", "512->512 k3 s1 p1 on 1x1": "layer4"}
NOMINAL = 2.0


def main():
    ap = argparse.ArgumentParser()
    for a in ("--kernels", "--steps", "--info", "--commit", "--out"):
        ap.add_argument(a, required=True)
    o = ap.parse_args()
    rows = [json.loads(ln) for ln in open(o.kernels) if ln.strip()]
    steps = [json.loads(ln) for ln in open(o.steps) if ln.strip()]
    best = {}
    for r in rows:
        if "error" in r:
            continue
        k = (r["lib"], r["op"], r["shape"], r["pass"], r["precision"])
        if k not in best or r["ms"] < best[k]["ms"]:
            best[k] = r
    libs = sorted({k[0] for k in best})
    keys = []
    for r in rows:
        k = (r["op"], r["shape"], r["pass"])
        if k not in keys:
            keys.append(k)

    def ms(lib, op, shape, ps, prec):
        r = best.get((lib, op, shape, ps, prec))
        return r["ms"] if r else None

    def fastest(op, shape, passes, prec):
        """the best library's summed time of the passes (None if no library has them all)"""
        t = [sum(ms(lib, op, shape, p, prec) for p in passes) for lib in libs
             if all(ms(lib, op, shape, p, prec) for p in passes)]
        return min(t) if t else None

    print("kernels alone, one thread, ms (best of the rounds); bf16/fp32 = fp32 time / bf16 time")
    hdr = "%-70s %-17s" % ("op and shape", "pass")
    for lib in libs:
        hdr += " | %-7s %7s %5s" % (lib, "", "")
    print(hdr + " | best ratio")
    table = []
    for op, shape, ps in keys:
        line = "%-70s %-17s" % (op + " " + shape, ps)
        entry = {"op": op, "shape": shape, "pass": ps}
        for lib in libs:
            f, b = ms(lib, op, shape, ps, "fp32"), ms(lib, op, shape, ps, "bf16")
            line += " | %7s %7s %5s" % ("%.3f" % f if f else "-", "%.3f" % b if b else "-",
                                        "%.2f" % (f / b) if f and b else "-")
            entry[lib] = {"fp32_ms": f, "bf16_ms": b}
        f, b = fastest(op, shape, [ps], "fp32"), fastest(op, shape, [ps], "bf16")
        entry["best_ratio"] = f / b if f and b else None
        line += " | %s" % ("%.2f" % entry["best_ratio"] if entry["best_ratio"] else "-")
        table.append(entry)
        print(line)

    def ratio(shape, ps, batch, threads):
        """the best kernel ratio for a ringtrain conv row (shape without ', n N'; pass
        forward or backward = backward-data + backward-weights) at this batch split in
        `threads` parts; None: not probed"""
        passes = ["forward"] if ps == "forward" else ["backward-data", "backward-weights"]
        cands = []
        probe = "n%d %s" % (batch // threads, shape)
        f, b = fastest("conv", probe, passes, "fp32"), fastest("conv", probe, passes, "bf16")
        if f and b:
            cands.append(f / b)
        if shape in DENSE:
            mm = [k for k in keys if k[0] == "matmul" and DENSE[shape] in k[1] and k[1].startswith("%dx" % batch)]
            for _, mshape, mp in mm:
                f, b = fastest("matmul", mshape, [mp], "fp32"), fastest("matmul", mshape, [mp], "bf16")
                if f and b:
                    cands.append(f / b)
        return max(cands) if cands else None

    summaries, projections = [], []
    for batch in sorted({s["batch"] for s in steps}):
        f32 = [s for s in steps if s["batch"] == batch and s.get("precision") == "fp32"]
        b16 = [s for s in steps if s["batch"] == batch and s.get("precision") == "bf16"]
        if not f32:
            continue
        sf = min(f32, key=lambda s: s["step_ms"])
        sb = min(b16, key=lambda s: s["step_ms"]) if b16 else None
        conv_ms = proj = 0.0
        per = []
        for L in sf["layers"]:
            if L["kind"] != "conv2d":
                continue
            shape = L["shape"].rsplit(", n ", 1)[0]
            r = ratio(shape, L["pass"], batch, sf["threads"])
            conv_ms += L["ms_per_step"]
            proj += L["ms_per_step"] / (r or NOMINAL)
            bl = next((x for x in (sb["layers"] if sb else []) if x["kind"] == "conv2d" and x["shape"] == L["shape"]
                       and x["pass"] == L["pass"]), None)
            per.append({"batch": batch, "shape": L["shape"], "pass": L["pass"], "fp32_ms": L["ms_per_step"],
                        "kernel_ratio": r, "projected_bf16_ms": L["ms_per_step"] / (r or NOMINAL),
                        "measured_bf16_ms": bl["ms_per_step"] if bl else None})
        rest = sf["step_ms"] - conv_ms
        p_kern = rest + proj
        p_nom = rest + conv_ms / NOMINAL
        print()
        print("ringtrain, ResNet34 1x28x28, batch %d, %d threads (per-layer profile; the fastest run of each precision)"
              % (batch, sf["threads"]))
        print("  %-44s %-8s %8s %6s %9s %9s" % ("conv layer", "pass", "fp32 ms", "ratio", "proj bf16", "bf16 ms"))
        for p in per:
            print("  %-44s %-8s %8.3f %6s %9.3f %9s" % (
                p["shape"], p["pass"], p["fp32_ms"], "%.2f" % p["kernel_ratio"] if p["kernel_ratio"] else "(2.00)",
                p["projected_bf16_ms"], "%.3f" % p["measured_bf16_ms"] if p["measured_bf16_ms"] else "-"))
        sm = {
            "batch": batch, "fp32_step_ms": sf["step_ms"], "fp32_conv_ms": conv_ms, "fp32_rest_ms": rest,
            "fp32_optim_ms": sf.get("optim_ms"),
            "bf16_step_ms": sb["step_ms"] if sb else None,
            "measured_ratio": sf["step_ms"] / sb["step_ms"] if sb else None,
            "projected_bf16_step_ms_kernels": p_kern, "ceiling_ratio_kernels": sf["step_ms"] / p_kern,
            "projected_bf16_step_ms_nominal": p_nom, "ceiling_ratio_nominal": sf["step_ms"] / p_nom,
        }
        print("fp32 step %.1f ms: convolutions %.1f, the rest %.1f (optimizer %.1f)" %
              (sf["step_ms"], conv_ms, rest, sf.get("optim_ms") or 0))
        if sb:
            print("bf16 step measured %.1f ms: %.2fx fp32" % (sb["step_ms"], sm["measured_ratio"]))
        print("bf16 step with these kernels, conversions and layouts free: %.1f ms: %.2fx fp32" %
              (p_kern, sm["ceiling_ratio_kernels"]))
        print("bf16 step with every convolution exactly 2x: %.1f ms: %.2fx fp32" % (p_nom, sm["ceiling_ratio_nominal"]))
        summaries.append(sm)
        projections += per
    if not summaries:
        raise SystemExit("kernels_table.py: no fp32 step in %s" % o.steps)
    info = json.load(open(o.info))
    json.dump({"benchmark": "kernels", "commit": o.commit, "info": info, "kernels": rows, "kernel_table": table,
               "steps": steps, "projection": projections, "summary": summaries,
               "note": "kernels alone on one thread (bench/kernels/*.c) against ringtrain's steps in the same run, "
                       "interleaved; the projection keeps everything but the convolutions at its fp32 time"},
              open(o.out, "w"), indent=1)
    print("wrote", o.out)


if __name__ == "__main__":
    main()
