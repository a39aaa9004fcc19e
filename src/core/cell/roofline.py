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


#: Operators whose FLOPs run in cuDNN's convolutions (the rest of what flop_counter counts are
#: matmul-class ops: mm, addmm, bmm, attention).
_CONV_OPS = ("convolution",)


def step_gflop(job: Job, device: torch.device) -> tuple[float, float]:
    """(GFLOP of one step, the share of them in convolutions), by torch.utils.flop_counter:
    forward + backward in training (the optimizer's elementwise update is not counted, as flop counters
    count matmul-class ops), the eval-mode forward in inference."""
    from torch.utils.flop_counter import FlopCounterMode

    model = job.build_model(device)
    x, y = job.batch(0, device)
    counter = FlopCounterMode(display=False)
    if job.inference:
        with counter, torch.inference_mode():
            model(x)
    else:
        with counter:  # micro-batch by micro-batch, as the step runs them (not one forward of them all)
            for xi, yi in job.recipe.split(x, y):
                job.loss(model(xi), yi).backward()
    total = counter.get_total_flops()
    conv = sum(n for op, n in counter.get_flop_counts().get("Global", {}).items()
               if any(name in str(op) for name in _CONV_OPS))
    return total / 1e9, (conv / total if total else 0.0)


def tf32_in_use(device: torch.device) -> tuple[bool, bool]:
    """(matmuls, convolutions) run in TF32 on this CUDA device under torch's current settings."""
    if device.type != "cuda":
        return False, False
    matmul = torch.backends.cuda.matmul.allow_tf32 or torch.get_float32_matmul_precision() != "highest"
    return bool(matmul), bool(torch.backends.cudnn.allow_tf32)


def peak_precision(precision: str, device: torch.device, conv_share: float = 0.0) -> str:
    """The precision a row's peak is probed in: the backend's own (``backends.base.precision``),
    except an fp32 row on CUDA: its matmuls and its convolutions each run in TF32 or fp32 as
    torch's flags say (cuDNN's convolutions allow TF32 by default, matmuls don't), so the label
    names what the step's FLOPs actually run in: ``fp32``, ``tf32``, or ``tf32 conv + fp32
    matmul`` (and the reverse), weighted by their shares (``peak_for``)."""
    if precision != "fp32" or device.type != "cuda":
        return precision
    matmul, conv = ("tf32" if on else "fp32" for on in tf32_in_use(device))
    if conv == matmul or conv_share >= 1:
        return conv
    if conv_share <= 0:
        return matmul
    return f"{conv} conv + {matmul} matmul"


def peak_for(label: str, peaks: dict[str, float], conv_share: float) -> float:
    """The rate a step whose FLOPs are ``conv_share`` convolutions would reach at each kind's
    peak: the FLOP-weighted harmonic mean of the probed peaks (time adds, not rate)."""
    if " conv + " not in label:
        return peaks[label]
    conv, matmul = label.replace(" matmul", "").split(" conv + ")
    return 1.0 / (conv_share / peaks[conv] + (1 - conv_share) / peaks[matmul])


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
    if "gflop_per_step" not in data:
        data["gflop_per_step"], data["conv_share"] = step_gflop(job, device)
    label = peak_precision(precision, device, data["conv_share"])
    kinds = label.replace(" matmul", "").split(" conv + ")
    missing = [k for k in kinds if k not in data["peaks"]]
    for kind in missing:
        data["peaks"][kind] = peak_gflops(device, kind)
    if cache_path and missing:
        write_atomic(cache_path, json.dumps(data))
    return data["gflop_per_step"], peak_for(label, data["peaks"], data["conv_share"]), label
