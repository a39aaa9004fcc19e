"""Which backend to pick on one device, and how far to trust it (``verdict``).

A run looks at its figures after several rounds and stops once they name a pick (``LOOKS``,
``run/policy.py``); so that looking again and again doesn't make a wrong pick likelier, every test
below is at ``VERDICT_CONFIDENCE``: 95 % split over the most looks a run takes (Bonferroni), so
that over all of them together a pick is wrong at most 5 % of the time. The rules, each a
statement at that level about the rows' step times (``intervals.paired_speedup`` over warm pairs;
``intervals.speedup_interval`` over unpaired rounds):

- rows are ranked among those computing at the baseline's precision (eager's, as measured); the
  fastest row at another precision is named apart, never ranked over them;
- the best is the row with the highest speedup over eager; it is the **pick** only when
  - its interval against eager clears 1 (``Verdict.tested_ci``),
  - it clears the noise floor: eager measured again like any backend (the ``eager-control``
    row, an A/A comparison), tested as a contender is: the interval of the best over the
    control, round by round, lies above 1,
  - its paired interval against every other contender (best over contender, round by round:
    in a round both were measured in the same minutes, each against an eager process of its
    own) clears 1; the contenders it doesn't clear are **tied** with it (each interval's
    round-to-round variance pooled with the device's other rows', ``figures.round_prior``),
  - and the run has ``MIN_PAIRED_ROUNDS`` rounds of warm pairs (``T_INTERVAL_MIN_ROUNDS`` of
    unpaired rounds): with fewer, the intervals are over one process's steps, narrower than the
    truth, and nothing is picked.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

from scipy import stats as _scipy

from ..records import Status
from .figures import measured_precision, measured_rounds, paired_of, round_prior, rounds_of, speedup_of
from .intervals import CONFIDENCE, MIN_PAIRED_ROUNDS, T_INTERVAL_MIN_ROUNDS, paired_ratio, speedup_interval

if TYPE_CHECKING:
    from ..results import CellResult

#: The A/A row: eager again, measured exactly like any backend; its speedup is the noise floor.
CONTROL = "eager-control"

#: The rounds after which a run looks at its figures to decide whether to go on (from its
#: ``--rounds`` on), roughly geometric so that few looks cover short and long runs alike.
LOOKS = (2, 3, 5, 8, 13, 21, 34)
#: The most looks a run takes: the scheduled ones and the verdict when it ends between two.
MAX_LOOKS = len(LOOKS) + 1
#: ``Verdict.rounds_to_separate`` looks this far at most.
SEPARATE_AT_MOST = 1000
#: Every test of the verdict: 95 % over ``MAX_LOOKS`` looks together (Bonferroni: the chance
#: that any look's verdict names a wrong pick is at most the sum of each look's, 5 % / 8).
VERDICT_CONFIDENCE = 1 - (1 - CONFIDENCE) / MAX_LOOKS


@dataclass
class Verdict:
    """One device's verdict (see the module's rules). ``tied_with`` names the rows the best can't
    be told from (``eager`` among them when its interval reaches 1); ``control`` is the A/A row
    and ``below_control`` says the best didn't clear it; ``rounds`` below
    ``T_INTERVAL_MIN_ROUNDS`` means no pick. Without an eager row the fastest median is the
    best, untested."""

    device: str
    best: Optional["CellResult"]
    eager: Optional["CellResult"]
    tied_with: list[str] = field(default_factory=list)
    #: eager's measured precision, which ``best`` and ``tied_with`` share.
    precision: Optional[str] = None
    #: The fastest row at another precision, where it is faster than ``best``.
    other_precision: Optional["CellResult"] = None
    control: Optional["CellResult"] = None
    below_control: bool = False
    rounds: int = T_INTERVAL_MIN_ROUNDS
    #: The device's rows were measured in warm pairs (eager's own row holds none of its own).
    paired: bool = False
    #: The level of every test here (``VERDICT_CONFIDENCE``).
    confidence: float = VERDICT_CONFIDENCE
    #: The best's interval over eager at ``confidence``: what "clears eager" tests.
    tested_ci: Optional[list[float]] = None
    #: Undecided: about how many rounds (in all) would separate the best from its closest
    #: contender if their measured difference held; None where it is nil or nothing is tied.
    rounds_to_separate: Optional[int] = None

    @property
    def min_rounds(self) -> int:
        """The rounds a pick needs: fewer with warm pairs, whose rounds are paired processes (eager
        among them when it is the best: the others were paired with it)."""
        return MIN_PAIRED_ROUNDS if self.paired else T_INTERVAL_MIN_ROUNDS

    @property
    def too_few_rounds(self) -> bool:
        return self.rounds < self.min_rounds

    @property
    def pick(self) -> Optional[str]:
        if self.best is None or self.tied_with or self.below_control or (self.too_few_rounds and self.eager):
            return None
        return self.best.backend

    @property
    def undecided_between(self) -> list[str]:
        """Without a pick: the best and the rows it can't be told from (the control where the
        best doesn't clear it), the rows another round would go to."""
        if self.pick is not None or self.best is None or self.eager is None:
            return []
        rest = [*self.tied_with, *([self.control.backend] if self.below_control and self.control else [])]
        return [self.best.backend, *rest]

    def to_dict(self) -> dict:
        """The JSON ``verdict`` object of a device."""
        best, other, control = self.best, self.other_precision, self.control
        return {"pick": self.pick, "best": best.backend if best else None,
                "speedup": best.speedup_vs_eager if best else None,
                "speedup_ci": best.speedup_ci if best else None, "tied_with": self.tied_with,
                "confidence": self.confidence, "tested_ci": self.tested_ci,
                "undecided_between": self.undecided_between, "rounds_to_separate": self.rounds_to_separate,
                "precision": self.precision,
                "noise_floor": None if control is None else {"speedup": control.speedup_vs_eager,
                                                             "speedup_ci": control.speedup_ci},
                "fastest_other_precision": None if other is None else {
                    "backend": other.backend, "precision": measured_precision(other),
                    "speedup": other.speedup_vs_eager, "speedup_ci": other.speedup_ci}}


