#!/usr/bin/env python3
"""The GPU step budget (docs/gpu.md "The step budget"): a ResNet34 training step on the
emulated GPUs, in fp32, tf32 and bf16, must not cost more than tests/budget/gpu_step_budget.json
allows: DRAM bytes per image and fixed bytes per step, kernel launches, library calls,
copies, host synchronisations and graph launches per step, from the cost ledger
(`ringtrain bench model --device cuda --json`, count-only mode: RINGTRAIN_EMU_LEDGER=count).

Each precision runs at two small batches: the counts must be the same at both (they do
not depend on the batch), and the bytes give the per-image slope and the fixed part
(bytes are linear in the batch). A step that moves more, launches more or synchronises
more than the budget fails, naming what grew; one that costs less passes and says so:
lower the budget in the same commit as the improvement. Every launched kernel must have a
cost entry and the ledger must be steady (one step equals the next).

usage: gpu_step_budget.py RINGTRAIN BUDGET_JSON   (exit 77: not the emulated-GPU build)
"""
import json
import os
import subprocess
import sys

COUNTS = ("launches_per_step", "library_calls_per_step", "copies_per_step", "host_syncs_per_step",
          "graph_launches_per_step")


def skip():
    """77 (skipped), or 1 where a GPU test may not skip (RINGTRAIN_REQUIRE_GPU=1)"""
    return 1 if os.environ.get("RINGTRAIN_REQUIRE_GPU") == "1" else 77


def run(binary, cfg, precision):
    cmd = [binary, "bench", "model", "--device", "cuda", "--arch", cfg["arch"], "--stem", cfg["stem"], "--channels",
           str(cfg["channels"]), "--size", str(cfg["size"]), "--batch", ",".join(map(str, cfg["batches"])),
           "--steps", "1", "--warmup", "2", "--json", "--precision", precision]
    env = dict(os.environ, RINGTRAIN_EMU_LEDGER="count")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        if "no GPU" in p.stderr or "no CUDA" in p.stderr:
            print("no GPU: skipped\n" + p.stderr)
            sys.exit(skip())
        sys.exit("%s: exit %d\n%s" % (" ".join(cmd), p.returncode, p.stderr[-3000:]))
    return [json.loads(l) for l in p.stdout.splitlines() if l.strip()]


def measure(rows, cfg, precision):
    """the step's costs: counts (equal at every batch), bytes per image and fixed bytes"""
    if rows[0].get("dram_bytes_per_step") is None:
        print("no cost ledger (not the emulated-GPU build): skipped")
        sys.exit(skip())
    problems = []
    for r in rows:
        if r["ledger_unknown_kernels"]:
            problems.append("%s batch %d: kernels without a cost entry (tests/cuda_emu/kernel_costs.cpp): %s" %
                            (precision, r["batch"], r["ledger_unknown_names"]))
        if not r["ledger_steady"]:
            problems.append("%s batch %d: the ledger of one step differs from the next" % (precision, r["batch"]))
    for k in COUNTS:
        vals = [r[k] for r in rows]
        if len(set(vals)) != 1:
            problems.append("%s: %s depends on the batch: %s at batches %s" % (precision, k, vals, cfg["batches"]))
    (n1, b1), (n2, b2) = [(r["batch"], r["dram_bytes_per_step"]) for r in rows[:2]]
    per_image = (b2 - b1) / (n2 - n1)
    got = {k: rows[0][k] for k in COUNTS}
    got["bytes_per_image"] = per_image
    got["fixed_bytes_per_step"] = b1 - n1 * per_image
    return got, problems


def main():
    binary, budget_path = sys.argv[1], sys.argv[2]
    with open(budget_path) as f:
        budget = json.load(f)
    cfg = budget["config"]
    problems, lower = [], []
    print("%-6s %-24s %16s %16s" % ("", "", "step", "budget"))
    for precision, limits in budget["budgets"].items():
        got, p = measure(run(binary, cfg, precision), cfg, precision)
        problems += p
        for k, limit in limits.items():
            v = got[k]
            mark = ""
            if v > limit:
                mark = "  OVER"
                problems.append("%s: %s is %.0f, over the budget of %.0f (%s): a change made the step more expensive;"
                                " undo it or, if it is worth its cost, raise the budget in the same commit and say why"
                                % (precision, k, v, limit, budget_path))
            elif v < limit:
                mark = "  under: lower the budget"
                lower.append("%s %s %.0f (budget %.0f)" % (precision, k, v, limit))
            print("%-6s %-24s %16.0f %16.0f%s" % (precision, k, v, limit, mark))
    if lower:
        print("below the budget (lower tests/budget/gpu_step_budget.json in the commit that made it cheaper): " +
              "; ".join(lower))
    if problems:
        print("\n".join(["FAILED:"] + problems))
        return 1
    print("ok: every precision within the budget")
    return 0


if __name__ == "__main__":
    sys.exit(main())
