"""Reference for bench/loader.sh: PyTorch's DataLoader with the torchvision transforms a
PyTorch user would write for the same job (RandomCrop with padding, RandomHorizontalFlip,
ToTensor-style scaling, Normalize), one process, one thread (num_workers=0), on synthetic
uint8 data of the same shapes as `ringtrain bench loader`. Prints one JSON object.

usage: loader.py [--images N] [--batch B]
"""
import argparse
import json
import time

import torch
import torchvision.transforms as T
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--images", type=int, default=20000)
p.add_argument("--batch", type=int, default=256)
args = p.parse_args()
torch.set_num_threads(1)


class Synthetic(Dataset):
    def __init__(self, n, c, h, w, pad, mean, std):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randint(0, 256, (n, c, h, w), dtype=torch.uint8, generator=g)
        self.y = torch.arange(n) % 10
        self.t = T.Compose([
            T.RandomCrop(h, padding=pad),
            T.RandomHorizontalFlip(),
            T.ConvertImageDtype(torch.float32),  # /255, as ToTensor on a PIL image
            T.Normalize(mean, std),
        ])

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.t(self.x[i]), self.y[i]


results = []
for name, c, h, w, n, pad, mean, std in [
    ("1x28x28", 1, 28, 28, 60000, 2, (0.2860,), (0.3530,)),
    ("3x32x32", 3, 32, 32, 50000, 4, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
]:
    ds = Synthetic(n, c, h, w, pad, mean, std)
    dl = DataLoader(ds, batch_size=args.batch, shuffle=True, num_workers=0)
    it = iter(dl)
    next(it)  # warm-up
    got = 0
    t0 = time.perf_counter()
    while got < args.images:
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(dl)
            continue
        got += x.shape[0]
    dt = time.perf_counter() - t0
    results.append({"shape": name, "dataset_size": n, "images": got, "seconds": round(dt, 6),
                    "images_per_s": round(got / dt, 1)})
print(json.dumps({"reference": "torch.utils.data.DataLoader, torchvision transforms, num_workers=0, 1 thread",
                  "torch": torch.__version__, "batch": args.batch, "results": results}))
