#!/usr/bin/python3
"""Reference trajectories from PyTorch for tests/optim/test_optim_reference.c.

Usage: torch_optim_ref.py DIR

DIR/optim.json: {"shapes": [[3,4,5,5], ...], "steps": S, "cases": [{...}, ...]}
DIR/data.bin:   float32 initial parameters (all tensors, concatenated, no padding),
                then S steps of gradients laid out the same way.
DIR/sched.json: {"cases": [{...}, ...]}
Writes DIR/optim_out.bin: for every case and every step, the parameters after that
step (float32), DIR/ema_out.bin: for every case with "ema_decay" > 0, the parameters of
torch.optim.swa_utils.AveragedModel(avg_fn=decay*a + (1-decay)*m, use_buffers=False; with
"ema_warmup" decay = min(decay, (1 + n) / (10 + n)), n the updates before)
after every step, update_parameters called after every "ema_every"-th step, and DIR/sched_out.txt: per schedule case, one line per iteration with
the learning rate and the momentum (or beta1; 0 when the optimizer has none), as %.17g.
All cases run in this one process to keep the test fast.
"""
import json
import math
import os
import sys
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
torch.set_num_threads(1)


def make_scheduler(opt, c):
    kind = c["kind"]
    main = None
    if kind == "constant":
        main = None
    elif kind == "step":
        main = torch.optim.lr_scheduler.StepLR(opt, step_size=c["step_size"], gamma=c["gamma"])
    elif kind == "multistep":
        main = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=c["milestones"], gamma=c["gamma"])
    elif kind == "cosine":
        main = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=c["t_max"], eta_min=c["eta_min"])
    elif kind == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=c["max_lr"], total_steps=c["total_steps"], pct_start=c["pct_start"],
            anneal_strategy=c["anneal"], div_factor=c["div_factor"], final_div_factor=c["final_div_factor"],
            three_phase=c["three_phase"], cycle_momentum=c["cycle_momentum"],
            base_momentum=c["base_momentum"], max_momentum=c["max_momentum"])
    else:
        raise ValueError(kind)
    w = c.get("warmup_steps", 0)
    if w > 0:
        warm = torch.optim.lr_scheduler.LinearLR(opt, start_factor=c["warmup_start_factor"], end_factor=1.0,
                                                 total_iters=w)
        if main is None:  # constant after the warmup
            main = torch.optim.lr_scheduler.ConstantLR(opt, factor=1.0, total_iters=0)
        return torch.optim.lr_scheduler.SequentialLR(opt, [warm, main], milestones=[w])
    return main


def make_optimizer(params, c):
    kind = c["kind"]
    if c.get("no_decay"):
        nd = set(c["no_decay"])
        groups = [{"params": [p for i, p in enumerate(params) if i not in nd]},
                  {"params": [p for i, p in enumerate(params) if i in nd], "weight_decay": 0.0}]
    else:
        groups = [{"params": params}]
    if kind == "sgd":
        return torch.optim.SGD(groups, lr=c["lr"], momentum=c["momentum"], dampening=c["dampening"],
                               nesterov=c["nesterov"], weight_decay=c["weight_decay"], foreach=False)
    if kind == "adadelta":
        return torch.optim.Adadelta(groups, lr=c["lr"], rho=c["rho"], eps=c["eps"], weight_decay=c["weight_decay"],
                                    foreach=False)
    cls = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
    return cls(groups, lr=c["lr"], betas=tuple(c["betas"]), eps=c["eps"], weight_decay=c["weight_decay"],
               amsgrad=c["amsgrad"], foreach=False)


def run_optim(d):
    with open(os.path.join(d, "optim.json")) as f:
        spec = json.load(f)
    shapes = spec["shapes"]
    steps = spec["steps"]
    sizes = [int(np.prod(s)) for s in shapes]
    total = sum(sizes)
    data = np.fromfile(os.path.join(d, "data.bin"), dtype=np.float32)
    assert data.size == total * (steps + 1), (data.size, total, steps)
    out, ema_out = [], []
    for c in spec["cases"]:
        params, off = [], 0
        for s, n in zip(shapes, sizes):
            params.append(torch.tensor(data[off:off + n].copy()).reshape(s).requires_grad_())
            off += n
        opt = make_optimizer(params, c)
        sched = make_scheduler(opt, c["sched"]) if c.get("sched") else None
        ema = None
        if c.get("ema_decay", 0) > 0:
            holder = torch.nn.Module()
            holder.ps = torch.nn.ParameterList([torch.nn.Parameter(p) for p in params])
            params = list(holder.ps)
            opt = make_optimizer(params, c)
            sched = make_scheduler(opt, c["sched"]) if c.get("sched") else None
            def avg_fn(a, m, n, decay=c["ema_decay"], warmup=c.get("ema_warmup", False)):
                if warmup:  # TensorFlow's num_updates rule, n = updates done before this one
                    decay = min(decay, (1 + float(n)) / (10 + float(n)))
                return decay * a + (1 - decay) * m
            ema = torch.optim.swa_utils.AveragedModel(holder, avg_fn=avg_fn)
        for t in range(steps):
            base = total * (t + 1)
            off = 0
            for p, n in zip(params, sizes):
                p.grad = torch.tensor(data[base + off:base + off + n].copy()).reshape(p.shape)
                off += n
            if c.get("clip", 0) > 0:
                torch.nn.utils.clip_grad_norm_(params, c["clip"])
            opt.step()
            if sched is not None:
                sched.step()
            out.append(torch.cat([p.detach().reshape(-1) for p in params]).numpy())
            if ema is not None:
                if (t + 1) % c["ema_every"] == 0:
                    ema.update_parameters(holder)
                ema_out.append(torch.cat([p.detach().reshape(-1) for p in ema.module.ps]).numpy())
    np.concatenate(out).astype(np.float32).tofile(os.path.join(d, "optim_out.bin"))
    (np.concatenate(ema_out) if ema_out else np.zeros(0)).astype(np.float32).tofile(os.path.join(d, "ema_out.bin"))


def run_sched(d):
    with open(os.path.join(d, "sched.json")) as f:
        spec = json.load(f)
    lines = []
    for c in spec["cases"]:
        p = torch.zeros(1, requires_grad=True)
        if c.get("adam"):
            opt = torch.optim.Adam([p], lr=c["lr"])
        else:
            opt = torch.optim.SGD([p], lr=c["lr"], momentum=0.9)
        sched = make_scheduler(opt, c)
        spe = c.get("steps_per_epoch", 1) if c.get("per_epoch") else 1
        for it in range(c["iters"]):
            g = opt.param_groups[0]
            mom = g["betas"][0] if "betas" in g else g.get("momentum", 0.0)
            lines.append("%.17g %.17g" % (g["lr"], mom))
            opt.step()
            if sched is not None and (it + 1) % spe == 0:
                sched.step()
    with open(os.path.join(d, "sched_out.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    d = sys.argv[1]
    if os.path.exists(os.path.join(d, "optim.json")):
        run_optim(d)
    if os.path.exists(os.path.join(d, "sched.json")):
        run_sched(d)
