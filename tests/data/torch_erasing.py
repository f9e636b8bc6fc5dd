#!/usr/bin/python3
"""torchvision's RandomErasing statistics for tests/data/test_data_erasing.c.

Usage: torch_erasing.py N P S0 S1 R0 R1 C H W

Applies torchvision.transforms.RandomErasing(p=P, scale=(S0, S1), ratio=(R0, R1),
value=0) to N images of ones (C, H, W) (torch.manual_seed(0)) and prints one line:
"erased mean_area var_area mean_logaspect var_logaspect mean_cy var_cy mean_cx var_cx"
over the erased images (area = h*w/(H*W), logaspect = log(h/w), cy = (i + h/2)/H and
cx = (j + w/2)/W the rectangle's centre). Exit 3 without torch/torchvision.
"""
import sys

try:
    import torch
    import torchvision.transforms as T
except Exception as e:  # pragma: no cover
    print("torch_erasing.py: cannot import torch/torchvision: %s" % e, file=sys.stderr)
    sys.exit(3)

n, p, s0, s1, r0, r1 = int(sys.argv[1]), *map(float, sys.argv[2:7])
c, h, w = map(int, sys.argv[7:10])
torch.manual_seed(0)
torch.set_num_threads(1)
t = T.RandomErasing(p=p, scale=(s0, s1), ratio=(r0, r1), value=0)
ones = torch.ones(c, h, w)
vals = [[], [], [], []]
for _ in range(n):
    z = (t(ones) == 0)[0]
    if not bool(z.any()):
        continue
    rows = torch.nonzero(z.any(1)).flatten()
    cols = torch.nonzero(z.any(0)).flatten()
    i, eh = int(rows[0]), int(rows[-1] - rows[0] + 1)
    j, ew = int(cols[0]), int(cols[-1] - cols[0] + 1)
    vals[0].append(eh * ew / (h * w))
    vals[1].append(float(torch.log(torch.tensor(eh / ew))))
    vals[2].append((i + eh / 2) / h)
    vals[3].append((j + ew / 2) / w)
out = [len(vals[0])]
for v in vals:
    x = torch.tensor(v, dtype=torch.float64)
    out += [float(x.mean()), float(x.var())]
print(" ".join("%.10g" % v for v in out))
