"""Pure statistics over step times: summaries, paired speedup intervals, tests between runs.

Nothing here knows what a cell or a report is: the inputs are seconds. ``figures`` and
``verdict`` apply these to a report's rows.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np
from scipy import stats as _scipy

#: Significance level of ``cnncompare compare``'s test.
DEFAULT_ALPHA = 0.05
#: A speedup's interval: this coverage; with fewer than ``T_INTERVAL_MIN_ROUNDS`` rounds, from this
#: many bootstrap resamples (seeded: the same samples give the same interval every time).
CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 2000
#: Unpaired rounds (``--nproc``, reports from before warm pairs): from this many an interval is
#: Student's t over the rounds; below, a bootstrap over one process's steps, narrower than the truth.
T_INTERVAL_MIN_ROUNDS = 3
#: Warm pairs: a pick needs this many rounds (process pairs); with one, the interval is a bootstrap
#: over that round's steps, narrower than the truth.
MIN_PAIRED_ROUNDS = 2

#: Step seconds, round by round: one tuple per round (an empty one for a round that failed).
Rounds = tuple[tuple[float, ...], ...]
#: Warm pairs, round by round: ``(eager's steps, the backend's steps)``, step pair ``i`` being the
#: ``i``-th of each; an empty round where the row didn't run (or failed) in that round.
PairedRounds = tuple[tuple[tuple[float, ...], tuple[float, ...]], ...]


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


def slowest(medians: Sequence[float]) -> int:
    """Index of the slowest rank: a synchronous step waits for it."""
    return max(range(len(medians)), key=medians.__getitem__)


def sentinel_spread(seconds: Sequence[Optional[float]]) -> Optional[tuple[float, float]]:
    """The drift sentinel's fastest and slowest time over a device's rounds, None without two."""
    known = [s for s in seconds if s is not None]
    return (min(known), max(known)) if len(known) > 1 else None


def round_medians(rounds: Rounds) -> list[Optional[float]]:
    """Each round's median step, None for a round that failed."""
    return [statistics.median(r) if r else None for r in rounds]


