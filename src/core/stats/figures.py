"""The derived figures of a report's rows: throughput, speedup and its interval, break-even,
memory against eager, GFLOP/s against the peak, DDP scaling, latency percentiles, what parity
cost, and the hints a renderer may word. ``derive`` fills them whenever a row joins a report or
a report is loaded; renderers only format them.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

from ..config import LoopSpec
from ..records import LOOP_EVENTS, LoopRehearsal, Status
from .intervals import (
    CONFIDENCE,
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


def speedup_of(eager: "CellResult", r: "CellResult", prior: Optional[Pooled] = None,
               confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(speedup, low, high)`` of ``r`` over eager, the interval at ``confidence``: from its warm
    pairs where it has them (with ``prior``, ``round_prior``), else from the rounds' medians
    (``intervals``). ValueError when nothing pairs them."""
    paired = paired_of(r)
    if paired is not None:
        return paired_speedup(paired, prior, confidence)
    return speedup_interval(rounds_of(eager), rounds_of(r), confidence)


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


def eager_step_s(rows: Sequence["CellResult"]) -> Optional[float]:
    """Eager's step seconds on one device as the speedups measured it: the geometric mean of the
    eager steps every row was paired with (each row's round weighing the same), the step every
    paired figure divides by. Without warm pairs (``--nproc``, older reports): eager's own
    ``typical_step_s``. None without an ``ok`` eager row."""
    eager = next((r for r in rows if r.backend == "eager" and r.status == Status.OK and r.step_s), None)
    if eager is None:
        return None
    logs = [math.log(statistics.geometric_mean(e)) for r in rows if r.status == Status.OK
            for e, _ in (paired_of(r) or ()) if e and min(e) > 0]
    return math.exp(statistics.fmean(logs)) if logs else typical_step_s(eager)


#: One-off costs beyond eager's below this many of eager's steps are nothing to repay: a first
#: step alone scatters by more than a step between processes (docs/reading.md, "up front").
UP_FRONT_NOISE_STEPS = 1.0


def derive(results: Sequence["CellResult"], units_per_step: int, latency: bool = False,
           target_pct: Optional[float] = None, loop: Optional[LoopSpec] = None, batch_size: int = 0) -> None:
    """Fill the derived figures, device by device. Every speed figure derives from the measurement
    the verdict uses:

    - ``speedup_vs_eager`` (eager's step / the backend's, > 1 is faster) with ``speedup_ci``: over
      the warm pairs (``intervals.paired_speedup``, with the round-to-round variance of the
      device's other rows, ``round_prior``), else per round (``intervals.speedup_interval``); for
      ``ok`` rows only: a wrong or failed backend has no speedup worth quoting;
    - ``step_time_s`` = eager's paired step (``eager_step_s``) / the speedup, ``step_time_ci``
      from the speedup's interval, and from it ``images_per_s`` (``units_per_step``: the batch in
      the workload's throughput unit, per rank under DDP) and the achieved GFLOP/s: a row's step
      time, throughput and speedup agree by construction. A row without a speedup (not ``ok``, or
      no eager on its device) has its own processes' median there instead, and ``step_time_ci`` None;
    - ``up_front_s``: what the backend costs once beyond eager (``one_off_cost``: compile, first
      step and warm-up beyond steady steps, wherever the compile happens), 0 below
      ``UP_FRONT_NOISE_STEPS`` of eager's steps; ``break_even_steps`` = that / the per-step saving
      (eager's step × (1 - 1 / speedup)), with ``break_even_ci`` from the speedup's interval (its
      upper end None: never, when the interval reaches 1); ``break_even_steps`` 0 when there is
      nothing to repay, None when the speedup's interval holds 1 or lies below it (never repaid);
    - ``memory_vs_eager``: the backend's steady-state peak / eager's (``memory_ratio``);
    - ``loop``: the run's ``loop`` (of ``batch_size`` batches) projected from the row's
      rehearsal and its step time (``loop_figures``), its speedup over eager's loop with the
      interval the step's carries (``_derive_loop``).

    ``latency`` (inference): each row's batch-latency percentiles (``LATENCY_PERCENTILES``, its own
    steps). ``target_pct``: a paired row's ``target_reached`` says whether its interval's
    half-width is within it.
    """
    for device in dict.fromkeys(r.device for r in results):
        rows = [r for r in results if r.device == device]
        _derive_device(rows, units_per_step, latency, target_pct)
        base = next((r for r in rows if r.backend == "eager" and r.status == Status.OK and r.step_s), None)
        _derive_loop(rows, base, loop or LoopSpec(), batch_size, latency)


