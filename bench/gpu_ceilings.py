#!/usr/bin/env python3
"""The GPU's ceilings, measured in the run that uses them (scripts/gpu-perf): a large
matrix product in bf16, in tf32 and in plain fp32 through cuBLAS (torch.matmul), and a
large device-to-device copy. Random data (zeros run faster and hide nothing), a warm-up,
then the median of `--reps` timings, each between two CUDA events around one call.

    gpu_ceilings.py [--gemm 8192] [--copy-mib 4096] [--reps 10] [--device cuda:0]

Prints one JSON object: TFLOP/s for each product (2*m*n*k / time) and the copy's
bandwidth in GB/s counting the bytes read plus the bytes written (METHOD.md's rule:
the figure the cost model's bytes are divided by).
"""
import argparse
import json
import statistics
import sys

import torch


def timed_ms(fn, reps):
    times = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times), min(times), max(times)


def gemm(n, dtype, tf32, reps, dev):
    torch.backends.cuda.matmul.allow_tf32 = tf32
    a = torch.randn(n, n, device=dev, dtype=dtype)
    b = torch.randn(n, n, device=dev, dtype=dtype)
    c = torch.empty(n, n, device=dev, dtype=dtype)
    for _ in range(3):
        torch.matmul(a, b, out=c)
    med, lo, hi = timed_ms(lambda: torch.matmul(a, b, out=c), reps)
    torch.backends.cuda.matmul.allow_tf32 = False
    flops = 2.0 * n * n * n
    return {"n": n, "median_ms": round(med, 4), "min_ms": round(lo, 4), "max_ms": round(hi, 4),
            "tflops": round(flops / (med * 1e-3) / 1e12, 1)}


def copy(mib, reps, dev):
    n = mib * 2**20 // 4
    src = torch.randn(n, device=dev)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    med, lo, hi = timed_ms(lambda: dst.copy_(src), reps)
    moved = 2.0 * n * 4  # read + written
    return {"bytes_read_plus_written": int(moved), "median_ms": round(med, 4), "min_ms": round(lo, 4),
            "max_ms": round(hi, 4), "gb_per_s": round(moved / (med * 1e-3) / 1e9, 1)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gemm", type=int, default=8192)
    ap.add_argument("--copy-mib", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--device", default="cuda:0")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"error": "torch.cuda.is_available() is False"}))
        return 3
    dev = torch.device(a.device)
    torch.cuda.set_device(dev)
    out = {
        "gemm_bf16": gemm(a.gemm, torch.bfloat16, False, a.reps, dev),
        "gemm_tf32": gemm(a.gemm, torch.float32, True, a.reps, dev),
        "gemm_fp32": gemm(a.gemm // 2, torch.float32, False, a.reps, dev),
        "copy": copy(a.copy_mib, a.reps, dev),
        "device_name": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "timing": "median of reps, CUDA events around one call, random data, 3 warm-up calls",
    }
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
