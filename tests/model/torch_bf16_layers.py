#!/usr/bin/python3
"""PyTorch side of tests/model/test_bf16_layers.c: one conv2d or linear layer under
torch.autocast("cpu", torch.bfloat16), forward and backward.

Reads DIR/x.bin, w.bin, b.bin (when --bias), dy.bin (raw little-endian float32, shapes
from the arguments), runs y = layer(x) under autocast (y is bf16), y.backward(dy as
bf16) and writes DIR/y.bin, dx.bin, dw.bin, db.bin (float32: the bf16 results
widened) and the sums of absolute products that bound the accumulation error,
ay.bin = sum |x_bf16 * w_bf16| (+ |b|) per output, adx.bin, adw.bin likewise for the
two gradients, computed in float64. Exit code 3: torch not importable (test skips).
"""
import argparse
import os
import sys

import numpy as np

try:
    import torch
    import torch.nn.functional as F
except Exception as e:  # pragma: no cover
    print("torch_bf16_layers.py: cannot import torch: %s" % e, file=sys.stderr)
    sys.exit(3)


def load(d, name, shape):
    return torch.from_numpy(np.fromfile(os.path.join(d, name), dtype="<f4").reshape(shape).copy())


def save(d, name, t):
    t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tofile(os.path.join(d, name))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dir", required=True)
    ap.add_argument("--kind", choices=["conv", "linear"], required=True)
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--in", dest="cin", type=int, required=True)
    ap.add_argument("--out", type=int, required=True)
    ap.add_argument("--hw", type=int, default=1)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--stride", type=int, default=1)
    ap.add_argument("--pad", type=int, default=0)
    ap.add_argument("--bias", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(1)
    d = a.dir
    if a.kind == "conv":
        xs, ws = (a.n, a.cin, a.hw, a.hw), (a.out, a.cin, a.k, a.k)
        op = lambda x, w, b: F.conv2d(x, w, b, stride=a.stride, padding=a.pad)  # noqa: E731
    else:
        xs, ws = (a.n, a.cin), (a.out, a.cin)
        op = F.linear
    x = load(d, "x.bin", xs).requires_grad_()
    w = load(d, "w.bin", ws).requires_grad_()
    b = load(d, "b.bin", (a.out,)).requires_grad_() if a.bias else None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = op(x, w, b)
    assert y.dtype == torch.bfloat16, y.dtype
    dy = load(d, "dy.bin", tuple(y.shape))
    y.backward(dy.to(torch.bfloat16))
    save(d, "y.bin", y)
    save(d, "dx.bin", x.grad)
    save(d, "dw.bin", w.grad)
    if a.bias:
        save(d, "db.bin", b.grad)
    # float64 sums of |products| of the bf16 operands: the accumulation error bounds
    r = lambda t: t.detach().to(torch.bfloat16).to(torch.float64).abs()  # noqa: E731
    xa = r(x).requires_grad_()
    wa = r(w).requires_grad_()
    ya = op(xa, wa, r(b) if a.bias else None)
    ya.backward(r(dy))
    save(d, "ay.bin", ya)
    save(d, "adx.bin", xa.grad)
    save(d, "adw.bin", wa.grad)


if __name__ == "__main__":
    main()
