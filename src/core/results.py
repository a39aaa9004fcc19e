"""Result dataclasses, statistics and derived figures; JSON in and out.

Raw samples are kept; statistics are derived from them. JSON comes from
``dataclasses.asdict``, so the schema is these classes (README documents it).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Optional

SCHEMA_VERSION = 1


class Status(str, Enum):
    OK = "ok"
    FAIL_ACCURACY = "fail_accuracy"
    FAIL_COMPILE = "fail_compile"
    FAIL_RUN = "fail_run"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OOM = "oom"
    SKIPPED = "skipped"


@dataclass
class StepStats:
    """Seconds per training step over the measured steps; every sample kept."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int
    samples: list[float]

    @classmethod
    def from_samples(cls, samples: list[float]) -> "StepStats":
        if not samples:
            raise ValueError("no samples")
        data = sorted(float(s) for s in samples)
        if len(data) == 1:
            q1 = q3 = data[0]
        else:
            # 'inclusive' interpolates between order statistics like numpy's default.
            q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
        return cls(
            median=statistics.median(data), q1=q1, q3=q3, min=data[0], max=data[-1], n=len(data),
            samples=[float(s) for s in samples],
        )

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    @property
    def relative_spread(self) -> float:
        """IQR / median: above 0.1 the machine was noisy (torch.utils.benchmark warns there too)."""
        return self.iqr / self.median if self.median > 0 else math.inf


@dataclass
class Parity:
    """The backend's first training step against a float64 eager reference.

    ``*_rel_error`` are norm-relative errors ``||x - ref|| / ||ref||`` over the
    loss, all gradients together and all updated weights together, for the
    backend and, for scale, for fp32 eager. The verdict is per tensor:
    ``rmse(backend) <= multiplier * rmse(fp32 eager) + tolerance``.
    """

    passed: bool
    reference: str
    multiplier: float
    tolerance: float
    loss_rel_error: float
    grad_rel_error: float
    weight_rel_error: float
    eager_loss_rel_error: float
    eager_grad_rel_error: float
    eager_weight_rel_error: float
    worst_tensor: Optional[str] = None
    worst_rmse: Optional[float] = None
    worst_limit: Optional[float] = None
    detail: Optional[str] = None

    @property
    def max_rel_error(self) -> float:
        return max(self.loss_rel_error, self.grad_rel_error, self.weight_rel_error)


@dataclass
class CellResult:
    """One backend on one device. Figures that don't apply are None (null in JSON)."""

    backend: str
    device: str
    status: Status
    plugin: Optional[str] = None
    description: str = ""
    compile_s: Optional[float] = None
    first_step_s: Optional[float] = None
    warmup_s: list[float] = field(default_factory=list)
    step_s: Optional[StepStats] = None
    images_per_s: Optional[float] = None
    speedup_vs_eager: Optional[float] = None
    break_even_steps: Optional[int] = None
    threads: Optional[int] = None
    rss_baseline_mb: Optional[float] = None
    peak_rss_mb: Optional[float] = None
    peak_rss_first_step_mb: Optional[float] = None
    peak_rss_steady_mb: Optional[float] = None
    cuda_peak_allocated_mb: Optional[float] = None
    cuda_peak_reserved_mb: Optional[float] = None
    cuda_peak_allocated_first_step_mb: Optional[float] = None
    cuda_peak_reserved_first_step_mb: Optional[float] = None
    parity: Optional[Parity] = None
    gflop_per_step: Optional[float] = None
    achieved_gflops: Optional[float] = None
    peak_gflops: Optional[float] = None
    pct_of_peak: Optional[float] = None
    memory_ratio_vs_eager: Optional[float] = None
    #: What the measured steps cost the OS, per step (process-wide: all threads).
    cpu_user_s_per_step: Optional[float] = None
    cpu_sys_s_per_step: Optional[float] = None
    page_faults_per_step: Optional[float] = None
    dynamo: Optional[dict] = None
    compile_cache: Optional[str] = None
    compile_threads: Optional[int] = None
    cold_compile_s: Optional[float] = None
    cold_first_step_s: Optional[float] = None
    #: Under --nproc: world size, per-rank medians, global throughput, scaling efficiency,
    #: rank agreement (see core/distributed.py and README's schema). None for one process.
    distributed: Optional[dict] = None
    error: Optional[str] = None
    error_tail: Optional[str] = None
    notes: list[str] = field(default_factory=list)
    wall_s: Optional[float] = None

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "CellResult":
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["status"] = Status(kwargs["status"])
        if kwargs.get("step_s"):
            kwargs["step_s"] = StepStats(**kwargs["step_s"])
        if kwargs.get("parity"):
            parity_known = {f.name for f in fields(Parity)}
            kwargs["parity"] = Parity(**{k: v for k, v in kwargs["parity"].items() if k in parity_known})
        return cls(**kwargs)


