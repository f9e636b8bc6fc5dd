#!/usr/bin/python3
"""PyTorch side of tests/train/test_checkpoint_reference.c.

Usage: torch_checkpoint.py CKPT_DIR IO.safetensors

Parses CKPT_DIR/model.safetensors with json + struct (Debian's torch has no safetensors
package), loads it into torchvision.models.resnet34(num_classes=10) with strict=True
(conv1 replaced by a 1-channel one when the checkpoint's conv1.weight has 1 input
channel, as ringtrain builds it for MNIST-like data), runs the input "x" of
IO.safetensors in eval mode and compares the logits with ringtrain's ("logits"):
max|ours - torch| / max|torch| must be below 1e-4. Exit 0: equal within it, 1: not,
3: torch/torchvision not importable (the C test skips).
"""
import json
import struct
import sys

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torchvision
except Exception as e:  # pragma: no cover
    print("torch_checkpoint.py: cannot import torch/torchvision: %s" % e, file=sys.stderr)
    sys.exit(3)

DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        b = f.read()
    (n,) = struct.unpack("<Q", b[:8])
    header = json.loads(b[8 : 8 + n])
    data = b[8 + n :]
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        begin, end = t["data_offsets"]
        arr = np.frombuffer(data[begin:end], dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
        out[name] = torch.from_numpy(arr.copy())
    return out


def main():
    ckpt, io = sys.argv[1], sys.argv[2]
    sd = read_safetensors(ckpt + "/model.safetensors")
    m = torchvision.models.resnet34(num_classes=10)
    c = sd["conv1.weight"].shape[1]
    if c != 3:
        m.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
    m.load_state_dict(sd, strict=True)  # raises on any missing or unexpected name
    m.eval()
    t = read_safetensors(io)
    with torch.no_grad():
        logits = m(t["x"])
    ours = t["logits"]
    err = float((logits - ours).abs().max() / logits.abs().max())
    print("torch_checkpoint.py: %d state_dict entries loaded with strict=True, input %s, logits max rel err %.3g"
          % (len(sd), tuple(t["x"].shape), err))
    print("  torch   ", logits[0, :5].tolist())
    print("  ringtrain", ours[0, :5].tolist())
    sys.exit(0 if err < 1e-4 else 1)


if __name__ == "__main__":
    main()
