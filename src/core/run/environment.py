"""The machine and software a run was measured on, recorded with every report."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import shutil
import subprocess
from typing import Any, Optional

import psutil

from ... import __version__
from ..config import available_cores


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvidia_driver() -> Optional[str]:
    if not shutil.which("nvidia-smi"):
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
        return out.strip().splitlines()[0] if out.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def capture(threads: int) -> dict[str, Any]:
    import pluggy
    import torch

    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({
                "device": f"cuda:{i}",
                "name": props.name,
                "memory_gb": round(props.total_memory / 1024**3, 1),
                "capability": f"{props.major}.{props.minor}",
            })
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "cnncompare": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "pluggy": pluggy.__version__,
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "cpu_cores_available": available_cores(),
        "threads": threads,
        "ram_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "gpus": gpus,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.cuda.is_available() else None,
        "nvidia_driver": _nvidia_driver(),
        "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        # What fp32 matmuls and convolutions may compute in on CUDA (the cells keep torch's
        # defaults): TF32 where allowed, which sets the peak fp32 rows are held against.
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "tf32_cudnn": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
    }
