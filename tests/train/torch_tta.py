#!/usr/bin/python3
"""PyTorch side of tests/train/recipes.sh tta: test-time augmentation by flip.

Usage: torch_tta.py CKPT_DIR DATA_DIR N PLAIN_LOSS PLAIN_ACC TTA_LOSS TTA_ACC

Loads CKPT_DIR/model.safetensors into torchvision.models.resnet34 (1-channel conv1,
strict=True), normalises the first N Fashion-MNIST test images of DATA_DIR as ringtrain
does ((v/255 - 0.2860) / 0.3530) and computes, in eval mode, the mean cross-entropy and
accuracy of model(x) (plain) and of torch.stack([model(x), model(x.flip(-1))]).mean(0)
(eval.tta: flip). Each must match ringtrain's numbers: the plain loss (printed with 4
decimals) within 6e-5, the flip loss (metrics.jsonl, 6 digits) within 1e-5 relative,
accuracies exactly. Exit 0 equal, 1 not, 3 torch/torchvision not importable.
"""
import gzip
import os
import sys

import numpy as np

try:
    import torch
    import torch.nn as nn
    import torchvision
except Exception as e:  # pragma: no cover
    print("torch_tta.py: cannot import torch/torchvision: %s" % e, file=sys.stderr)
    sys.exit(3)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_checkpoint import read_safetensors  # noqa: E402


def idx(path):
    for p in (path + ".gz", path):
        if os.path.exists(p):
            with (gzip.open(p) if p.endswith(".gz") else open(p, "rb")) as f:
                return f.read()
    raise FileNotFoundError(path)


def main():
    ckpt, data, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    want = [float(v) for v in sys.argv[4:8]]
    torch.set_num_threads(2)
    sd = read_safetensors(ckpt + "/model.safetensors")
    m = torchvision.models.resnet34(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    m.load_state_dict(sd, strict=True)
    m.eval()
    img = np.frombuffer(idx(data + "/t10k-images-idx3-ubyte"), dtype=np.uint8, offset=16)[: n * 784]
    lab = np.frombuffer(idx(data + "/t10k-labels-idx1-ubyte"), dtype=np.uint8, offset=8)[:n]
    x = (torch.tensor(img.reshape(n, 1, 28, 28).astype(np.float32)) / 255.0 - 0.2860) / 0.3530
    y = torch.tensor(lab.astype(np.int64))
    with torch.no_grad():
        plain = m(x)
        tta = torch.stack([plain, m(x.flip(-1))]).mean(0)
    ok = True
    for name, out, wl, wa, tol in (("plain", plain, want[0], want[1], 6e-5),
                                   ("flip", tta, want[2], want[3], 1e-5 * abs(want[2]))):
        loss = float(nn.functional.cross_entropy(out, y))
        acc = float((out.argmax(1) == y).float().mean())
        good = abs(loss - wl) <= tol and abs(acc - wa) < 0.5 / n
        print("torch_tta.py: %-5s torch loss %.6f acc %.4f, ringtrain loss %.6f acc %.4f %s"
              % (name, loss, acc, wl, wa, "ok" if good else "MISMATCH"))
        ok = ok and good
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
