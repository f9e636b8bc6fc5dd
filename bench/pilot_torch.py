#!/usr/bin/python3
# bench/pilot_torch.py STEPS: the PyTorch side of the ImageNet-stem pilot in
# bench/results/fashion-mnist-pilots-20261123.json. DDP (gloo, 2 x 1 thread), torchvision resnet34
# (1-channel conv1), Fashion-MNIST, global batch 128, SGD nesterov 0.9, wd 5e-4 not on BN/bias,
# OneCycleLR(max_lr 0.05, 938 steps, pct_start 0.2), random crop pad 2 (one offset per batch).
# Prints, per 50 steps: first step, mean loss (rank 0), mean and max gradient norm. Not part of make bench.
import gzip, os, struct, sys
import torch, torch.nn as nn, torch.nn.functional as F, torchvision
import torch.distributed as dist, torch.multiprocessing as mp

def load(path, split):
    p = "train" if split == "train" else "t10k"
    with gzip.open(os.path.join(path, f"{p}-images-idx3-ubyte.gz")) as f:
        _, n, r, c = struct.unpack(">IIII", f.read(16)); d = f.read()
    with gzip.open(os.path.join(path, f"{p}-labels-idx1-ubyte.gz")) as f:
        f.read(8); l = f.read()
    x = torch.frombuffer(bytearray(d), dtype=torch.uint8).view(n, 1, r, c).float() / 255.0
    return (x - 0.2860) / 0.3530, torch.tensor(list(l), dtype=torch.int64)

def worker(rank, steps, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"; os.environ["MASTER_PORT"] = "29733"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(0)
    m = torchvision.models.resnet34(num_classes=10)
    m.conv1 = nn.Conv2d(1, 64, 7, 2, 3, bias=False)
    nn.init.kaiming_normal_(m.conv1.weight, mode="fan_out", nonlinearity="relu")
    model = nn.parallel.DistributedDataParallel(m)
    decay = [p for n, p in m.named_parameters() if p.ndim > 1]
    no = [p for n, p in m.named_parameters() if p.ndim <= 1]
    opt = torch.optim.SGD([{"params": decay, "weight_decay": 5e-4}, {"params": no, "weight_decay": 0}],
                          lr=0.05, momentum=0.9, nesterov=True)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=938, pct_start=0.2)
    x, y = load("/usr/share/datasets/fashion-mnist", "train")
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(60000, generator=g)[rank::2]
    per = 64
    rows = []
    for it in range(steps):
        idx = perm[it * per:(it + 1) * per]
        xb = F.pad(x[idx], (2, 2, 2, 2), value=(0 - 0.2860) / 0.3530)
        dy, dx = torch.randint(0, 5, (2,), generator=g)
        xb = xb[:, :, dy:dy + 28, dx:dx + 28]
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(xb), y[idx])
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(m.parameters(), 1e9)
        opt.step(); sched.step()
        rows.append((loss.item(), gn.item()))
    if rank == 0:
        for i in range(0, steps, 50):
            w = rows[i:i + 50]
            print(i + 1, round(sum(a for a, _ in w) / len(w), 3), round(sum(b for _, b in w) / len(w), 2), round(max(b for _, b in w), 1), flush=True)
    dist.destroy_process_group()

if __name__ == "__main__":
    mp.spawn(worker, args=(int(sys.argv[1]), None), nprocs=2)
