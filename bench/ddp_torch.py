#!/usr/bin/python3
"""PyTorch DDP side of bench/train.sh: what a user would run instead of ringtrain on a
CPU machine. torchvision resnet34 with the 1x28x28 imagenet stem as ringtrain builds it,
2 processes x 1 thread (torch.set_num_threads(1)), gloo, DistributedDataParallel with its
defaults (25 MiB buckets), SGD(lr=0.1, momentum=0.9), the global batch split over the
ranks, Fashion-MNIST images from Debian's package (read with the stdlib: gzip + struct).
A step is zero_grad + forward + cross_entropy + backward (all-reduce overlapped by DDP) +
optimizer.step. Prints one JSON object: images/s over the timed steps (after warm-up),
measured on rank 0 between barriers.
--autocast: forward and loss under torch.autocast("cpu", torch.bfloat16) (fp32 master
weights, gradients and all-reduce: DDP's default, no compression hook).
"""
import argparse
import gzip
import json
import os
import struct
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torchvision


def load_images(path, n):
    with gzip.open(os.path.join(path, "train-images-idx3-ubyte.gz")) as f:
        _, count, rows, cols = struct.unpack(">IIII", f.read(16))
        data = f.read(n * rows * cols)
    with gzip.open(os.path.join(path, "train-labels-idx1-ubyte.gz")) as f:
        f.read(8)
        labels = f.read(n)
    x = torch.frombuffer(bytearray(data), dtype=torch.uint8).view(n, 1, rows, cols).float() / 255.0
    x = (x - 0.2860) / 0.3530
    y = torch.tensor(list(labels), dtype=torch.int64)
    return x, y


def worker(rank, a, port, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.nproc)
    torch.manual_seed(0)
    m = torchvision.models.resnet34(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    model = nn.parallel.DistributedDataParallel(m)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    per = a.batch // a.nproc
    x, y = load_images(a.data, per * a.nproc * 4)
    steps = a.warmup + a.steps
    t0 = None
    for it in range(steps):
        if it == a.warmup:
            dist.barrier()
            t0 = time.perf_counter()
        j = (it % 4) * a.nproc + rank
        xb, yb = x[j * per:(j + 1) * per], y[j * per:(j + 1) * per]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
    dist.barrier()
    dt = time.perf_counter() - t0
    if rank == 0:
        out.put({"impl": "torch-ddp-gloo", "precision": "autocast_bf16" if a.autocast else "fp32",
                 "torch": torch.__version__, "nproc": a.nproc, "threads_per_rank": 1,
                 "global_batch": a.batch, "steps": a.steps, "step_ms": dt / a.steps * 1000.0,
                 "images_per_s": a.batch * a.steps / dt})
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--port", type=int, default=29611)
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--autocast", action="store_true", help="CPU autocast bfloat16")
    a = ap.parse_args()
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.spawn(worker, args=(a, a.port, q), nprocs=a.nproc, join=True)
    print(json.dumps(q.get()))


if __name__ == "__main__":
    main()
