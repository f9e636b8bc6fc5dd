#!/usr/bin/python3
"""PyTorch side of bench/model.sh: training-step throughput of the same model.

torchvision resnet34 (or resnet18) with conv1/maxpool set for the stem as ringtrain
builds it, torch.set_num_threads(THREADS), SGD(lr=0.01, momentum=0.9), random data made
once; a step is zero_grad + forward + cross_entropy + backward + optimizer.step.
Prints one JSON object per batch size (images/s, step ms, peak RSS of this process).
--autocast: forward and loss under torch.autocast("cpu", torch.bfloat16) (bench/bf16.sh).
"""
import argparse
import json
import resource
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision


def build(arch, stem, channels, classes):
    m = getattr(torchvision.models, arch)(num_classes=classes)
    if stem == "imagenet":
        m.conv1 = nn.Conv2d(channels, 64, kernel_size=7, stride=2, padding=3, bias=False)
    else:
        m.conv1 = nn.Conv2d(channels, 64, kernel_size=3, stride=1, padding=1, bias=False)
        m.maxpool = nn.Identity()
    return m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="resnet34")
    ap.add_argument("--stem", default="imagenet")
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--autocast", action="store_true", help="CPU autocast bfloat16")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = build(a.arch, a.stem, a.channels, 10)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, a.channels, a.size, a.size)
    y = torch.randint(0, 10, (a.batch,))
    total = 0.0
    for it in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if it >= a.warmup:
            total += dt
    ms = total / a.steps * 1000.0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    print(json.dumps({"impl": "torch", "torch": torch.__version__,
                      "precision": "autocast_bf16" if a.autocast else "fp32", "arch": a.arch, "stem": a.stem,
                      "channels": a.channels, "size": a.size, "batch": a.batch, "threads": a.threads,
                      "steps": a.steps, "images_per_s": round(a.batch * 1000.0 / ms, 2), "step_ms": round(ms, 3),
                      "last_loss": round(loss.item(), 5), "peak_rss_mb": round(rss, 1)}))


if __name__ == "__main__":
    main()
