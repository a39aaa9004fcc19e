"""The derived figures of a report's rows: throughput, speedup and its interval, break-even,
memory against eager, GFLOP/s against the peak, DDP scaling, latency percentiles, what parity
cost, and the hints a renderer may word. ``derive`` fills them whenever a row joins a report or
a report is loaded; renderers only format them.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

from ..records import Status
from .intervals import (
    PairedRounds,
    Pooled,
    Rounds,
    half_width,
    paired_speedup,
    round_medians,
    rounds_to_target,
    speedup_interval,
)

if TYPE_CHECKING:  # rows are read and filled here; results.py calls derive, never the reverse at run time
    from ..results import CellResult

#: Above this share of eager's CPU time in the kernel, the report points at ``--malloc reuse``.
KERNEL_SHARE_HINT = 0.2


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
    medians = [m for m in round_medians(rounds_of(r)) if m is not None]
    return statistics.median(medians) if len(medians) > 1 else r.step_s.median


def rounds_of(r: "CellResult") -> Rounds:
    """A row's measured step seconds, round by round (an empty round where a later round failed;
    one round for a run without ``--rounds``)."""
    if r.round_samples:
        return tuple(tuple(s) for s in r.round_samples)
    return (tuple(r.step_s.samples),) if r.step_s else ()


def paired_of(r: "CellResult") -> Optional[PairedRounds]:
    """A row's warm pairs with eager, round by round (``PairedRounds``); None for a row measured
    without them (eager's own, ``--nproc``, reports from before warm pairs)."""
    if not r.round_eager_samples:
        return None
    return tuple((tuple(e), b) for e, b in zip(r.round_eager_samples, rounds_of(r)))


def round_prior(rows: Sequence["CellResult"], *exclude: "CellResult") -> Optional[Pooled]:
    """The round-to-round variance pooled over one device's ``ok`` paired rows but ``exclude``
    (``intervals.Pooled``): what the other rows say about how far a row's rounds scatter."""
    paired = [paired_of(r) for r in rows if r.status == Status.OK and all(r is not e for e in exclude)]
    return Pooled.of([p for p in paired if p is not None])


def speedup_of(eager: "CellResult", r: "CellResult", prior: Optional[Pooled] = None) -> tuple[float, float, float]:
    """``(speedup, low, high)`` of ``r`` over eager: from its warm pairs where it has them (with
    ``prior``, ``round_prior``), else from the rounds' medians (``intervals``). ValueError when
    nothing pairs them."""
    paired = paired_of(r)
    if paired is not None:
        return paired_speedup(paired, prior)
    return speedup_interval(rounds_of(eager), rounds_of(r))


def measured_rounds(r: "CellResult") -> int:
    """How many of a row's rounds measured steps (a failed or sat-out round has none)."""
    return sum(1 for m in r.rounds or [] if m is not None)


def later_round_s(r: "CellResult") -> Optional[float]:
    """What one more round of a row costs, in wall seconds: its wall time over its rounds, less
    what round 1's cold compile and first step took beyond a later round's (warm cache). None
    without two measured rounds (no warm one to compare with)."""
    measured = measured_rounds(r)
    if r.wall_s is None or measured < 2:
        return None
    cold_extra = 0.0
    for per_round in (r.round_compile_s, r.round_first_step_s):
        later = _median_later(per_round)
        if per_round and per_round[0] is not None and later is not None:
            cold_extra += max(0.0, per_round[0] - later)
    return max(0.0, r.wall_s - cold_extra) / measured


@dataclass
class TargetCost:
    """What reaching ``--target`` on every paired row of a device would take, at its measured
    round costs: ``extra_s`` more seconds of rounds, ``rounds`` for the widest row ``widest``."""

    extra_s: float
    rounds: int
    widest: str


def target_cost(rows: Sequence["CellResult"], target_pct: float) -> Optional[TargetCost]:
    """``TargetCost`` over one device's derived rows short of the target (``rounds_to_target``
    per row, times ``later_round_s``); None when every row reached it or a row's round cost is
    unknown."""
    short = [r for r in rows if r.target_reached is False and r.speedup_ci and r.speedup_vs_eager]
    if not short:
        return None
    extra, widest = 0.0, (0, "")
    for r in short:
        cost, measured = later_round_s(r), measured_rounds(r)
        if cost is None:
            return None
        assert r.speedup_vs_eager is not None and r.speedup_ci is not None
        needed = rounds_to_target(r.speedup_vs_eager, r.speedup_ci[0], r.speedup_ci[1], measured, target_pct / 100)
        extra += (needed - measured) * cost
        widest = max(widest, (needed, r.backend))
    return TargetCost(extra_s=extra, rounds=widest[0], widest=widest[1])


def measured_precision(r: "CellResult") -> Optional[str]:
    """What the row computed in, as its parity check measured it (None where it wasn't judged)."""
    return r.parity.precision if r.parity is not None else None


#: Inference's latency percentiles (``latency_p50_s`` ...): over every measured step of every round.
LATENCY_PERCENTILES = (50, 90, 99)


def derive(results: Sequence["CellResult"], units_per_step: int, latency: bool = False,
           target_pct: Optional[float] = None) -> None:
    """Fill the derived figures: throughput (``units_per_step``: the batch in the workload's
    throughput unit, per rank under DDP, over the median step), achieved GFLOP/s and % of peak, and the comparison
    with eager on the same device (speedup, break-even, memory ratio), and DDP's scaling.
    ``latency`` (inference): each row's batch-latency percentiles (``LATENCY_PERCENTILES``).
    ``target_pct``: a paired row's ``target_reached`` says whether its interval's half-width is
    within it.

    speedup_vs_eager = eager's step / the backend's (>1 is faster): over the warm pairs
    (``intervals.paired_speedup``, with the round-to-round variance of the device's other rows,
    ``round_prior``), else per round and the geometric mean over rounds
    (``intervals.speedup_interval``), with ``speedup_ci``,
    for ``ok`` cells only: a wrong or failed backend has no speedup worth quoting.
    break_even_steps = training steps until the backend's extra one-off cost
    (``one_off_cost``: compile, first step and warm-up beyond steady steps, minus
    eager's) is repaid by its per-step saving, eager's median x (1 - 1 / speedup); None when
    the speedup is not above 1.
    """
    eager = {r.device: r for r in results if r.backend == "eager" and r.status == Status.OK and r.step_s}
    for r in results:
        r.images_per_s = r.speedup_vs_eager = r.speedup_ci = r.break_even_steps = r.target_reached = None
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
            try:
                speedup, low, high = speedup_of(base, r, round_prior([o for o in results if o.device == r.device], r))
            except ValueError:  # no round in which both measured
                continue
            r.speedup_vs_eager, r.speedup_ci = speedup, [low, high]
            if target_pct is not None and paired_of(r) is not None:
                r.target_reached = half_width(speedup, low, high) <= target_pct / 100
        # The saving per step from the speedup (over rounds), so that break-even
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
