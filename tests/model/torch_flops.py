#!/usr/bin/env python3
"""FLOPs per image of the models of tests/model/test_flops.c, counted by PyTorch's own
profiler (torch.profiler with_flops: aten::conv2d and aten::addmm, 2 per multiply-add) on
the torchvision models that ringtrain's checkpoints load into (torch_reference.build).
Reads lines "arch stem in_channels size" from argv[1]; prints per line
"forward <flops> first_conv <flops>" (the first convolution run, conv1). Exit 3 when
/usr/bin/python3 has no torch/torchvision."""
import argparse
import os
import sys

try:
    import torch
    import torchvision  # noqa: F401  (build needs it)
except ImportError:
    sys.exit(3)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_reference import build  # noqa: E402


def count(arch, stem, channels, size):
    model = build(argparse.Namespace(arch=arch, stem=stem, in_channels=channels, classes=10))
    model.eval()
    x = torch.zeros(1, channels, size, size)
    with torch.profiler.profile(with_flops=True) as prof:
        with torch.no_grad():
            model(x)
    events = [e for e in prof.events() if e.flops]
    convs = sorted((e for e in events if e.name == "aten::conv2d"), key=lambda e: e.time_range.start)
    return sum(e.flops for e in events), convs[0].flops


def main():
    torch.set_num_threads(1)
    with open(sys.argv[1]) as f:
        for line in f:
            arch, stem, channels, size = line.split()
            fwd, first = count(arch, stem, int(channels), int(size))
            print("forward %d first_conv %d" % (fwd, first))


if __name__ == "__main__":
    main()