@dataclass
class RunReport:
    """A whole run: what was measured where, and every cell's result."""

    environment: dict[str, Any]
    config: dict[str, Any]
    results: list[CellResult] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    interrupted: bool = False
    schema_version: int = SCHEMA_VERSION

    def derive(self) -> "RunReport":
        """Recompute every derived figure from the raw results (see ``derive``)."""
        derive(self.results, self.config["batch_size"])
        return self

    def to_dict(self) -> dict:
        self.derive()
        data = asdict(self)
        data["results"] = [r.to_dict() for r in self.results]
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RunReport":
        if data.get("schema_version") != SCHEMA_VERSION:
            raise ValueError(f"unsupported schema_version {data.get('schema_version')!r} (expected {SCHEMA_VERSION})")
        known = {f.name for f in fields(cls)}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["results"] = [CellResult.from_dict(r) for r in data.get("results", [])]
        return cls(**kwargs)

    def devices(self) -> list[str]:
        return list(dict.fromkeys(r.device for r in self.results))


def derive(results: list[CellResult], batch_size: int) -> None:
    """Fill the derived figures: images/s, achieved GFLOP/s and % of peak, and the comparison
    with eager on the same device (speedup, break-even, memory ratio).

    speedup_vs_eager = eager median / backend median (>1 is faster), for ``ok``
    cells only: a wrong or failed backend has no speedup worth quoting.
    break_even_steps = training steps until the backend's extra one-off cost
    (compile + first step beyond one steady step, minus eager's) is repaid by
    its per-step saving; None when it is not faster.
    """
    eager = {r.device: r for r in results if r.backend == "eager" and r.status == Status.OK and r.step_s}
    for r in results:
        r.images_per_s = r.speedup_vs_eager = r.break_even_steps = None
        r.achieved_gflops = r.pct_of_peak = r.memory_ratio_vs_eager = None
        base = eager.get(r.device)
        if base is not None and r.status == Status.OK:
            r.memory_ratio_vs_eager = _memory_ratio(base, r)
        if r.step_s is None or r.step_s.median <= 0:
            continue
        r.images_per_s = batch_size / r.step_s.median
        if r.gflop_per_step:
            r.achieved_gflops = r.gflop_per_step / r.step_s.median
            if r.peak_gflops:
                r.pct_of_peak = 100.0 * r.achieved_gflops / r.peak_gflops
        if r.distributed is not None:
            _derive_scaling(r.distributed, batch_size, r.step_s.median)
        if r.status != Status.OK or base is None:
            continue
        r.speedup_vs_eager = base.step_s.median / r.step_s.median
        saving = base.step_s.median - r.step_s.median
        if saving <= 0:
            continue
        extra = _one_off_cost(r) - _one_off_cost(base)
        r.break_even_steps = 0 if extra <= 0 else math.ceil(extra / saving)


def _derive_scaling(dist: dict, batch_size: int, slowest_median: float) -> None:
    """global_images_per_s = world x batch / the slowest rank's median (a synchronous step waits
    for it); scaling_efficiency = that / (world x the single-process images/s), which is
    single-process median / slowest rank's median (1.0: DDP costs nothing)."""
    world = dist["nproc"]
    dist["global_images_per_s"] = world * batch_size / slowest_median
    single = dist.get("single_process_step_median_s")
    dist["single_process_images_per_s"] = batch_size / single if single else None
    dist["scaling_efficiency"] = single / slowest_median if single else None


def _memory_ratio(eager: CellResult, r: CellResult) -> Optional[float]:
    """Eager's peak / this backend's peak (>1: uses less), as PyTorch's own harness reports it.
    CUDA allocations where both have them, else process RSS."""
    for key in ("cuda_peak_allocated_mb", "peak_rss_mb"):
        a, b = getattr(eager, key), getattr(r, key)
        if a and b:
            return a / b
    return None


def _one_off_cost(r: CellResult) -> float:
    return (r.compile_s or 0.0) + max(0.0, (r.first_step_s or 0.0) - r.step_s.median)

