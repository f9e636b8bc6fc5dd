#!/usr/bin/python3
"""PyTorch side of tests/model/test_syncbn_reference.c: SyncBatchNorm's results, computed
as torch.nn.BatchNorm2d on the concatenated global batch (Debian's PyTorch refuses
SyncBatchNorm on CPU tensors; SyncBatchNorm is defined to equal this).

Usage: torch_syncbn.py DIR

DIR/cases.txt: one line per case "n_total c h w residual relu". DIR/in.bin, per case
(float32): x (n_total, c, h, w), residual (same, when residual), g (same: the gradient of
the loss with respect to the layer's output), weight (c), bias (c), running_mean (c),
running_var (c). Writes DIR/out.bin, per case (float32): y, x.grad, weight.grad,
bias.grad, running_mean, running_var after one training forward (momentum 0.1, eps 1e-5)
of y = relu?(bn(x) + residual?) and the backward of sum(y * g). Exit 3 without torch.
"""
import os
import sys

import numpy as np

try:
    import torch
except Exception as e:  # pragma: no cover
    print("torch_syncbn.py: cannot import torch: %s" % e, file=sys.stderr)
    sys.exit(3)

torch.set_num_threads(1)
d = sys.argv[1]
raw = open(os.path.join(d, "in.bin"), "rb").read()
pos = 0


def take(count):
    global pos
    a = np.frombuffer(raw, dtype=np.float32, count=count, offset=pos).copy()
    pos += 4 * count
    return a


out = []
for line in open(os.path.join(d, "cases.txt")):
    n, c, h, w, res, relu = (int(v) for v in line.split())
    shape = (n, c, h, w)
    x = torch.tensor(take(n * c * h * w).reshape(shape), requires_grad=True)
    r = torch.tensor(take(n * c * h * w).reshape(shape)) if res else None
    g = torch.tensor(take(n * c * h * w).reshape(shape))
    bn = torch.nn.BatchNorm2d(c, eps=1e-5, momentum=0.1)
    with torch.no_grad():
        bn.weight.copy_(torch.tensor(take(c)))
        bn.bias.copy_(torch.tensor(take(c)))
        bn.running_mean.copy_(torch.tensor(take(c)))
        bn.running_var.copy_(torch.tensor(take(c)))
    bn.train()
    y = bn(x)
    if r is not None:
        y = y + r
    if relu:
        y = torch.relu(y)
    (y * g).sum().backward()
    for t in (y.detach(), x.grad, bn.weight.grad, bn.bias.grad, bn.running_mean, bn.running_var):
        out.append(t.detach().numpy().astype(np.float32).reshape(-1))
np.concatenate(out).tofile(os.path.join(d, "out.bin"))