def _derive_device(rows: Sequence["CellResult"], units_per_step: int, latency: bool,
                   target_pct: Optional[float]) -> None:
    base = next((r for r in rows if r.backend == "eager" and r.status == Status.OK and r.step_s), None)
    eager_s = eager_step_s(rows)
    for r in rows:
        r.images_per_s = r.speedup_vs_eager = r.speedup_ci = r.break_even_steps = r.target_reached = None
        r.step_time_s = r.step_time_ci = r.up_front_s = r.break_even_ci = None
        r.warm_compile_s = _median_later(r.round_compile_s)
        r.warm_first_step_s = _median_later(r.round_first_step_s)
        r.achieved_gflops = r.pct_of_peak = r.memory_vs_eager = None
        r.latency_p50_s = r.latency_p90_s = r.latency_p99_s = None
        if base is not None and r.status == Status.OK:
            r.memory_vs_eager = memory_ratio(base, r)
        if r.step_s is None or r.step_s.median <= 0:
            continue
        if latency:
            r.latency_p50_s, r.latency_p90_s, r.latency_p99_s = (r.step_s.percentile(p) for p in LATENCY_PERCENTILES)
        if r.distributed is not None:
            _derive_scaling(r, units_per_step, r.step_s.median)
        if r.status == Status.OK and base is not None and eager_s is not None:
            if r is base:
                r.speedup_vs_eager, r.speedup_ci = 1.0, [1.0, 1.0]
            else:
                try:
                    speedup, low, high = speedup_of(base, r, round_prior(rows, r))
                    r.speedup_vs_eager, r.speedup_ci = speedup, [low, high]
                    if target_pct is not None and paired_of(r) is not None:
                        r.target_reached = half_width(speedup, low, high) <= target_pct / 100
                except ValueError:  # no round in which both measured
                    pass
        if r.speedup_vs_eager is not None and r.speedup_ci is not None and eager_s is not None:
            r.step_time_s = eager_s / r.speedup_vs_eager
            r.step_time_ci = [eager_s / r.speedup_ci[1], eager_s / r.speedup_ci[0]]
        else:
            r.step_time_s = typical_step_s(r)
        r.images_per_s = units_per_step / r.step_time_s
        if r.gflop_per_step:
            r.achieved_gflops = r.gflop_per_step / r.step_time_s
            if r.peak_gflops:
                r.pct_of_peak = 100.0 * r.achieved_gflops / r.peak_gflops
        if base is not None and r is not base and r.speedup_vs_eager is not None and eager_s is not None:
            _break_even(r, base, eager_s)


def _break_even(r: "CellResult", base: "CellResult", eager_s: float) -> None:
    """``up_front_s``, ``break_even_steps`` and ``break_even_ci`` of ``r`` (``derive``)."""
    assert r.speedup_vs_eager is not None and r.speedup_ci is not None and r.step_time_s is not None
    extra = one_off_cost(r, r.step_time_s) - one_off_cost(base, eager_s)
    r.up_front_s = extra if extra > UP_FRONT_NOISE_STEPS * eager_s else 0.0
    if r.up_front_s == 0.0:
        r.break_even_steps, r.break_even_ci = 0, [0, 0]
        return
    low, high = r.speedup_ci
    if low <= 1.0:  # the interval holds 1 or lies below: the saving may be none, never repaid
        return

    def steps(speedup: float) -> int:
        return math.ceil(r.up_front_s / (eager_s * (1 - 1 / speedup)))  # type: ignore[operator]

    r.break_even_steps = steps(r.speedup_vs_eager)
    r.break_even_ci = [steps(high), steps(low)]


@dataclass
class LoopFigures:
    """A row's training loop (``config.LoopSpec``) projected from its rehearsal (``loop_figures``):
    ``total_s`` the loop's seconds (one-off costs, recompiles, train steps, evaluation),
    ``speedup_vs_eager`` eager's loop seconds over these with ``speedup_ci`` from the step's
    paired interval, ``recompiles`` the compiles dynamo started while the cell met the loop's
    events (None where dynamo never ran), ``events`` how many times the loop meets each event
    (``records.LOOP_EVENTS``; ``full`` includes the first step), ``error`` why there is no
    projection (the rehearsal failed, or the row has no step time)."""

    total_s: Optional[float] = None
    speedup_vs_eager: Optional[float] = None
    speedup_ci: Optional[list[float]] = None
    recompiles: Optional[int] = None
    events: dict[str, int] = field(default_factory=dict)
    error: Optional[str] = None


