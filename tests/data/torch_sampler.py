"""Reference for test_data_sampler_torch: PyTorch's DistributedSampler, shuffle off.

usage: torch_sampler.py N[,N...] MAX_WORLD
For each N, world size W in 1..MAX_WORLD, drop_last in (0, 1) and rank in 0..W-1,
prints one line: "N W drop_last rank count idx idx ...".
"""
import sys

from torch.utils.data.distributed import DistributedSampler

sizes = [int(x) for x in sys.argv[1].split(",")]
max_world = int(sys.argv[2])
for n in sizes:
    for w in range(1, max_world + 1):
        for drop in (0, 1):
            for r in range(w):
                s = DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False, drop_last=bool(drop))
                s.set_epoch(3)
                idx = list(iter(s))
                assert len(idx) == len(s)
                print(n, w, drop, r, len(idx), *idx)
