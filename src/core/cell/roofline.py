"""How far from the hardware: FLOPs of one step (training or inference), and a peak to hold them against.

The FLOPs are measured once per device per run, each precision's peak once per device per run
(by the first cell that needs it), and shared through the run's private directory.
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

#: Square matmul side for the peak probe: big enough to saturate, small enough to be quick.
#: On the 2-core CPU 1024 reached 128 GFLOP/s in 0.27 s where 2048 reached 95 in 2.5 s (best of 10
#: each): larger is slower to probe without being a truer peak there.
PROBE_SIZE = {"cpu": 1024, "cuda": 8192, "mps": 4096}


def step_gflop(job: Job, device: torch.device) -> float:
    """GFLOP of one step of the workload (torch.utils.flop_counter): forward + backward in
    training (Adam's elementwise update is not counted, as flop counters count matmul-class
    ops), the eval-mode forward in inference."""
    from torch.utils.flop_counter import FlopCounterMode

    model = job.build_model(device)
    x, y = job.make_batch(device)
    counter = FlopCounterMode(display=False)
    if job.inference:
        with counter, torch.inference_mode():
            model(x)
    else:
        with counter:
            job.loss(model(x), y).backward()
    return counter.get_total_flops() / 1e9


def peak_precision(precision: str, device: torch.device) -> str:
    """The precision a row's peak is probed in: the backend's own (``backends.base.precision``),
    except fp32 on CUDA where torch allows TF32 for matmuls or convolutions (cuDNN's convolutions
    do by default): then TF32's, the rate those kernels can reach."""
    if precision == "fp32" and device.type == "cuda" and (
            torch.backends.cuda.matmul.allow_tf32 or torch.backends.cudnn.allow_tf32):
        return "tf32"
    return precision


_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def peak_gflops(device: torch.device, precision: str = "fp32") -> float:
    """Best observed matmul rate in ``precision`` (fp32, tf32, bf16, fp16): a practical peak,
    not the datasheet's."""
    n = PROBE_SIZE.get(device.type, 2048)
    a = torch.randn(n, n, device=device, dtype=_DTYPES[precision])
    b = torch.randn(n, n, device=device, dtype=_DTYPES[precision])
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"  # the probe is a matmul; set back below
    try:
        for _ in range(2):
            a @ b
        best = 0.0
        for _ in range(10):
            synchronize(device)
            start = time.perf_counter()
            a @ b
            synchronize(device)
            best = max(best, 2 * n**3 / (time.perf_counter() - start) / 1e9)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return best


def roofline(job: Job, device: torch.device, cache_path: Optional[str],
             precision: str = "fp32") -> tuple[float, float, str]:
    """(GFLOP per step, peak GFLOP/s, the peak's precision) for this workload, device and backend
    precision. Shared by the run's cells through ``cache_path``: the step's FLOPs once, each
    precision's peak the first time a row needs it."""
    data: dict = {"peaks": {}}
    if cache_path and os.path.exists(cache_path):
        with open(cache_path) as f:
            data = json.load(f)
    label = peak_precision(precision, device)
    if "gflop_per_step" not in data or label not in data["peaks"]:
        if "gflop_per_step" not in data:
            data["gflop_per_step"] = step_gflop(job, device)
        data["peaks"][label] = peak_gflops(device, label)
        if cache_path:
            write_atomic(cache_path, json.dumps(data))
    return data["gflop_per_step"], data["peaks"][label], label
