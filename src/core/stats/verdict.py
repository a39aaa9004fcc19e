"""Which backend to pick on one device, and how far to trust it (``verdict``).

The rules, each a 95 % statement about the rows' step times (``intervals.paired_speedup`` over
warm pairs; ``intervals.speedup_interval`` over unpaired rounds):

- rows are ranked among those computing at the baseline's precision (eager's, as measured); the
  fastest row at another precision is named apart, never ranked over them;
- the best is the row with the highest speedup over eager; it is the **pick** only when
  - its interval against eager clears 1,
  - it clears the noise floor: eager measured again like any backend (the ``eager-control``
    row, an A/A comparison), tested as a contender is: the 95 % interval of the best over the
    control, round by round, lies above 1 (not two intervals that must not overlap, a test at
    about 99.5 %),
  - its paired interval against every other contender (best over contender, round by round:
    in a round both were measured in the same minutes, each against an eager process of its
    own) clears 1; the contenders it doesn't clear are **tied** with it (each interval's
    round-to-round variance pooled with the device's other rows', ``figures.round_prior``),
  - and the run has ``MIN_PAIRED_ROUNDS`` rounds of warm pairs (``T_INTERVAL_MIN_ROUNDS`` of
    unpaired rounds): with fewer, the intervals are over one process's steps, narrower than the
    truth, and nothing is picked.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional, Sequence

from ..records import Status
from .figures import measured_precision, paired_of, round_prior, rounds_of
from .intervals import MIN_PAIRED_ROUNDS, T_INTERVAL_MIN_ROUNDS, paired_ratio, speedup_interval

if TYPE_CHECKING:
    from ..results import CellResult

#: The A/A row: eager again, measured exactly like any backend; its speedup is the noise floor.
CONTROL = "eager-control"


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

    def to_dict(self) -> dict:
        """The JSON ``verdict`` object of a device."""
        best, other, control = self.best, self.other_precision, self.control
        return {"pick": self.pick, "best": best.backend if best else None,
                "speedup": best.speedup_vs_eager if best else None,
                "speedup_ci": best.speedup_ci if best else None, "tied_with": self.tied_with,
                "precision": self.precision,
                "noise_floor": None if control is None else {"speedup": control.speedup_vs_eager,
                                                             "speedup_ci": control.speedup_ci},
                "fastest_other_precision": None if other is None else {
                    "backend": other.backend, "precision": measured_precision(other),
                    "speedup": other.speedup_vs_eager, "speedup_ci": other.speedup_ci}}


def _clears(best: "CellResult", contender: "CellResult", rows: Sequence["CellResult"]) -> bool:
    """Whether ``best`` is faster than ``contender`` at 95 %, round by round (the other ``rows``
    of the device give the round-to-round variance, ``round_prior``)."""
    mine, theirs = paired_of(best), paired_of(contender)
    try:
        if mine is not None and theirs is not None:
            return paired_ratio(mine, theirs, round_prior(rows, best, contender))[1] > 1.0
        if mine is not None and contender.backend == "eager":  # the best's own interval over eager
            return best.speedup_ci is not None and best.speedup_ci[0] > 1.0
        if theirs is not None and best.backend == "eager":
            return contender.speedup_ci is not None and contender.speedup_ci[1] < 1.0
        return speedup_interval(rounds_of(contender), rounds_of(best))[1] > 1.0
    except ValueError:  # no round measured both: nothing says it is faster
        return False


def verdict(device: str, rows: Sequence["CellResult"], rounds: int = T_INTERVAL_MIN_ROUNDS) -> Verdict:
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
    # Against eager the paired interval is the best's own speedup interval.
    tied = [r.backend for r in sorted(same, key=lambda r: -(r.speedup_vs_eager or 0.0))
            if r is not best and not _clears(best, r, rows)]
    below = best is not eager and control is not None and not _clears(best, control, rows)
    return Verdict(device, best, eager, tied, precision=baseline, other_precision=other, control=control,
                   below_control=below, rounds=rounds,
                   paired=any(paired_of(r) is not None for r in rows if r.status == Status.OK and r.step_s))