@functools.lru_cache(maxsize=4096)
def speedup_interval(base: Rounds, other: Rounds, confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(speedup, low, high)`` of ``other`` against ``base`` (> 1: ``other`` is faster), its
    interval at ``confidence``.

    Rounds are paired by their number (a round's drift hits both alike; a round that failed on
    either side pairs with nothing). Each pair gives ``median(base) / median(other)``; the speedup
    is their geometric mean, the centre of its interval:

    - with ``T_INTERVAL_MIN_ROUNDS`` pairs or more, Student's t over the pairs' log ratios (the
      rounds are the independent repeats; a round's steps only make its median);
    - with fewer, a bootstrap over each round's steps (scipy's, percentile, seeded): all there is,
      and narrower than the truth, since one process's steps are not independent repeats.

    It always contains the speedup. Cached: a report is derived again whenever a row joins.
    """
    pairs = [(np.asarray(b), np.asarray(o)) for b, o in zip(base, other) if b and o]
    if not pairs:
        raise ValueError("no round measured both")
    logs = np.log([np.median(b) / np.median(o) for b, o in pairs])
    speedup = float(np.exp(logs.mean()))
    if len(logs) >= T_INTERVAL_MIN_ROUNDS:
        spread = float(_scipy.sem(logs))
        low, high = (speedup, speedup) if spread == 0 else (
            float(np.exp(v)) for v in _scipy.t.interval(confidence, len(logs) - 1, loc=logs.mean(), scale=spread))
    else:
        samples = [a for pair in pairs for a in pair]

        def statistic(*data, axis=-1):
            ratios = [np.median(b, axis=axis) / np.median(o, axis=axis) for b, o in zip(data[::2], data[1::2])]
            return np.exp(np.mean(np.log(ratios), axis=0))

        if all(len(s) > 1 for s in samples):
            result = _scipy.bootstrap(samples, statistic, n_resamples=BOOTSTRAP_RESAMPLES, confidence_level=confidence,
                                      method="percentile", random_state=np.random.default_rng(0))
            low, high = float(result.confidence_interval.low), float(result.confidence_interval.high)
        else:
            low = high = speedup
    return speedup, min(low, speedup), max(high, speedup)


def _round_logs(rounds: PairedRounds) -> dict[int, np.ndarray]:
    """Each round's step-pair log ratios ``log(eager / backend)``, by round number."""
    return {k: np.log(np.asarray(e) / np.asarray(b)) for k, (e, b) in enumerate(rounds) if len(e) and len(e) == len(b)}


def _within(logs: Sequence[np.ndarray]) -> Optional[float]:
    """The variance of a round's mean log ratio from its own step pairs' scatter (averaged over
    the rounds with two pairs or more), None without any."""
    parts = [float(np.var(v, ddof=1)) / len(v) for v in logs if len(v) > 1]
    return float(np.mean(parts)) if parts else None


def _bootstrap_within(logs: np.ndarray, confidence: float) -> tuple[float, float]:
    """A percentile bootstrap of one round's mean log ratio over its step pairs (seeded)."""
    rng = np.random.default_rng(0)
    draws = logs[rng.integers(len(logs), size=(BOOTSTRAP_RESAMPLES, len(logs)))].mean(axis=1)
    low, high = np.quantile(draws, [(1 - confidence) / 2, (1 + confidence) / 2])
    return float(low), float(high)


@functools.lru_cache(maxsize=4096)
def _round_spread(rounds: PairedRounds) -> Optional[tuple[float, int]]:
    """``(variance, df)`` of one row's rounds' mean log ratios, None with fewer than two rounds.
    Cached: every other row's interval pools it, each time a report is derived."""
    means = [v.mean() for v in _round_logs(rounds).values()]
    return (float(np.var(means, ddof=1)), len(means) - 1) if len(means) > 1 else None


@dataclass(frozen=True)
class Pooled:
    """The variance of a round's mean log ratio pooled over rows (each row's sample variance of
    its rounds' means, weighed by its degrees of freedom), and those degrees of freedom."""

    variance: float
    df: int

    @staticmethod
    def of(rows: Sequence[PairedRounds]) -> Optional["Pooled"]:
        """Pooled over ``rows`` (each with two rounds or more counts); None when none has two."""
        parts = [part for part in map(_round_spread, rows) if part is not None]
        df = sum(d for _, d in parts)
        return Pooled(sum(v * d for v, d in parts) / df, df) if df else None

    def doubled(self) -> "Pooled":
        """For a difference of two rows' round means: both rows' variance (each row is paired with
        an eager process of its own, so nothing of it cancels)."""
        return Pooled(2 * self.variance, self.df)


def _over_rounds(means: list[float], within: Optional[float], one_round: Optional[np.ndarray],
                 prior: Optional[Pooled], confidence: float) -> tuple[float, float, float]:
    """``(estimate, low, high)`` on the log scale: the mean over rounds, with Student's t at
    ``confidence`` over the
    rounds' means. Their variance is the row's own (``rounds - 1`` degrees of freedom) pooled with
    ``prior`` (the other rows' on the device) where there is one, and never taken below what the
    step pairs' own scatter gives a round's mean (``within``): two rounds that agree by chance
    don't make a narrow interval. With one round and no prior, a bootstrap over its steps
    (``one_round``), narrower than the truth."""
    estimate = float(np.mean(means))
    own_df = len(means) - 1
    if own_df == 0 and prior is None:
        if one_round is None or len(one_round) < 2:
            return estimate, estimate, estimate
        low, high = _bootstrap_within(one_round, confidence)
        return estimate, min(low, estimate), max(high, estimate)
    own = float(np.var(means, ddof=1)) if own_df else 0.0
    df = own_df + (prior.df if prior else 0)
    variance = max((own * own_df + (prior.variance * prior.df if prior else 0.0)) / df, within or 0.0)
    half = float(_scipy.t.ppf((1 + confidence) / 2, df)) * math.sqrt(variance / len(means))
    return estimate, estimate - half, estimate + half


@functools.lru_cache(maxsize=4096)
def paired_speedup(rounds: PairedRounds, prior: Optional[Pooled] = None,
                   confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(speedup, low, high)`` of a backend over eager from warm interleaved pairs (> 1: faster),
    its interval at ``confidence``.

    Each step pair gives ``eager / backend``; a round's figure is the geometric mean of its
    pairs, the speedup the geometric mean over rounds. Its interval is Student's t over the
    rounds (each a fresh pair of processes, the level that repeats independently), so the spread
    between processes is in it, with the steps' own scatter as its floor. ``prior``: the
    round-to-round variance pooled over the device's other rows (``Pooled.of``), which every row
    shares (measured: the process level's spread was the same for eager against itself and
    against fused Adam), so that two or three rounds give an interval with the degrees of freedom
    of all of them. One round without a prior gives a bootstrap over its steps, narrower than the
    truth (``MIN_PAIRED_ROUNDS``). Cached: a report is derived again whenever a row joins."""
    logs = _round_logs(rounds)
    if not logs:
        raise ValueError("no step pair measured")
    values = list(logs.values())
    estimate, low, high = _over_rounds([v.mean() for v in values], _within(values), values[0], prior, confidence)
    return float(np.exp(estimate)), float(np.exp(low)), float(np.exp(high))


@functools.lru_cache(maxsize=4096)
def paired_ratio(faster: PairedRounds, slower: PairedRounds, prior: Optional[Pooled] = None,
                 confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """``(ratio, low, high)``: ``faster``'s speedup over ``slower``'s, from the rounds both ran.

    Their ratio in a round is the difference of their log speedups in that round (both measured
    in the same minutes, each against an eager process of its own); the interval is Student's t
    over those differences, floored by both rows' step scatter, pooled with ``prior`` (a single
    row's, ``Pooled.doubled`` here: a difference carries both rows' round-to-round variance) as
    ``paired_speedup`` does."""
    a, b = _round_logs(faster), _round_logs(slower)
    shared = sorted(set(a) & set(b))
    if not shared:
        raise ValueError("no round measured both")
    within_a, within_b = _within([a[k] for k in shared]), _within([b[k] for k in shared])
    within = None if within_a is None or within_b is None else within_a + within_b
    estimate, low, high = _over_rounds([a[k].mean() - b[k].mean() for k in shared], within, None,
                                       prior.doubled() if prior else None, confidence)
    return float(np.exp(estimate)), float(np.exp(low)), float(np.exp(high))


def half_width(speedup: float, low: float, high: float) -> float:
    """An interval's half-width as a fraction of its speedup: the larger side's."""
    return max(high / speedup - 1.0, 1.0 - low / speedup)


def rounds_to_target(speedup: float, low: float, high: float, rounds: int, target: float) -> int:
    """How many rounds an interval from ``rounds`` rounds would need for a half-width of ``target``
    (a fraction, as ``half_width`` measures it), at least ``rounds``: a paired interval narrows as
    1 / √rounds while the rounds scatter as before (its t, already on the pooled degrees of
    freedom, barely moves). An estimate to plan a budget with, not a promise."""
    if rounds < 1 or target <= 0:
        raise ValueError("rounds must be at least 1 and target positive")
    width = max(math.log(high / speedup), math.log(speedup / low))
    return max(rounds, math.ceil(rounds * (width / math.log1p(target)) ** 2 - 1e-9))


def interval_ratio(base: tuple[float, float, float], new: tuple[float, float, float]) -> tuple[float, float]:
    """The 95 % interval of ``base[0] / new[0]``, each an estimate with its 95 % interval from a run of
    its own (``compare``: a row's speedup in two runs). In log space each interval is about the
    estimate ± t·se; the runs are independent, so the ratio's half-width is the root of the sum of
    the squared half-widths (each side's wider one). Where each side's t is about the same this is
    the interval of the difference; with few rounds, whose t is larger, it is a little wide."""
    def width(estimate: float, low: float, high: float) -> float:
        return max(math.log(high / estimate), math.log(estimate / low), 0.0)

    centre = math.log(base[0] / new[0])
    half = math.hypot(width(*base), width(*new))
    return math.exp(centre - half), math.exp(centre + half)


def rounds_test(base: Rounds, new: Rounds) -> Optional[float]:
    """Two-sided p-value that two runs' step times differ, at the level that is independent: each
    round is a fresh process, so the samples are the rounds' log medians (Welch's t-test, unequal
    variances). Steps inside one process are not independent repeats: pooling them made p-values
    far too small. None with fewer than two rounds on a side."""
    a = [math.log(m) for m in round_medians(base) if m]
    b = [math.log(m) for m in round_medians(new) if m]
    if len(a) < 2 or len(b) < 2:
        return None
    if np.std(a) == 0 and np.std(b) == 0:
        return 0.0 if a[0] != b[0] else 1.0
    return float(_scipy.ttest_ind(a, b, equal_var=False).pvalue)
