#!/usr/bin/env python3
"""`ringtrain bench model --device cuda --json --ledger-ops --layers` on the emulated GPUs
(docs/gpu.md "The cost ledger", "Modelled step time"): every row has the ledger's fields;
they add up (the step's bytes, launches and library calls are its operations'; the layer
rows and the optimizer's kernel are the whole step); modelled_step_ms is the model's formula
over the operations with the calibration named by RINGTRAIN_COST_CALIBRATION; with
--graphs the step is a replay as training makes it (the same operations, captured, in two
graph launches around one host synchronisation); a bad
calibration file is refused (exit 2) naming the field.

usage: bench_ledger_fields.py RINGTRAIN   (exit 77: not the emulated-GPU build)
"""
import json
import os
import subprocess
import sys
import tempfile

FIELDS = ("modelled_step_ms", "dram_bytes_per_step", "flops_per_step", "launches_per_step", "library_calls_per_step",
          "host_syncs_per_step", "graph_launches_per_step")
CAL = {"peak_flops": {"fp32": 1e13, "tf32": 1e14, "bf16": 2e14}, "bandwidth_bytes_per_s": 1e12, "eta": 0.5,
       "beta": 0.5, "h_s": 1e-5, "sync_s": 1e-4}


def skip():
    """77 (skipped), or 1 where a GPU test may not skip (RINGTRAIN_REQUIRE_GPU=1)"""
    return 1 if os.environ.get("RINGTRAIN_REQUIRE_GPU") == "1" else 77


def bench(binary, cal_path, precision, *extra):
    cmd = [binary, "bench", "model", "--device", "cuda", "--arch", "resnet18", "--width", "4", "--stem", "cifar",
           "--channels", "3", "--size", "8", "--batch", "2", "--steps", "1", "--warmup", "1", "--json",
           "--ledger-ops", "--precision", precision] + (list(extra) or ["--layers"])
    env = dict(os.environ, RINGTRAIN_EMU_LEDGER="count", RINGTRAIN_COST_CALIBRATION=cal_path)
    return subprocess.run(cmd, env=env, capture_output=True, text=True)


def op_time(g):
    t = g["flops"] / (CAL["eta"] * CAL["peak_flops"][g["math"]]) if g["math"] in CAL["peak_flops"] else 0.0
    t = max(t, (g["bytes_read"] + g["bytes_written"]) / (CAL["beta"] * CAL["bandwidth_bytes_per_s"]))
    return t if g["captured"] else max(t, CAL["h_s"])


def check(r):
    close = lambda a, b: abs(a - b) <= 1e-6 * max(1.0, abs(b))
    for f in FIELDS:
        assert r.get(f) is not None, "%s is missing or null" % f
    ops = r["ledger_ops"]
    n = lambda kinds: sum(g["n"] for g in ops if g["kind"] in kinds)
    assert close(r["dram_bytes_per_step"], sum(g["n"] * (g["bytes_read"] + g["bytes_written"]) for g in ops))
    assert close(r["flops_per_step"], sum(g["n"] * g["flops"] for g in ops))
    assert r["launches_per_step"] == n(("kernel",)), (r["launches_per_step"], n(("kernel",)))
    assert r["library_calls_per_step"] == n(("cudnn", "cublas", "nccl"))
    want = sum(g["n"] * op_time(g) for g in ops) + CAL["h_s"] * r["graph_launches_per_step"] \
        + CAL["sync_s"] * r["host_syncs_per_step"]
    assert abs(r["modelled_step_ms"] - want * 1e3) < 1e-3, (r["modelled_step_ms"], want * 1e3)
    # the layers and the optimizer's kernel are the whole step
    sgd = [g for g in ops if g["name"] == "sgd_kernel"]
    assert len(sgd) == 1 and sgd[0]["n"] == 1, sgd
    layers = r["layers"]
    lb = sum(l["dram_bytes_per_step"] for l in layers) + sgd[0]["bytes_read"] + sgd[0]["bytes_written"]
    assert close(lb, r["dram_bytes_per_step"]), (lb, r["dram_bytes_per_step"])
    lm = sum(l["modelled_ms_per_step"] for l in layers) + op_time(sgd[0]) * 1e3
    assert abs(lm - r["modelled_step_ms"]) < 1e-3, (lm, r["modelled_step_ms"])
    lc = sum(l["launches_per_step"] + l["library_calls_per_step"] for l in layers) + 1
    assert lc == r["launches_per_step"] + r["library_calls_per_step"], lc
    for l in layers:
        got = sum(g["n"] * (g["bytes_read"] + g["bytes_written"]) for g in l["ledger_ops"])
        assert close(got, l["dram_bytes_per_step"]), (l["kind"], l["shape"], got, l["dram_bytes_per_step"])


