#!/usr/bin/python3
"""PyTorch's own run of the tutorial recipe that configs/mnist-net.yaml uses (issue 23,
item 4): pytorch/examples' mnist/main.py training loop (Adadelta lr 1.0, StepLR step_size 1
gamma 0.7 each epoch, batch 64 shuffled, 14 epochs, Normalize((0.1307,), (0.3081,)),
F.nll_loss on log_softmax) on the Net that ringtrain's `model.arch: net` implements
(src/model/net.c: the distributed tutorial's CNN, both dropouts p = 0.5). One process.

    /usr/bin/python3 bench/mnist_tutorial_torch.py DATA_DIR SEED [EPOCHS]

prints one JSON line: {"seed", "epoch_accuracy": [...], "test_accuracy", "test_loss", "train_s"}.
"""
import gzip
import json
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


def read_idx(path):
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    magic, n = struct.unpack(">II", raw[:8])
    if magic == 0x803:
        h, w = struct.unpack(">II", raw[8:16])
        return np.frombuffer(raw, np.uint8, n * h * w, 16).reshape(n, 1, h, w)
    if magic == 0x801:
        return np.frombuffer(raw, np.uint8, n, 8)
    sys.exit("%s: not an IDX file (magic %#x)" % (path, magic))


def load(d, split):
    def find(stem):
        for name in (stem + ".gz", stem):
            try:
                open(d + "/" + name, "rb").close()
                return d + "/" + name
            except OSError:
                pass
        sys.exit("%s: no %s[.gz]" % (d, stem))

    x = read_idx(find(split + "-images-idx3-ubyte"))
    y = read_idx(find(split + "-labels-idx1-ubyte"))
    x = (torch.from_numpy(x.astype(np.float32)) / 255.0 - 0.1307) / 0.3081
    return x, torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.conv2_drop = nn.Dropout2d()
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2_drop(self.conv2(x)), 2))
        x = x.view(-1, 320)
        x = F.relu(self.fc1(x))
        x = F.dropout(x, training=self.training)
        return F.log_softmax(self.fc2(x), dim=1)


def main():
    d, seed = sys.argv[1], int(sys.argv[2])
    epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 14
    torch.manual_seed(seed)
    torch.set_num_threads(2)
    xtr, ytr = load(d, "train")
    xte, yte = load(d, "t10k")
    model = Net()
    opt = torch.optim.Adadelta(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    gen = torch.Generator().manual_seed(seed)
    accs = []
    t0 = time.time()
    for _ in range(epochs):
        model.train()
        perm = torch.randperm(len(xtr), generator=gen)
        for i in range(0, len(xtr), 64):  # the DataLoader's batches: the last one is short
            idx = perm[i:i + 64]
            opt.zero_grad()
            loss = F.nll_loss(model(xtr[idx]), ytr[idx])
            loss.backward()
            opt.step()
        sched.step()
        model.eval()
        with torch.no_grad():
            out = torch.cat([model(xte[i:i + 1000]) for i in range(0, len(xte), 1000)])
        test_loss = F.nll_loss(out, yte).item()
        accs.append(100.0 * (out.argmax(1) == yte).float().mean().item())
    print(json.dumps({"seed": seed, "epoch_accuracy": accs, "test_accuracy": accs[-1], "test_loss": test_loss,
                      "train_s": time.time() - t0}))


if __name__ == "__main__":
    main()
