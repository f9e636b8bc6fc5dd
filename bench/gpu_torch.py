#!/usr/bin/env python3
"""PyTorch eager reference for bench/gpu.sh: ResNet34 training-step throughput on a GPU.

One step is what `ringtrain bench model` times: forward, cross-entropy, backward and an
SGD-with-momentum update (lr 0.01, momentum 0.9), on one random batch generated once on
the GPU. cudnn.benchmark is on; the precision is fp32 (TF32 off for cuDNN and matmul),
tf32 (both on) or bf16 (torch.autocast on CUDA with bfloat16 around the forward and the
loss, TF32 off: convolutions and linear layers in bf16, and their bf16 outputs go on
through batch norm (fp32 statistics), ReLU and the adds; the loss and the optimizer in
fp32. ringtrain's train.precision bf16 keeps fp32 activations between layers, so the two
round at different points; both are what a user would pick); the memory format is PyTorch's default (contiguous NCHW) or
channels_last. The model is torchvision's ResNet34 layout written out here (so
torchvision is not needed), with the imagenet stem (7x7/2 conv + 3x3/2 max pool) or the
cifar stem (3x3/1 conv, no max pool), `--channels` input channels and 10 classes.

The timed steps run between two CUDA events with one synchronisation at the end, as
`ringtrain bench model --device cuda` times its own. `--graphs` captures one whole step
(zero_grad, forward, loss, backward, optimizer step) in a CUDA graph after the warm-up
(torch.cuda.graph on a side stream, PyTorch's whole-network capture recipe; autocast's
cast cache off inside the capture, as graphs require) and times its replays: PyTorch
without its per-call host cost. `--compile` runs the model through torch.compile first
(its compile time is in the warm-up, not in the timed steps). Prints one JSON object: images/s,
mean step time, peak memory allocated and reserved by
PyTorch's caching allocator (torch.cuda.max_memory_allocated / max_memory_reserved),
and the versions.
"""
import argparse
import contextlib
import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)), inplace=True)
        out = self.bn2(self.conv2(out))
        identity = x if self.downsample is None else self.downsample(x)
        return F.relu(out + identity, inplace=True)


class ResNet(nn.Module):
    def __init__(self, layers, channels, stem, num_classes=10, width=64):
        super().__init__()
        if stem == "imagenet":
            self.conv1 = nn.Conv2d(channels, width, 7, 2, 3, bias=False)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
        else:
            self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
            self.maxpool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(width)
        blocks, cin = [], width
        for i, n in enumerate(layers):
            cout = width << i
            for j in range(n):
                blocks.append(BasicBlock(cin, cout, 2 if (i > 0 and j == 0) else 1))
                cin = cout
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x)), inplace=True))
        x = self.blocks(x)
        x = torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="resnet34", choices=["resnet18", "resnet34"])
    ap.add_argument("--stem", default="imagenet", choices=["imagenet", "cifar"])
    ap.add_argument("--channels", type=int, default=1)
    ap.add_argument("--size", type=int, default=28)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "bf16"])
    ap.add_argument("--memory-format", default="contiguous", choices=["contiguous", "channels_last"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--graphs", action="store_true", help="capture the whole step in a CUDA graph, time replays")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (default mode)")
    a = ap.parse_args()

    if not torch.cuda.is_available():
        print(json.dumps({"impl": "torch", "error": "torch.cuda.is_available() is False"}))
        return 3
    dev = torch.device(a.device)
    torch.cuda.set_device(dev)
    torch.backends.cudnn.benchmark = True
    tf32 = a.precision == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    mf = torch.channels_last if a.memory_format == "channels_last" else torch.contiguous_format

    torch.manual_seed(1)
    layers = [3, 4, 6, 3] if a.arch == "resnet34" else [2, 2, 2, 2]
    model = ResNet(layers, a.channels, a.stem).to(dev).to(memory_format=mf)
    model.train()
    fwd = torch.compile(model) if a.compile else model
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.randn(a.batch, a.channels, a.size, a.size, device=dev).contiguous(memory_format=mf)
    y = torch.randint(0, 10, (a.batch,), device=dev)

    # (no autocast object at all outside bf16: some versions query the device even when
    # it is disabled)
    # (a captured graph replays its casts: autocast's cache of cast weights must be off)
    if a.precision == "bf16":
        amp = lambda: torch.autocast(device_type="cuda", dtype=torch.bfloat16,  # noqa: E731
                                     cache_enabled=not a.graphs)
    else:
        amp = contextlib.nullcontext

    def body():
        with amp():
            loss = F.cross_entropy(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    def eager_step():
        opt.zero_grad(set_to_none=True)
        return body()

    torch.cuda.reset_peak_memory_stats(dev)
    step = eager_step
    if a.graphs:
        # PyTorch's whole-network capture: warm-up on a side stream (cudnn.benchmark's
        # search, the momentum buffers), gradients set to None before the capture so that
        # the captured backward writes them (no accumulation across replays)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            for _ in range(max(a.warmup, 3)):
                eager_step()
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        opt.zero_grad(set_to_none=True)
        with torch.cuda.graph(graph):
            static_loss = body()

        def step():
            graph.replay()
            return static_loss

    for _ in range(a.warmup):
        step()
    # timed as `ringtrain bench model` times its GPU steps: CUDA events on the stream
    # around the timed steps, one synchronisation after the last
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(a.steps):
        loss = step()
    end.record()
    end.synchronize()
    dt = start.elapsed_time(end) / 1000.0
    out = {
        "impl": "torch",
        "arch": a.arch,
        "stem": a.stem,
        "channels": a.channels,
        "size": a.size,
        "batch": a.batch,
        "precision": a.precision,
        "memory_format": a.memory_format,
        "graphs": a.graphs,
        "compile": a.compile,
        "steps": a.steps,
        "warmup": a.warmup,
        "images_per_s": round(a.batch * a.steps / dt, 2),
        "step_ms": round(dt * 1000.0 / a.steps, 3),
        "last_loss": round(float(loss.item()), 5),
        "peak_allocated_mb": round(torch.cuda.max_memory_allocated(dev) / 2**20, 1),
        "peak_reserved_mb": round(torch.cuda.max_memory_reserved(dev) / 2**20, 1),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version(),
        "device_name": torch.cuda.get_device_name(dev),
        "timing": "cuda events, one synchronisation per run" + (", replays of one captured step" if a.graphs else ""),
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
