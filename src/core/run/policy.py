"""Which backends the next round of warm pairs runs on a device, in which order, and when its
rounds stop.

The first ``--rounds`` rounds run every backend (``orchestrate``); after them a policy names each
next round's backends from the device's figures so far, and an empty list ends the device:

- ``Decide`` (the default): rounds go to the rows still contending for the pick, the best and
  the rows the verdict can't yet tell from it, with the control (the noise floor the pick must
  clear) in every round, and stop as soon as the verdict names a pick. It looks only after the rounds in
  ``stats.LOOKS`` (and ``--rounds``), and the verdict tests at ``stats.VERDICT_CONFIDENCE``, so
  that the looks together keep a wrong pick at 5 % at most (docs/verdicts.md, "When a run stops").
- ``Precise`` (``--target``): rounds go to every row whose interval is wider than the target,
  the rows with the fewest rounds first, whether or not it could be the pick.

Either way a round takes only the backends the time left pays for, each at what its last round
cost (``cost``); eager's processes come with each backend's pairs, so eager is never named.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence, Union

from ..config import RunConfig
from ..results import CellResult
from ..stats import LOOKS, Verdict, half_width, measured_rounds


@dataclass
class Decide:
    """Rounds for the contenders until the pick is decided. ``first``: the rounds every row runs
    (``--rounds``), the first look; ``contenders``: whom the last look left in."""

    first: int
    contenders: list[str] = field(default_factory=list)
    looked: bool = False

    def looks_after(self, rounds: int) -> bool:
        """Whether the verdict after ``rounds`` rounds decides anything (a look, ``LOOKS``)."""
        return rounds == self.first or (rounds > self.first and rounds in LOOKS)

    def next_round(self, k: int, rows: Sequence[CellResult], verdict: Verdict, left_s: float,
                   cost: Callable[[str], float]) -> list[str]:
        """Round ``k``'s backends, the best first: at a look the verdict's contenders (none once it
        names a pick), between looks those of the last look."""
        if self.looks_after(k - 1) or not self.looked:  # (a resumed run looks where it resumes)
            self.contenders = [name for name in verdict.undecided_between if name != "eager"]
            # The control runs in every round that runs, not only while the best hasn't cleared
            # it: dropped when it happened to look slow, its figure would lean below 1.
            if self.contenders and verdict.control is not None and verdict.control.backend not in self.contenders:
                self.contenders.append(verdict.control.backend)
            self.looked = True
        # A round without the best decides nothing: the contenders in order, up to the first
        # the time left doesn't pay for; nor does the best alone, unless what it must still
        # clear is eager (whose processes every round has).
        due = _affordable(self.contenders, left_s, cost, prefix=True)
        if len(due) < 2 and "eager" not in verdict.undecided_between:
            return []
        return due


@dataclass
class Precise:
    """``--target``: rounds for every row whose speedup's interval is wider than ``target_pct``."""

    target_pct: float

    def next_round(self, k: int, rows: Sequence[CellResult], verdict: Verdict, left_s: float,
                   cost: Callable[[str], float]) -> list[str]:
        """The rows still wider than the target, the fewest rounds first and the widest among them:
        an interval over rounds narrows as 1 / √rounds, most from the second round to the third,
        so every row gets a third round before any gets a fourth."""
        wide = [r for r in rows if r.target_reached is False and r.speedup_ci and r.speedup_vs_eager]
        wide.sort(key=lambda r: (measured_rounds(r), -half_width(r.speedup_vs_eager or 1.0, *(r.speedup_ci or [1.0, 1.0]))))
        return _affordable([r.backend for r in wide], left_s, cost)


Policy = Union[Decide, Precise]


def policy_for(config: RunConfig) -> Optional[Policy]:
    """The run's policy for the rounds after ``--rounds``; None for ``--rounds 1`` (a quick look:
    one round, no more)."""
    if config.rounds < 2:
        return None
    return Precise(config.target) if config.target is not None else Decide(config.rounds)


def round_order(names: list[str], order_seed: Optional[int], device: str, k: int, rounds: int) -> list[str]:
    """Round ``k``'s order on ``device``: a shuffle seeded by the report's ``order_seed`` (drawn per
    run and recorded, so a resumed run repeats it), the device and the round. Where a row sits in
    its round then varies from round to round and from run to run, so no position effect can
    follow a backend. A run of one round (``rounds``) keeps the plan's order (eager first)."""
    if rounds == 1 and k == 1:
        return list(names)
    order = list(names)
    random.Random(f"{order_seed}:{device}:{k}").shuffle(order)
    return order


def _affordable(names: list[str], left_s: float, cost: Callable[[str], float], prefix: bool = False) -> list[str]:
    """``names`` in their order, as many as ``left_s`` seconds pay for at each one's ``cost``
    (``prefix``: none after the first that doesn't fit)."""
    due = []
    for name in names:
        if (paid := cost(name)) <= left_s:
            due.append(name)
            left_s -= paid
        elif prefix:
            break
    return due
