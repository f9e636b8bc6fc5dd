#!/usr/bin/python3
"""PyTorch side of tests/model/test_smoothing_reference.c.

Usage: torch_smoothing.py DIR

DIR/cases.txt: one line per case "n k eps"; DIR/in.bin: for each case, n*k float32
logits then n int64 labels. Writes DIR/out.bin: for each case the loss of
torch.nn.CrossEntropyLoss(label_smoothing=eps) (mean reduction) as float32, then the
gradient of that loss with respect to the logits (n*k float32), all computed by
autograd in float32 on the CPU. Exit 3 when torch is not importable.
"""
import os
import sys

import numpy as np

try:
    import torch
except Exception as e:  # pragma: no cover
    print("torch_smoothing.py: cannot import torch: %s" % e, file=sys.stderr)
    sys.exit(3)

torch.set_num_threads(1)
d = sys.argv[1]
raw = open(os.path.join(d, "in.bin"), "rb").read()
pos = 0
out = []
for line in open(os.path.join(d, "cases.txt")):
    n, k, eps = line.split()
    n, k, eps = int(n), int(k), float(eps)
    x = np.frombuffer(raw, dtype=np.float32, count=n * k, offset=pos).reshape(n, k)
    pos += 4 * n * k
    y = np.frombuffer(raw, dtype=np.int64, count=n, offset=pos)
    pos += 8 * n
    xt = torch.tensor(x.copy(), requires_grad=True)
    loss = torch.nn.CrossEntropyLoss(label_smoothing=eps)(xt, torch.tensor(y.copy()))
    loss.backward()
    out.append(np.array([loss.item()], dtype=np.float32))
    out.append(xt.grad.numpy().astype(np.float32).reshape(-1))
np.concatenate(out).tofile(os.path.join(d, "out.bin"))
