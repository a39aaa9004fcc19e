"""Every statistic and derived figure, with its thresholds named once.

Raw samples are kept in the records; everything here is computed from them.
``derive`` fills a run's derived figures once, when a result joins a report
or a report is loaded; renderers only format what is here.
"""
from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

from .records import Status

if TYPE_CHECKING:
    from .results import CellResult

#: IQR / median above this: the machine was noisy (torch.utils.benchmark warns at the same 10 %).
NOISE_THRESHOLD = 0.10
#: Above this share of eager's CPU time in the kernel, the report points at ``--malloc reuse``.
KERNEL_SHARE_HINT = 0.2
#: Significance level of ``cnncompare compare``'s rank test.
DEFAULT_ALPHA = 0.05
#: A speedup's interval: this coverage; with fewer than 3 rounds, from this many bootstrap
#: resamples (seeded: the same samples give the same interval every time it is derived).
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000


@dataclass
class StepStats:
    """Seconds per step over the measured steps; every sample kept, in run order."""

    median: float
    q1: float
    q3: float
    min: float
    max: float
    n: int
    samples: list[float]

    @classmethod
    def from_samples(cls, samples: Sequence[float]) -> "StepStats":
        if not samples:
            raise ValueError("no samples")
        data = sorted(float(s) for s in samples)
        if len(data) == 1:
            q1 = q3 = data[0]
        else:
            # 'inclusive' interpolates between order statistics like numpy's default.
            q1, _, q3 = statistics.quantiles(data, n=4, method="inclusive")
        return cls(median=statistics.median(data), q1=q1, q3=q3, min=data[0], max=data[-1], n=len(data),
                   samples=[float(s) for s in samples])

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def percentile(self, p: float) -> float:
        """The ``p``-th percentile (0-100) of the samples, interpolating linearly between order
        statistics (numpy's default): with n samples p99 is near the largest once n < 100."""
        data = sorted(self.samples)
        position = (len(data) - 1) * p / 100.0
        low = math.floor(position)
        high = min(low + 1, len(data) - 1)
        return data[low] + (data[high] - data[low]) * (position - low)

    @property
    def relative_spread(self) -> float:
        """IQR / median."""
        return self.iqr / self.median if self.median > 0 else math.inf

    @property
    def noisy(self) -> bool:
        return self.relative_spread > NOISE_THRESHOLD


def quartiles_overlap(faster: StepStats, slower: StepStats) -> bool:
    """Whether the faster one's third quartile reaches the slower one's first: within the noise."""
    return faster.q3 >= slower.q1


def slowest(medians: Sequence[float]) -> int:
    """Index of the slowest rank: a synchronous step waits for it."""
    return max(range(len(medians)), key=medians.__getitem__)


def rank_test(base: Sequence[float], new: Sequence[float]) -> Optional[float]:
    """Two-sided Mann-Whitney U p-value (a rank test: no distribution assumed, one outlier step
    can't decide it); None with fewer than two samples on a side."""
    if len(base) < 2 or len(new) < 2:
        return None
    from scipy.stats import mannwhitneyu

    return float(mannwhitneyu(base, new, alternative="two-sided").pvalue)


def kernel_share(user_s: Optional[float], sys_s: Optional[float]) -> Optional[float]:
    """The share of a step's CPU time spent in the kernel (page faults, mostly)."""
    if not sys_s:
        return None
    return sys_s / (sys_s + (user_s or 0.0))


def kernel_share_hint(rows: Sequence["CellResult"], malloc: str) -> Optional[float]:
    """Eager's kernel share of its CPU step where the report should point at ``--malloc reuse``, else None:
    only for eager's ``ok`` CPU row (on an accelerator the host's kernel time is the driver's, not page
    faults), only under the system allocator, and only from ``KERNEL_SHARE_HINT`` up."""
    eager = next((r for r in rows if r.backend == "eager" and r.status is Status.OK and r.device == "cpu"), None)
    share = kernel_share(eager.cpu_user_s_per_step, eager.cpu_sys_s_per_step) if eager and malloc == "system" else None
    return share if share is not None and share >= KERNEL_SHARE_HINT else None


@dataclass
class ParityCost:
    """What the parity check cost on one device: computing the shared float64 reference (once),
    every cell's own check (loading the reference and its snapshots, comparing), and their share
    of the cells' wall time."""

    reference_s: float
    checks_s: float
    cells_wall_s: float

    @property
    def share(self) -> Optional[float]:
        return (self.reference_s + self.checks_s) / self.cells_wall_s if self.cells_wall_s else None


