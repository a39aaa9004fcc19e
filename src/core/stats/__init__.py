"""Every statistic and derived figure, with its thresholds named once; renderers only format.

- ``intervals``  pure statistics over step seconds: summaries, paired speedup intervals, what
                 ``compare`` uses (two runs' intervals combined, the rounds' test). Imports nothing of cells or reports.
- ``figures``    a report's derived figures (``derive``): throughput, speedup, break-even, memory
                 ratio, % of peak, DDP scaling, latency, parity's cost, the allocator hint.
- ``verdict``    which backend to pick on a device, and how far to trust it.
"""
from .figures import (
    KERNEL_SHARE_HINT,
    LATENCY_PERCENTILES,
    UP_FRONT_NOISE_STEPS,
    LoopFigures,
    ParityCost,
    TargetCost,
    derive,
    eager_step_s,
    kernel_share,
    kernel_share_hint,
    later_round_s,
    loop_counts,
    loop_figures,
    measured_precision,
    measured_rounds,
    memory_ratio,
    one_off_cost,
    one_off_peak,
    paired_of,
    parity_cost,
    round_prior,
    rounds_of,
    target_cost,
    typical_step_s,
)
from .intervals import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    DEFAULT_ALPHA,
    MIN_PAIRED_ROUNDS,
    T_INTERVAL_MIN_ROUNDS,
    PairedRounds,
    Pooled,
    Rounds,
    StepStats,
    half_width,
    interval_ratio,
    paired_ratio,
    paired_speedup,
    round_medians,
    rounds_test,
    rounds_to_target,
    sentinel_spread,
    slowest,
    speedup_interval,
)
from .verdict import CONTROL, LOOKS, MAX_LOOKS, VERDICT_CONFIDENCE, Verdict, verdict

__all__ = ["BOOTSTRAP_RESAMPLES", "CONFIDENCE", "CONTROL", "DEFAULT_ALPHA", "KERNEL_SHARE_HINT",
           "LATENCY_PERCENTILES", "LOOKS", "MAX_LOOKS", "MIN_PAIRED_ROUNDS", "LoopFigures", "PairedRounds", "ParityCost", "Pooled",
           "Rounds", "StepStats", "T_INTERVAL_MIN_ROUNDS", "TargetCost", "UP_FRONT_NOISE_STEPS", "VERDICT_CONFIDENCE", "Verdict",
           "derive", "eager_step_s", "half_width", "interval_ratio", "kernel_share", "kernel_share_hint",
           "later_round_s", "loop_counts", "loop_figures", "measured_precision", "measured_rounds", "memory_ratio", "one_off_cost",
           "one_off_peak", "paired_of", "paired_ratio", "paired_speedup", "parity_cost",
           "round_medians", "round_prior", "rounds_of", "rounds_test", "rounds_to_target", "sentinel_spread",
           "slowest", "speedup_interval", "target_cost", "typical_step_s", "verdict"]
