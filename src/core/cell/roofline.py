"""How far from the hardware: FLOPs of one training step, and a peak to hold them against.

Both are measured once per device per run (by the first cell that needs
them) and shared through the run's private directory.
"""
from __future__ import annotations

import json
import os
import time
from typing import Optional

import torch

from ..fileio import write_atomic
from .timing import synchronize
from .training import Job

#: Square fp32 matmul side for the peak probe: big enough to saturate, small enough to be quick.
#: On the 2-core CPU 1024 reached 128 GFLOP/s in 0.27 s where 2048 reached 95 in 2.5 s (best of 10
#: each): larger is slower to probe without being a truer peak there.
PROBE_SIZE = {"cpu": 1024, "cuda": 8192, "mps": 4096}


def train_step_gflop(job: Job, device: torch.device) -> float:
    """GFLOP of one forward + backward of the workload (torch.utils.flop_counter; Adam's
    elementwise update is not counted, as flop counters count matmul-class ops)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = job.build_model(device)
    x, y = job.make_batch(device)
    counter = FlopCounterMode(display=False)
    with counter:
        job.loss(model(x), y).backward()
    return counter.get_total_flops() / 1e9


def peak_gflops(device: torch.device) -> float:
    """Best observed fp32 matmul rate: a practical peak, not the datasheet's."""
    n = PROBE_SIZE.get(device.type, 2048)
    a = torch.randn(n, n, device=device)
    b = torch.randn(n, n, device=device)
    for _ in range(2):
        a @ b
    best = 0.0
    for _ in range(10):
        synchronize(device)
        start = time.perf_counter()
        a @ b
        synchronize(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    return best


def roofline(job: Job, device: torch.device, cache_path: Optional[str]) -> tuple[float, float]:
    """(GFLOP per step, peak GFLOP/s) for this workload and device, cached in ``cache_path``."""
    if cache_path and os.path.exists(cache_path):
        with open(cache_path) as f:
            data = json.load(f)
    else:
        data = {"gflop_per_step": train_step_gflop(job, device), "peak_gflops": peak_gflops(device)}
        if cache_path:
            write_atomic(cache_path, json.dumps(data))
    return data["gflop_per_step"], data["peak_gflops"]