def parity_cost(rows: Sequence["CellResult"]) -> Optional[ParityCost]:
    """None where no row recorded its check's time (reports from before it was)."""
    checked = [r.parity for r in rows if r.parity is not None and r.parity.check_s is not None]
    if not checked:
        return None
    return ParityCost(reference_s=sum(p.reference_s or 0.0 for p in checked),
                      checks_s=sum(p.check_s or 0.0 for p in checked),
                      cells_wall_s=sum(r.wall_s or 0.0 for r in rows))


def typical_step_s(r: "CellResult") -> float:
    """A row's step seconds: the median of its rounds' medians with several rounds (each round
    weighs the same, however its drift went), else its steps' median."""
    assert r.step_s is not None
    return statistics.median(r.rounds) if r.rounds and len(r.rounds) > 1 else r.step_s.median


def sentinel_spread(seconds: Sequence[Optional[float]]) -> Optional[tuple[float, float]]:
    """The drift sentinel's fastest and slowest time over a device's rounds, None without two."""
    known = [s for s in seconds if s is not None]
    return (min(known), max(known)) if len(known) > 1 else None


Rounds = tuple[tuple[float, ...], ...]


def rounds_of(r: "CellResult") -> Rounds:
    """A row's measured step seconds, round by round (one round for a run without ``--rounds``)."""
    if r.round_samples:
        return tuple(tuple(s) for s in r.round_samples)
    return (tuple(r.step_s.samples),) if r.step_s else ()


#: Student's t, two-sided 95 %, by degrees of freedom (a df between two rows takes the lower:
#: the wider interval). Beyond the table, the normal's 1.96.
_T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
          10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}
#: From this many rounds the interval is the rounds' t-interval; below, a bootstrap (see below).
T_INTERVAL_MIN_ROUNDS = 3


def _t_975(df: int) -> float:
    if df > max(_T_975):
        return 1.96
    return _T_975[max(k for k in _T_975 if k <= df)]


