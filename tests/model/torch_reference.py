#!/usr/bin/python3
"""PyTorch side of the model reference test (tests/model/test_reference.c).

Reads DIR/model.safetensors (a state_dict with torchvision's names, written by
ringtrain) and DIR/input.safetensors (x, labels), loads the weights with strict=True
into torchvision.models.resnet18/34 (conv1/maxpool replaced for the stem, as ringtrain
builds it) or into the PyTorch distributed tutorial's Net, runs one forward and
backward in training mode and writes DIR/out.safetensors:
  output          logits (ResNet) or log-probabilities (Net)
  loss            cross-entropy (ResNet) or NLL (Net), mean over the batch, shape [1]
  grad.<name>     every parameter's gradient
  state.<name>    every buffer after the forward (running statistics, num_batches_tracked)
  condition       PyTorch's own float32 error against the same step in float64, as a
                  fraction of the test's tolerances (max over output, loss, gradients):
                  above ~0.25 the instance is ill-conditioned (a relu input within
                  rounding of 0 flips between precisions) and the C test picks other inputs

Dropout in Net: the masks are regenerated here from ringtrain's documented rule,
element i of a draw is dropped when philox_uniform(seed, subseq, i) < p, with an
independent numpy implementation of Philox4x32-10, so the comparison runs with
dropout on. With --autocast the step runs under torch.autocast("cpu", torch.bfloat16)
(tests/model/test_bf16_layers.c): output is the bf16 logits widened to float32, and
err.output, err.loss, err.grad.<name> hold that step's relative error against the same
step in float64 (max|autocast - f64| / max|f64|), the scale of bf16's own error.
Exit code 3: torch/torchvision not importable (the C test then skips).
"""
import argparse
import copy
import json
import struct
import sys

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision
except Exception as e:  # pragma: no cover
    print("torch_reference.py: cannot import torch/torchvision: %s" % e, file=sys.stderr)
    sys.exit(3)

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8}
NAMES = {np.dtype(v): k for k, v in DTYPES.items()}


def st_load(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        arr = np.frombuffer(data[b:e], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def st_save(path, tensors):
    header, blobs, off = {}, [], 0
    for name in sorted(tensors):
        arr = np.ascontiguousarray(tensors[name].detach().cpu().numpy())
        b = arr.tobytes()
        header[name] = {"dtype": NAMES[arr.dtype], "shape": list(arr.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def philox_uniform(seed, subseq, idx):
    """Element idx (uint64 array) of ringtrain's uniform stream (seed, subseq)."""
    mask = np.uint64(0xFFFFFFFF)
    block = idx >> np.uint64(2)
    c0, c1 = block & mask, block >> np.uint64(32)
    c2 = np.full_like(idx, subseq & 0xFFFFFFFF)
    c3 = np.full_like(idx, subseq >> 32)
    k0, k1 = seed & 0xFFFFFFFF, seed >> 32
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c0
        p1 = np.uint64(0xCD9E8D57) * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & mask
        hi1, lo1 = p1 >> np.uint64(32), p1 & mask
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0 = (k0 + 0x9E3779B9) & 0xFFFFFFFF
        k1 = (k1 + 0xBB67AE85) & 0xFFFFFFFF
    words = np.stack([c0, c1, c2, c3])
    w = words[(idx & np.uint64(3)).astype(np.int64), np.arange(idx.size)]
    return (w >> np.uint64(8)).astype(np.float64) / 16777216.0


def dropout_mask(seed, subseq, count, p):
    u = philox_uniform(seed, subseq, np.arange(count, dtype=np.uint64))
    return torch.from_numpy(np.where(u < p, 0.0, 1.0 / (1.0 - p)).astype(np.float32))


class Net(nn.Module):
    """The CNN of pytorch.org/tutorials/intermediate/dist_tuto.html, with the dropout
    masks supplied (mask * x is what nn.Dropout2d / F.dropout compute for that mask)."""

    def __init__(self, num_classes=10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, num_classes)
        self.masks = None

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = self.conv2(x)
        x = x * self.masks[0][:, :, None, None] if self.masks else self.conv2_drop(x)
        x = F.relu(F.max_pool2d(x, 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = x * self.masks[1] if self.masks else F.dropout(x, training=self.training)
        x = self.fc2(x)
        return F.log_softmax(x, dim=1)


def build(args):
    if args.arch == "net":
        return Net(args.classes)
    ctor = {"resnet18": torchvision.models.resnet18, "resnet34": torchvision.models.resnet34}[args.arch]
    m = ctor(num_classes=args.classes)
    if args.stem == "imagenet":
        m.conv1 = nn.Conv2d(args.in_channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    else:
        m.conv1 = nn.Conv2d(args.in_channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", required=True)
    ap.add_argument("--stem", default="imagenet")
    ap.add_argument("--in-channels", type=int, default=1)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--dropout-seed", type=int, default=0)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--autocast", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = build(args)
    state = st_load(args.dir + "/model.safetensors")
    model.load_state_dict(state, strict=True)
    inp = st_load(args.dir + "/input.safetensors")
    x, labels = inp["x"], inp["labels"].long()
    n = x.shape[0]
    masks = None
    if args.arch == "net":
        p = args.dropout
        masks = (dropout_mask(args.dropout_seed, 1 << 20, n * 20, p).view(n, 20),
                 dropout_mask(args.dropout_seed, (1 << 20) + 1, n * 50, p).view(n, 50))
    model64 = copy.deepcopy(model).double()

    def step(m, xx):
        m.train()
        if masks:
            m.masks = tuple(t.to(xx.dtype) for t in masks)
        if args.autocast and xx.dtype == torch.float32:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = m(xx)
            out = out.float()
        else:
            out = m(xx)
        loss = F.nll_loss(out, labels) if args.arch == "net" else F.cross_entropy(out, labels)
        loss.backward()
        return out.detach(), loss.detach().reshape(1)

    out, loss = step(model, x)
    out64, loss64 = step(model64, x.double())
    res = {"output": out, "loss": loss}
    # How well-conditioned this instance is: PyTorch's own float32 error against float64,
    # as a fraction of each tolerance of the test (output 1e-4, loss 1e-5, gradients 1e-3).
    rel = lambda a, b: float((a.double() - b).abs().max() / b.abs().max().clamp_min(1e-30))
    cond = max(rel(out, out64) / 1e-4, rel(loss, loss64) / 1e-5)
    worst = "output/loss"
    for (name, prm), (_, p64) in zip(model.named_parameters(), model64.named_parameters()):
        res["grad." + name] = prm.grad
        c = rel(prm.grad, p64.grad) / 1e-3
        if c > cond:
            cond, worst = c, name
    for name, buf in model.named_buffers():
        res["state." + name] = buf
    res["condition"] = torch.tensor([cond], dtype=torch.float32)
    if args.autocast:
        res["err.output"] = torch.tensor([rel(out, out64)], dtype=torch.float32)
        res["err.loss"] = torch.tensor([rel(loss, loss64)], dtype=torch.float32)
        for (name, prm), (_, p64) in zip(model.named_parameters(), model64.named_parameters()):
            res["err.grad." + name] = torch.tensor([rel(prm.grad, p64.grad)], dtype=torch.float32)
    st_save(args.dir + "/out.safetensors", res)
    print("torch_reference.py: %s %s loss %.6f, %d parameters, condition %.3g (%s)" %
          (args.arch, args.stem, loss.item(), sum(p.numel() for p in model.parameters()), cond, worst))


if __name__ == "__main__":
    main()
