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
from torch import nn

from cnncompare.core.config import RunConfig
from cnncompare.core.fileio import write_atomic
from cnncompare.core.workload import build_model, make_batch

#: Square fp32 matmul side for the peak probe: big enough to saturate, small enough to be quick.
#: On the 2-core CPU 1024 reached 128 GFLOP/s in 0.27 s where 2048 reached 95 in 2.5 s (best of 10
#: each): larger is slower to probe without being a truer peak there.
PROBE_SIZE = {"cpu": 1024, "cuda": 8192, "mps": 4096}


def train_step_gflop(config: RunConfig, device: torch.device) -> float:
    """GFLOP of one forward + backward of the workload (torch.utils.flop_counter; Adam's
    elementwise update is not counted, as flop counters count matmul-class ops)."""
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(config, device)
    x, y = make_batch(config, device)
    counter = FlopCounterMode(display=False)
    with counter:
        nn.NLLLoss()(model(x), y).backward()
    return counter.get_total_flops() / 1e9


def peak_gflops(device: torch.device) -> float:
    """Best observed fp32 matmul rate: a practical peak, not the datasheet's."""
    from cnncompare.core.measure import synchronize

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


def roofline(config: RunConfig, device: torch.device, cache_path: Optional[str]) -> dict:
    """{"gflop_per_step", "peak_gflops"} for this config and device, cached in ``cache_path``."""
    if cache_path and os.path.exists(cache_path):
        with open(cache_path) as f:
            return json.load(f)
    data = {"gflop_per_step": train_step_gflop(config, device), "peak_gflops": peak_gflops(device)}
    if cache_path:
        write_atomic(cache_path, json.dumps(data))
    return data