def _ratio(best: "CellResult", contender: "CellResult", rows: Sequence["CellResult"], eager: "CellResult",
           confidence: float) -> Optional[tuple[float, float, float]]:
    """``best``'s speedup over ``contender`` with its interval at ``confidence``, round by round
    (the other ``rows`` of the device give the round-to-round variance, ``round_prior``); None
    where no round measured both."""
    mine, theirs = paired_of(best), paired_of(contender)
    try:
        if mine is not None and theirs is not None:
            return paired_ratio(mine, theirs, round_prior(rows, best, contender), confidence)
        if contender is eager:  # the best's own interval over eager
            return speedup_of(eager, best, round_prior(rows, best), confidence)
        if best is eager:
            speedup, low, high = speedup_of(eager, contender, round_prior(rows, contender), confidence)
            return 1 / speedup, 1 / high, 1 / low
        return speedup_interval(rounds_of(contender), rounds_of(best), confidence)
    except ValueError:
        return None


def _clears(ratio: Optional[tuple[float, float, float]]) -> bool:
    """Whether the interval says faster (no round measured both: nothing says it is)."""
    return ratio is not None and ratio[1] > 1.0


def _rounds_to_separate(ratio: Optional[tuple[float, float, float]], rounds: int, df: Optional[int],
                        confidence: float) -> Optional[int]:
    """The rounds (in all) whose interval at ``confidence`` would exclude 1 if ``ratio``'s estimate
    held: its standard error narrows as 1 / √rounds and its t falls as the degrees of freedom
    (``df`` now, pooled over the device's rows) grow with the rounds. None for no difference;
    at most ``SEPARATE_AT_MOST`` + 1 (more: as good as never)."""
    if ratio is None or rounds < 1 or ratio[0] <= 1.0 or ratio[1] <= 0:
        return None
    estimate, low, high = (math.log(v) for v in ratio)
    df = max(1, df or rounds - 1)
    q = (1 + confidence) / 2
    sigma = max(high - estimate, estimate - low) / float(_scipy.t.ppf(q, df)) * math.sqrt(rounds)
    # t is never below the normal quantile, so no n under (z σ / estimate)² can do: start there
    # (the search runs on every derive of an undecided report, up to SEPARATE_AT_MOST steps).
    start = max(rounds + 1, math.ceil((float(_scipy.norm.ppf(q)) * sigma / estimate) ** 2))
    for n in range(start, SEPARATE_AT_MOST + 2):
        if _scipy.t.ppf(q, df * n / rounds) * sigma / math.sqrt(n) < estimate:
            return n
    return SEPARATE_AT_MOST + 1


def verdict(device: str, rows: Sequence["CellResult"], rounds: int = T_INTERVAL_MIN_ROUNDS,
            confidence: float = VERDICT_CONFIDENCE) -> Verdict:
    """The device's verdict from its derived ``rows`` (``figures.derive``), every test at
    ``confidence``; ``rounds``: the rounds the run asked for at least (fewer than the verdict
    needs: no pick)."""
    ok = [r for r in rows if r.status == Status.OK and r.step_s]
    eager = next((r for r in ok if r.backend == "eager"), None)
    control = next((r for r in ok if r.backend == CONTROL), None)
    ok = [r for r in ok if r is not control]
    if not ok:
        return Verdict(device, None, eager, control=control, rounds=rounds)
    if eager is None:
        return Verdict(device, min(ok, key=lambda r: r.step_s.median if r.step_s else 0.0), None, rounds=rounds)
    baseline = measured_precision(eager)
    same = [r for r in ok if measured_precision(r) in (None, baseline) and r.speedup_vs_eager is not None]
    others = [r for r in ok if r not in same and r.speedup_vs_eager is not None]
    best = max(same, key=lambda r: (r.speedup_vs_eager or 0.0, r is eager))
    other = max(others, key=lambda r: r.speedup_vs_eager or 0.0, default=None)
    if other is not None and (other.speedup_vs_eager or 0.0) <= (best.speedup_vs_eager or 0.0):
        other = None
    ratios = {r.backend: _ratio(best, r, rows, eager, confidence) for r in [*same, *([control] if control else [])]
              if r is not best}
    # Against eager the paired interval is the best's own speedup interval.
    tied = [r.backend for r in sorted(same, key=lambda r: -(r.speedup_vs_eager or 0.0))
            if r is not best and not _clears(ratios[r.backend])]
    below = best is not eager and control is not None and not _clears(ratios[control.backend])
    tested = ratios.get("eager") if best is not eager else None
    closest = [ratios[n] for n in tied] + ([ratios[control.backend]] if below and control else [])
    measured = max(map(measured_rounds, ok), default=0)
    pooled = round_prior(rows)
    # The hardest contender decides; one with no difference measured can't be separated at all.
    separate = [_rounds_to_separate(ratio, measured, pooled.df if pooled else None, confidence) for ratio in closest]
    hardest = None if not separate or None in separate else max(n for n in separate if n is not None)
    return Verdict(device, best, eager, tied, precision=baseline, other_precision=other, control=control,
                   below_control=below, rounds=rounds,
                   paired=any(paired_of(r) is not None for r in rows if r.status == Status.OK and r.step_s),
                   confidence=confidence, tested_ci=None if tested is None else [tested[1], tested[2]],
                   rounds_to_separate=hardest)
