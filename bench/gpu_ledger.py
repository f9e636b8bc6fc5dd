#!/usr/bin/env python3
"""Where a ResNet34 GPU step's bytes, calls and modelled time go, from the emulated GPUs'
cost ledger (docs/gpu.md "The cost ledger"; no GPU needed).

Runs `ringtrain bench model --device cuda --json --ledger-ops --layers` of an emulated-GPU
build (RINGTRAIN_CUDA=EMU) in count-only mode (RINGTRAIN_EMU_LEDGER=count: the emulation
records every operation and skips its arithmetic) for ResNet34 at 3x32x32 (cifar stem)
and 1x28x28 (imagenet stem), fp32 / tf32 / bf16, batch 128 and 256, one process per
input and precision. Prints the per-step totals and, for each configuration, the ranking
of where the step's bytes, launches + library calls and modelled time go, by operation
(conv forward / backward data / backward filter, batch norm, elementwise, bf16 casts,
optimizer, ...) and by layer kind and pass; writes bench/results/gpu-ledger-<date>.json
(or --out FILE) with the rows (each with its step's operations, grouped, as lists in
gpu_cost_fit.OP_FIELDS order; the rows at --layers-batch, default 256, with their layer rows
and operations too: what bench/gpu_cost_fit.py --gpu-perf fits the per-layer tables with)
and the rankings.
Modelled times use the build's calibration (bench/gpu_cost_fit.py writes it); without one
they are null.

  bench/gpu_ledger.py [--build build-emu] [--out FILE] [--batches 128,256]
                      [--precisions fp32,tf32,bf16] [--inputs cifar,imagenet] [--layers-batch 256]
                      [--graphs]
--graphs: the step as `ringtrain train` replays it (train.cuda_graphs: two graph launches
around one host synchronisation; bench model --graphs), without layer rows; the file is
bench/results/gpu-ledger-graphs-<date>.json.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_cost_fit  # noqa: E402  (the model's formula, one copy)

INPUTS = {"cifar": ("cifar", 3, 32), "imagenet": ("imagenet", 1, 28)}

# operation name -> category of the ranking
CATEGORIES = [
    ("cudnnConvolutionForward", "conv forward"),
    ("cudnnConvolutionBackwardData", "conv backward data"),
    ("cudnnConvolutionBackwardFilter", "conv backward filter"),
    ("cudnnConvolutionBackwardBias", "conv bias"),
    ("cudnnAddTensor", "conv bias"),
    ("cudnnBatchNormalizationForward", "batch norm forward"),
    ("cudnnBatchNormalizationBackward", "batch norm backward"),
    ("increment_i64_kernel", "batch norm step counter"),
    ("bn_stats_kernel", "batch norm forward"),
    ("bn_eval_factors_kernel", "batch norm forward"),
    ("bn_apply_kernel", "batch norm forward"),
    ("bn_dsums_kernel", "batch norm backward"),
    ("bn_dx_kernel", "batch norm backward"),
    ("relu_", "elementwise: relu"),
    ("add_kernel", "elementwise: residual add"),
    ("acc_kernel", "elementwise: gradient accumulate"),
    ("to_bf16", "bf16 casts"),
    ("from_bf16", "bf16 casts"),
    ("round_bf16", "bf16 casts"),
    ("bf16_", "bf16 bias pieces"),
    ("sgd_kernel", "optimizer"),
    ("adam_kernel", "optimizer"),
    ("adadelta_kernel", "optimizer"),
    ("maxpool", "pooling"),
    ("avgpool", "pooling"),
    ("cublas", "linear (cuBLAS)"),
    ("bias_rows", "linear bias"),
    ("column_sums", "linear bias"),
    ("softmax", "loss"),
    ("nll", "loss"),
    ("cudaMemcpy", "copies"),
    ("cudaMemset", "fills"),
]


def category(name):
    for prefix, cat in CATEGORIES:
        if name.startswith(prefix):
            return cat
    return "other: " + name


def run(build, stem, ch, size, precision, batches, env, graphs=False):
    cmd = [os.path.join(build, "ringtrain"), "bench", "model", "--device", "cuda", "--stem", stem, "--channels",
           str(ch), "--size", str(size), "--precision", precision, "--batch", ",".join(map(str, batches)),
           "--steps", "1", "--warmup", "2", "--json", "--ledger-ops"] + (["--graphs"] if graphs else ["--layers"])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-2000:]))
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip()]


def rank_ops(row, cal):
    """by operation category: bytes, operations and modelled ms per step"""
    out = {}
    for g in row["ledger_ops"]:
        c = out.setdefault(category(g["name"]), {"bytes": 0.0, "ops": 0.0, "modelled_ms": 0.0})
        c["bytes"] += g["n"] * (g["bytes_read"] + g["bytes_written"])
        c["ops"] += g["n"]
        if cal:
            c["modelled_ms"] += g["n"] * gpu_cost_fit.op_time(g, cal["eta"], cal["beta"], cal["h_s"]) * 1e3
    return finish(out, cal)


def rank_layers(row, cal):
    """by layer kind and pass (the --layers rows; the optimizer outside any layer)"""
    out = {}
    for l in row.get("layers") or []:
        c = out.setdefault("%s %s" % (l["kind"], l["pass"]), {"bytes": 0.0, "ops": 0.0, "modelled_ms": 0.0})
        c["bytes"] += l.get("dram_bytes_per_step", 0)
        c["ops"] += l.get("launches_per_step", 0) + l.get("library_calls_per_step", 0) + l.get("copies_per_step", 0)
        c["modelled_ms"] += l.get("modelled_ms_per_step") or 0.0
    rest = {"bytes": row["dram_bytes_per_step"] - sum(c["bytes"] for c in out.values()),
            "ops": row["launches_per_step"] + row["library_calls_per_step"] + row.get("copies_per_step", 0)
            - sum(c["ops"] for c in out.values()),
            "modelled_ms": (row["modelled_step_ms"] or 0.0) - sum(c["modelled_ms"] for c in out.values())}
    out["outside layers (optimizer)"] = rest
    return finish(out, cal)


def finish(out, cal):
    tb = sum(c["bytes"] for c in out.values()) or 1
    to = sum(c["ops"] for c in out.values()) or 1
    tm = sum(c["modelled_ms"] for c in out.values()) or 1
    rows = []
    for k, c in sorted(out.items(), key=lambda kv: -(kv[1]["modelled_ms"] if cal else kv[1]["bytes"])):
        rows.append({"what": k, "bytes_per_step": round(c["bytes"]), "bytes_percent": round(100 * c["bytes"] / tb, 1),
                     "ops_per_step": round(c["ops"], 2), "ops_percent": round(100 * c["ops"] / to, 1),
                     "modelled_ms": round(c["modelled_ms"], 4) if cal else None,
                     "modelled_percent": round(100 * c["modelled_ms"] / tm, 1) if cal else None})
    return rows


LAYER_KEYS = ("kind", "shape", "pass", "instances", "calls_per_step", "dram_bytes_per_step", "flops_per_step",
              "launches_per_step", "library_calls_per_step", "copies_per_step", "host_syncs_per_step",
              "modelled_ms_per_step")


# not kept: the emulation's times (meaningless: count-only, CPU loops), the algorithms (the
# emulation's own choices), what is kept another way
DROP = ("layers", "conv_algos", "layers_timing", "ledger_ops", "images_per_s", "step_ms", "forward_ms", "backward_ms",
        "optim_ms", "last_loss", "peak_rss_mb", "gflops", "timing", "layers_step_ms", "layers_ms_per_step")


def compact_ops(groups):
    """ledger_ops as lists in gpu_cost_fit.OP_FIELDS order"""
    return [[g[f] if f != "captured" else int(g[f]) for f in gpu_cost_fit.OP_FIELDS] for g in groups]


def compact_row(r, layers_batch):
    """the row without its algorithms and timing prose, its operations compact; its layer
    rows (ledger fields and operations: the per-layer fit's) only at layers_batch"""
    keep = {k: v for k, v in r.items() if k not in DROP}
    keep["ledger_ops"] = compact_ops(r["ledger_ops"])
    if r["batch"] == layers_batch and r.get("layers"):
        keep["layers"] = [dict({k: l.get(k) for k in LAYER_KEYS}, ledger_ops=compact_ops(l["ledger_ops"]))
                          for l in r["layers"] if l.get("ledger_ops")]
    return keep


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build-emu")
    ap.add_argument("--out")
    ap.add_argument("--batches", default="128,256")
    ap.add_argument("--precisions", default="fp32,tf32,bf16")
    ap.add_argument("--inputs", default="cifar,imagenet")
    ap.add_argument("--layers-batch", type=int, default=256)
    ap.add_argument("--graphs", action="store_true")
    a = ap.parse_args()
    layers_batch = a.layers_batch
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out_path = a.out or os.path.join(root, "bench/results/gpu-ledger%s-%s.json" % (
        "-graphs" if a.graphs else "", datetime.date.today().strftime("%Y%m%d")))
    env = dict(os.environ, RINGTRAIN_EMU_LEDGER="count")
    batches = [int(b) for b in a.batches.split(",")]
    rows = []
    for inp in a.inputs.split(","):
        stem, ch, size = INPUTS[inp]
        for prec in a.precisions.split(","):
            rows += run(a.build, stem, ch, size, prec, batches, env, a.graphs)
    cal_path = rows[0].get("cost_calibration")
    cal = None
    if rows[0].get("modelled_step_ms") is not None:
        with open(cal_path) as f:
            cal = json.load(f)
    print("%-22s %5s %5s | %9s %9s %8s %6s %5s %5s %5s | %9s" % ("input", "prec", "batch", "GB/step", "TFLOP", "MB/img",
          "launch", "lib", "sync", "graph", "model ms"))
    result_rows, rankings = [], []
    for r in rows:
        if r.get("ledger_unknown_kernels"):
            sys.exit("kernels without a cost entry: %s" % r["ledger_unknown_names"])
        if not r.get("ledger_steady"):
            sys.exit("%s %s batch %d: one step's ledger differs from the next" % (r["stem"], r["precision"], r["batch"]))
        inp = "%s %dx%dx%d" % (r["stem"], r["channels"], r["size"], r["size"])
        print("%-22s %5s %5d | %9.3f %9.3f %8.2f %6d %5d %5d %5d | %9s" % (
            inp, r["precision"], r["batch"], r["dram_bytes_per_step"] / 1e9, r["flops_per_step"] / 1e12,
            r["dram_bytes_per_step"] / r["batch"] / 1e6, r["launches_per_step"], r["library_calls_per_step"],
            r["host_syncs_per_step"], r["graph_launches_per_step"],
            "%.3f" % r["modelled_step_ms"] if r["modelled_step_ms"] is not None else "null"))
        if cal:  # the C model (bench model) and the Python one (the fit) must agree
            py = sum(g["n"] * gpu_cost_fit.op_time(g, cal["eta"], cal["beta"], cal["h_s"]) for g in r["ledger_ops"])
            py += cal["h_s"] * r["graph_launches_per_step"] + cal["sync_s"] * r["host_syncs_per_step"]
            # bench model prints 4 decimals (5e-5 ms of rounding)
            if abs(py * 1e3 - r["modelled_step_ms"]) > 6e-5 + 1e-5 * r["modelled_step_ms"]:
                sys.exit("modelled step: bench model %.4f ms, bench/gpu_cost_fit.py's formula %.4f ms" %
                         (r["modelled_step_ms"], py * 1e3))
        rankings.append({"stem": r["stem"], "size": r["size"], "precision": r["precision"], "batch": r["batch"],
                         "by_operation": rank_ops(r, cal), "by_layer": rank_layers(r, cal)})
        result_rows.append(compact_row(r, layers_batch))
    for k in rankings:
        print("\n%s %s batch %d, by operation:" % (k["stem"], k["precision"], k["batch"]))
        print("  %-34s %12s %6s %8s %6s %10s %6s" % ("", "bytes/step", "%", "ops", "%", "model ms", "%"))
        for x in k["by_operation"]:
            print("  %-34s %12.4g %6.1f %8.1f %6.1f %10s %6s" % (x["what"], x["bytes_per_step"], x["bytes_percent"],
                  x["ops_per_step"], x["ops_percent"], x["modelled_ms"], x["modelled_percent"]))
    doc = {
        "benchmark": "gpu-ledger",
        "what": "the emulated GPUs' cost ledger of a ResNet34 training step (forward, cross-entropy, backward, SGD "
                "momentum), per steady-state step (bench model: one step after a reset, two after another, "
                "subtracted), count-only mode (RINGTRAIN_EMU_LEDGER=count), computed at each batch directly; "
                "modelled_step_ms from the calibration named in each row (docs/gpu.md)",
        "ledger_ops_fields": list(gpu_cost_fit.OP_FIELDS),
        "commit": subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True,
                                 text=True).stdout.strip(),
        "rows": result_rows,
        "rankings": rankings,
    }
    with open(out_path, "w") as f:
        f.write("{\n")
        for i, (k, v) in enumerate(doc.items()):
            if k in ("rows", "rankings"):
                f.write(' "%s": [\n%s\n ]' % (k, ",\n".join("  " + json.dumps(x, separators=(",", ":")) for x in v)))
            else:
                f.write(" %s: %s" % (json.dumps(k), json.dumps(v)))
            f.write(",\n" if i < len(doc) - 1 else "\n")
        f.write("}\n")
    print("\nwrote %s" % out_path)


if __name__ == "__main__":
    main()