def loop_counts(loop: LoopSpec, batch_size: int, inference: bool = False) -> dict[str, int]:
    """How many times ``loop`` meets each event (``records.LOOP_EVENTS``): step ``g`` (counted
    from 1 across epochs) is ``ragged`` when it ends an epoch on a smaller batch, else ``resume``
    when an evaluation came just before it, else ``after_ragged`` once a ragged step has passed,
    else ``full``; ``eval`` counts evaluation batches, ``eval_steps`` after every ``eval_every``
    steps. Exact, in closed form (a loop may hold millions of steps)."""
    n, total = loop.epoch_steps, loop.epochs * loop.epoch_steps
    ragged = loop.ragged(batch_size)
    every = loop.eval_every if not inference else 0
    evaluations = total // every if every else 0
    # Evaluation k (after step k * every) is followed by step k * every + 1, if there is one.
    followed = min(evaluations, (total - 1) // every) if every else 0

    def ragged_resumes(lo: int, hi: int) -> int:
        """Evaluations k in [lo, hi] whose next step is an epoch's last (ragged, so not a resume)."""
        if not ragged or hi < lo:
            return 0
        if n == 1:
            return hi - lo + 1
        if math.gcd(every, n) != 1:  # k * every = -1 (mod n) has no solution
            return 0
        k0 = (-pow(every, -1, n)) % n or n  # the smallest k >= 1 that solves it

        def upto(m: int) -> int:
            return 0 if m < k0 else (m - k0) // n + 1

        return upto(hi) - upto(lo - 1)

    resumes = followed - ragged_resumes(1, followed)
    counts = dict.fromkeys(LOOP_EVENTS, 0)
    counts["eval"] = evaluations * loop.eval_steps
    counts["resume"] = resumes
    if not ragged:
        counts["full"] = total - resumes
        return counts
    late_from = -(-n // every) if every else followed + 1  # the first k whose next step is in epoch 2 or later
    late = max(0, followed - late_from + 1) - ragged_resumes(late_from, followed)
    counts["ragged"] = loop.epochs
    counts["full"] = (n - 1) - (resumes - late)
    counts["after_ragged"] = (loop.epochs - 1) * (n - 1) - late
    return counts


def loop_total_s(r: "CellResult", rehearsal: LoopRehearsal, counts: dict[str, int], step_s: float) -> float:
    """The loop's seconds at a steady full step of ``step_s``: the row's one-off cost
    (``one_off_cost``), ``full`` steps of ``step_s``, and every other event as often as the loop
    meets it at ``step_s`` times its ``ratio`` (what the rehearsal measured it costs against a
    full step in the same process and second), its first time's excess over its steady time
    once. The loop so moves with the paired step figure: the pairs say what a full step costs."""
    total = one_off_cost(r, step_s) + counts["full"] * step_s
    for name, count in counts.items():
        event = rehearsal.event(name)
        if name == "full" or not count:
            continue
        assert event is not None
        total += max(0.0, event.first_s - event.steady_s) + count * step_s * event.ratio
    return total


def loop_figures(r: "CellResult", loop: LoopSpec, batch_size: int, inference: bool) -> Optional[LoopFigures]:
    """A row's ``LoopFigures`` without the speedup (``_derive_loop`` adds it against eager's);
    None for a row whose cell did not rehearse the loop (``--nproc``, later rounds alone, reports
    from before it)."""
    rehearsal = r.loop_rehearsal
    if rehearsal is None:
        return None
    counts = loop_counts(loop, batch_size, inference)
    needed = {name for name, count in counts.items() if count and name != "full"}  # full steps: the measured ones
    met = {e.name for e in rehearsal.events}
    figures = LoopFigures(events=counts, error=rehearsal.error)
    seen = [e for e in rehearsal.events if e.name in needed | {"full"}]
    if r.dynamo is not None and all(e.compiles is not None and e.steady_compiles is not None for e in seen):
        figures.recompiles = sum((e.compiles or 0) + (e.steady_compiles or 0) for e in seen)
    missing = needed - met
    if missing and figures.error is None:
        figures.error = f"the rehearsal lacks {', '.join(sorted(missing))}"
    if figures.error is None and r.step_time_s is not None:
        figures.total_s = loop_total_s(r, rehearsal, counts, r.step_time_s)
    return figures


def _derive_loop(rows: Sequence["CellResult"], base: Optional["CellResult"], loop: LoopSpec, batch_size: int,
                 inference: bool) -> None:
    """Each row's ``loop`` and, against eager's loop, its ``speedup_vs_eager`` and interval (the
    step's paired interval carried through ``loop_total_s``)."""
    for r in rows:
        r.loop = loop_figures(r, loop, batch_size, inference) if r.status == Status.OK else None
    eager = base.loop if base is not None else None
    if eager is None or eager.total_s is None:
        return
    for r in rows:
        f = r.loop
        if f is None or f.total_s is None or r.loop_rehearsal is None:
            continue
        f.speedup_vs_eager = eager.total_s / f.total_s
        if r is base:
            f.speedup_ci = [1.0, 1.0]
        elif r.step_time_ci is not None:
            counts = f.events
            slow, fast = (loop_total_s(r, r.loop_rehearsal, counts, s) for s in (r.step_time_ci[1], r.step_time_ci[0]))
            f.speedup_ci = [eager.total_s / slow, eager.total_s / fast]


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
    """This backend's steady-state peak / eager's (< 1: uses less; 0.80 is 20 % less), as PyTorch's
    own harness compares them: allocated memory, not the allocator's. On the CPU the allocated
    peak of a step after the measured ones (``allocated_peak_steady_mb``, eager's from its own
    cell: the figure agrees to 0.01 % between processes running the same code); on CUDA
    the measured steps' peak of CUDA allocations. Where neither is had (not glibc; older
    reports) process RSS, whose heap scatters by several per cent between identical processes:
    eager's is the eager process the row's round-1 cell was paired with where it has one (the
    same phase of the same kind of process, in the same minute), else eager's own cell's
    (unpaired runs; older reports: the lifetime peaks). One-off peaks (compile, autotuning,
    CUDA-graph recording in the warm-up) are reported apart, not compared here.

    A row that replays CUDA graphs writes its activations into the graph pool's blocks, which
    stay reserved but are not allocations during a replay: it is compared by reserved memory
    (both rows). A row whose device memory is its own allocator's has no CUDA ratio (None)."""
    if r.cuda_memory_incomparable and r.cuda_peak_allocated_mb is not None:
        return None
    if eager.allocated_peak_steady_mb and r.allocated_peak_steady_mb:
        return r.allocated_peak_steady_mb / eager.allocated_peak_steady_mb
    graphs = r.dynamo is not None and bool(r.dynamo.cudagraphs_recorded)
    if r.eager_peak_rss_steady_mb is not None:  # the row's own eager partner
        pairs = [(r.eager_cuda_peak_reserved_steady_mb, r.cuda_peak_reserved_steady_mb)] if graphs else \
            [(r.eager_cuda_peak_allocated_steady_mb, r.cuda_peak_allocated_steady_mb)]
        pairs.append((r.eager_peak_rss_steady_mb, r.peak_rss_steady_mb))
    else:
        pairs = [(eager.cuda_peak_reserved_steady_mb, r.cuda_peak_reserved_steady_mb)] if graphs else \
            [(eager.cuda_peak_allocated_steady_mb, r.cuda_peak_allocated_steady_mb),
             (eager.cuda_peak_allocated_mb, r.cuda_peak_allocated_mb)]
        pairs += [(eager.peak_rss_steady_mb, r.peak_rss_steady_mb), (eager.peak_rss_mb, r.peak_rss_mb)]
    for a, b in pairs:
        if a and b:
            return b / a
    return None


def one_off_peak(first_step: Optional[float], warmup: Optional[float]) -> Optional[float]:
    """The one-off peak (compile + first step, and the warm-up steps), None where unknown."""
    known = [v for v in (first_step, warmup) if v is not None]
    return max(known) if known else None


def one_off_cost(r: "CellResult", steady: Optional[float] = None) -> float:
    """What the backend costs once, beyond steady steps: compile, plus what the first step and the
    warm-up steps took beyond as many steady steps of ``steady`` seconds (lazy compiles,
    recompiles, CUDA-graph recording, TorchScript's profiling runs), wherever the compile lands.
    ``steady`` None: the row's own median step."""
    if steady is None:
        steady = r.step_s.median if r.step_s else 0.0
    beyond = max(0.0, (r.first_step_s or 0.0) - steady) + max(0.0, sum(r.warmup_s) - len(r.warmup_s) * steady)
    return (r.compile_s or 0.0) + beyond