@functools.lru_cache(maxsize=4096)
def speedup_interval(base: Rounds, other: Rounds) -> tuple[float, float, float]:
    """``(speedup, low, high)`` of ``other`` against ``base`` (> 1: ``other`` is faster).

    The speedup is the median over rounds of each round's ``median(base) / median(other)``:
    rounds are paired, since a round's drift hits both alike. The interval (95 %):

    - with ``T_INTERVAL_MIN_ROUNDS`` rounds or more, Student's t over the rounds' log ratios
      (the rounds are the independent repeats; a round's steps only make its median). Measured
      here, this is the interval that held: two default runs back to back moved rows by up to
      12 %, outside a bootstrap's interval over 3 rounds and inside this one;
    - with fewer, a two-level bootstrap (rounds resampled with replacement, then each round's
      steps; 2000 resamples, seeded): all there is, and narrower than the truth.

    It always contains the speedup. Cached: a report is derived again whenever a row joins.
    """
    pairs = list(zip(base, other))
    ratios = [statistics.median(b) / statistics.median(o) for b, o in pairs]
    speedup = statistics.median(ratios)
    if len(ratios) >= T_INTERVAL_MIN_ROUNDS:
        logs = [math.log(r) for r in ratios]
        half = _t_975(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
        low, high = math.exp(statistics.fmean(logs) - half), math.exp(statistics.fmean(logs) + half)
    else:
        rng = random.Random(0)
        draws = []
        for _ in range(BOOTSTRAP_RESAMPLES):
            picked = [pairs[rng.randrange(len(pairs))] for _ in pairs]
            draws.append(statistics.median(
                statistics.median(rng.choices(b, k=len(b))) / statistics.median(rng.choices(o, k=len(o)))
                for b, o in picked))
        draws.sort()
        tail = (1 - CONFIDENCE) / 2
        low = draws[int(tail * (len(draws) - 1))]
        high = draws[math.ceil((1 - tail) * (len(draws) - 1))]
    return speedup, min(low, speedup), max(high, speedup)


def measured_precision(r: "CellResult") -> Optional[str]:
    """What the row computed in, as its parity check measured it (None where it wasn't judged)."""
    return r.parity.precision if r.parity is not None else None


@dataclass
class Verdict:
    """Which backend to pick on one device, and how far to trust it.

    Rows are ranked among those computing at the baseline's precision (eager's, as measured:
    fp32 on the CPU, TF32-like on CUDA where cuDNN allows it); the fastest row at another
    precision (a bf16 row, or one that declares fp32 and measures bf16) is named apart in
    ``other_precision``, never ranked over them. The best row is the one with the highest
    speedup over eager. It is the ``pick`` only when its interval clears every other such row's;
    the rows whose interval reaches its lower end are ``tied_with`` it (eager's interval is the
    point 1.0). Without an eager row the fastest median is the best, untested.
    """

    device: str
    best: Optional["CellResult"]
    eager: Optional["CellResult"]
    tied_with: list[str] = field(default_factory=list)
    #: The best row's quartiles reach eager's: the win is within one round's noise.
    overlaps_eager: bool = False
    noisy: bool = False
    #: eager's measured precision, which ``best`` and ``tied_with`` share.
    precision: Optional[str] = None
    #: The fastest row at another precision, where it is faster than ``best``.
    other_precision: Optional["CellResult"] = None

    @property
    def pick(self) -> Optional[str]:
        return self.best.backend if self.best is not None and not self.tied_with else None

    def to_dict(self) -> dict:
        """The JSON ``verdict`` object of a device."""
        best, other = self.best, self.other_precision
        return {"pick": self.pick, "best": best.backend if best else None,
                "speedup": best.speedup_vs_eager if best else None,
                "speedup_ci": best.speedup_ci if best else None, "tied_with": self.tied_with,
                "precision": self.precision,
                "fastest_other_precision": None if other is None else {
                    "backend": other.backend, "precision": measured_precision(other),
                    "speedup": other.speedup_vs_eager, "speedup_ci": other.speedup_ci}}


def verdict(device: str, rows: Sequence["CellResult"]) -> Verdict:
    ok = [r for r in rows if r.status == Status.OK and r.step_s]
    eager = next((r for r in ok if r.backend == "eager"), None)
    if not ok:
        return Verdict(device, None, eager)
    if eager is None:
        return Verdict(device, min(ok, key=_median), None)
    baseline = measured_precision(eager)
    same = [r for r in ok if measured_precision(r) in (None, baseline)]
    others = [r for r in ok if r not in same]
    best = max(same, key=lambda r: (r.speedup_vs_eager or 0.0, r is eager))
    other = max(others, key=lambda r: r.speedup_vs_eager or 0.0, default=None)
    if other is not None and (other.speedup_vs_eager or 0.0) <= (best.speedup_vs_eager or 0.0):
        other = None
    low = best.speedup_ci[0] if best.speedup_ci else best.speedup_vs_eager or 1.0
    tied = [r.backend for r in sorted(same, key=lambda r: -(r.speedup_vs_eager or 0.0))
            if r is not best and r.speedup_ci and r.speedup_ci[1] >= low]
    if best is eager:
        return Verdict(device, best, eager, tied, precision=baseline, other_precision=other)
    assert best.step_s is not None and eager.step_s is not None
    overlaps = quartiles_overlap(best.step_s, eager.step_s)
    return Verdict(device, best, eager, tied, overlaps_eager=overlaps,
                   noisy=not overlaps and (best.step_s.noisy or eager.step_s.noisy), precision=baseline,
                   other_precision=other)


def _median(r: "CellResult") -> float:
    assert r.step_s is not None
    return r.step_s.median


#: Inference's latency percentiles (``latency_p50_s`` ...): over every measured step of every round.
LATENCY_PERCENTILES = (50, 90, 99)


def derive(results: Sequence["CellResult"], units_per_step: int, latency: bool = False) -> None:
    """Fill the derived figures: throughput (``units_per_step``: the batch in the workload's
    throughput unit, per rank under DDP, over the median step), achieved GFLOP/s and % of peak, and the comparison
    with eager on the same device (speedup, break-even, memory ratio), and DDP's scaling.
    ``latency`` (inference): each row's batch-latency percentiles (``LATENCY_PERCENTILES``).

    speedup_vs_eager = eager median / backend median (>1 is faster), per round and
    then the median over rounds (``speedup_interval``, with ``speedup_ci``), for
    ``ok`` cells only: a wrong or failed backend has no speedup worth quoting.
    break_even_steps = training steps until the backend's extra one-off cost
    (``one_off_cost``: compile, first step and warm-up beyond steady steps, minus
    eager's) is repaid by its per-step saving, eager's median x (1 - 1 / speedup); None when
    the speedup is not above 1.
    """
    eager = {r.device: r for r in results if r.backend == "eager" and r.status == Status.OK and r.step_s}
    for r in results:
        r.images_per_s = r.speedup_vs_eager = r.speedup_ci = r.break_even_steps = None
        r.warm_compile_s = _median_later(r.round_compile_s)
        r.warm_first_step_s = _median_later(r.round_first_step_s)
        r.achieved_gflops = r.pct_of_peak = r.memory_ratio_vs_eager = None
        r.latency_p50_s = r.latency_p90_s = r.latency_p99_s = None
        base = eager.get(r.device)
        if base is not None and r.status == Status.OK:
            r.memory_ratio_vs_eager = memory_ratio(base, r)
        if r.step_s is None or r.step_s.median <= 0:
            continue
        median = r.step_s.median
        r.images_per_s = units_per_step / median
        if latency:
            r.latency_p50_s, r.latency_p90_s, r.latency_p99_s = (r.step_s.percentile(p) for p in LATENCY_PERCENTILES)
        if r.gflop_per_step:
            r.achieved_gflops = r.gflop_per_step / median
            if r.peak_gflops:
                r.pct_of_peak = 100.0 * r.achieved_gflops / r.peak_gflops
        if r.distributed is not None:
            _derive_scaling(r, units_per_step, median)
        if r.status != Status.OK or base is None or base.step_s is None:
            continue
        if r is base:
            r.speedup_vs_eager, r.speedup_ci = 1.0, [1.0, 1.0]
        else:
            speedup, low, high = speedup_interval(rounds_of(base), rounds_of(r))
            r.speedup_vs_eager, r.speedup_ci = speedup, [low, high]
        # The saving per step from the speedup (the median over rounds), so that break-even
        # agrees with the speedup column: a row the rounds call slower has none.
        if r is not base and r.speedup_vs_eager > 1:
            saving = base.step_s.median * (1 - 1 / r.speedup_vs_eager)
            extra = one_off_cost(r) - one_off_cost(base)
            r.break_even_steps = 0 if extra <= 0 else math.ceil(extra / saving)


def _median_later(per_round: Optional[Sequence[Optional[float]]]) -> Optional[float]:
    """The median over rounds after the first (their compile cache is warm), None without any."""
    later = [v for v in (per_round or [])[1:] if v is not None]
    return statistics.median(later) if later else None


def _derive_scaling(r: "CellResult", units_per_step: int, slowest_median: float) -> None:
    """global_images_per_s = world x a rank's units per step / the slowest rank's median (a synchronous step waits
    for it); scaling_efficiency = that / (world x the single-process throughput), which is
    single-process median / slowest rank's median (1.0: DDP costs nothing)."""
    d = r.distributed
    assert d is not None
    d.global_images_per_s = d.nproc * units_per_step / slowest_median
    single = d.single_process_step_median_s
    d.single_process_images_per_s = units_per_step / single if single else None
    d.scaling_efficiency = single / slowest_median if single else None


def memory_ratio(eager: "CellResult", r: "CellResult") -> Optional[float]:
    """Eager's steady-state peak / this backend's (>1: uses less), as PyTorch's own harness reports
    it: the measured steps' peak of CUDA allocations where both have them, else of process RSS
    (reports older than the per-phase peaks: the lifetime peaks). One-off peaks (compile,
    autotuning, CUDA-graph recording in the warm-up) are reported apart, not compared here.

    A row that replays CUDA graphs writes its activations into the graph pool's blocks, which
    stay reserved but are not allocations during a replay: it is compared by reserved memory
    (both rows). A row whose device memory is its own allocator's has no CUDA ratio (None)."""
    if r.cuda_memory_incomparable and r.cuda_peak_allocated_mb is not None:
        return None
    graphs = r.dynamo is not None and bool(r.dynamo.cudagraphs_recorded)
    pairs = [(eager.cuda_peak_reserved_steady_mb, r.cuda_peak_reserved_steady_mb)] if graphs else \
        [(eager.cuda_peak_allocated_steady_mb, r.cuda_peak_allocated_steady_mb),
         (eager.cuda_peak_allocated_mb, r.cuda_peak_allocated_mb)]
    for a, b in (*pairs, (eager.peak_rss_steady_mb, r.peak_rss_steady_mb), (eager.peak_rss_mb, r.peak_rss_mb)):
        if a and b:
            return a / b
    return None


def one_off_peak(first_step: Optional[float], warmup: Optional[float]) -> Optional[float]:
    """The one-off peak (compile + first step, and the warm-up steps), None where unknown."""
    known = [v for v in (first_step, warmup) if v is not None]
    return max(known) if known else None


def one_off_cost(r: "CellResult") -> float:
    """What the backend costs once, beyond steady steps: compile, plus what the first step and the
    warm-up steps took beyond as many steady steps (lazy compiles, recompiles, CUDA-graph
    recording, TorchScript's profiling runs)."""
    steady = r.step_s.median if r.step_s else 0.0
    beyond = max(0.0, (r.first_step_s or 0.0) - steady) + max(0.0, sum(r.warmup_s) - len(r.warmup_s) * steady)
    return (r.compile_s or 0.0) + beyond