def check_graphs(binary, cal_path, plain):
    """--graphs: the ledger's step is a replayed step as `ringtrain train` replays it: the
    same operations (and the optimizer's scalars and the loss copied), all captured, in two
    graph launches (forward, update) around one host synchronisation, and no host cost per
    operation in the model"""
    p = bench(binary, cal_path, "tf32", "--graphs")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    for k in ("launches_per_step", "library_calls_per_step", "flops_per_step"):
        assert r[k] == plain[k], (k, r[k], plain[k])
    # + the optimizer's scalars (a pinned slot into the graph's memory) and the loss (to pinned memory)
    assert r["copies_per_step"] == plain["copies_per_step"] + 2, (r["copies_per_step"], plain["copies_per_step"])
    assert 0 < r["dram_bytes_per_step"] - plain["dram_bytes_per_step"] <= 1024, (r["dram_bytes_per_step"],
                                                                                plain["dram_bytes_per_step"])
    assert r["graph_launches_per_step"] == 2 and plain["graph_launches_per_step"] == 0
    assert r["host_syncs_per_step"] == 1 and plain["host_syncs_per_step"] == 0, r["host_syncs_per_step"]
    ops = r["launches_per_step"] + r["library_calls_per_step"] + r["copies_per_step"]
    assert r["captured_per_step"] == ops and plain["captured_per_step"] == 0, (r["captured_per_step"], ops)
    assert all(g["captured"] for g in r["ledger_ops"])
    want = sum(g["n"] * op_time(g) for g in r["ledger_ops"]) + 2 * CAL["h_s"] + CAL["sync_s"]
    assert abs(r["modelled_step_ms"] - want * 1e3) < 1e-3, (r["modelled_step_ms"], want * 1e3)
    print("tf32 --graphs: the same %d operations, all captured, 2 graph launches, 1 host sync: modelled %.4f ms "
          "(%.4f without the graphs)" % (ops, r["modelled_step_ms"], plain["modelled_step_ms"]))


def main():
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory() as tmp:
        good, bad = os.path.join(tmp, "good.json"), os.path.join(tmp, "bad.json")
        with open(good, "w") as f:
            json.dump(CAL, f)
        with open(bad, "w") as f:
            json.dump(dict(CAL, beta=0), f)
        for precision in ("tf32", "bf16"):
            p = bench(binary, good, precision)
            if p.returncode != 0:
                if "no GPU" in p.stderr:
                    print("no GPU: skipped")
                    return skip()
                print(p.stderr)
                return 1
            r = json.loads(p.stdout)
            if r.get("dram_bytes_per_step") is None:
                print("no cost ledger (not the emulated-GPU build): skipped")
                return skip()
            assert r["cost_calibration"] == good, r["cost_calibration"]
            check(r)
            print("%s: %d launches, %d library calls, %.0f bytes, modelled %.4f ms: the operations' sums, the layers' "
                  "sum with the optimizer" % (precision, r["launches_per_step"], r["library_calls_per_step"],
                                             r["dram_bytes_per_step"], r["modelled_step_ms"]))
            if precision == "tf32":
                check_graphs(binary, good, r)
        p = bench(binary, bad, "tf32")
        assert p.returncode == 2 and '"beta" is 0' in p.stderr and bad in p.stderr, (p.returncode, p.stderr)
        print("a calibration with beta 0 is refused: " + p.stderr.strip().splitlines()[-1])
    return 0


if __name__ == "__main__":
    sys.exit(main())
