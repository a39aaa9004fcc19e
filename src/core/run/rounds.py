"""A round on one device, from the parent's side: its backends in their order, each one's cell in
turn and, with warm pairs, eager's side of the pairs; ``Cells`` starts the cells.

Which backends a round runs and in which order is ``policy.py``'s; how a finished cell joins its
row is the report's (``results.RunReport.fold``); the rounds of a device, one after another, are
``orchestrate.py``'s. A round hands each cell's result to ``fold`` as it ends, so a run
interrupted mid-round keeps every cell that finished.

With warm pairs each backend's cell, once warm, is paired with a fresh eager process of its own,
started then and warmed up as many steps (``cell.Pairing``): both sides of every pair have the
same history, so no position in the round biases a row (docs/verdicts.md, "Where the A/A bias
came from"). From round 2 the eager processes' steps are also the eager row's round.
"""
from __future__ import annotations

import os
import random
import tempfile
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ...plugins import Registry
from ..config import RunConfig
from ..records import ReferenceInfo
from ..results import CellResult, RoundInfo
from ..stats import StepStats
from .cell import Pairing, ensure_reference, result_of, row_fields, run_cell, summarize
from .devices import DeviceSlot
from .launch import Child, Outcome
from .pairs import round_size
from .progress import Progress

#: What a round hands each finished cell's result to (the report, then the files).
Fold = Callable[[CellResult], None]


class Cells:
    """Starts the run's cells one at a time, with what no cell changes: the run's config,
    registry, workload, directory (the parity reference, each backend's compile cache kept from
    round to round) and progress display. Counts the cells done against the plan for the display,
    and keeps what each backend's latest round cost (``cost``: what the policy prices another at)."""

    def __init__(self, config: RunConfig, registry: Registry, run_dir: str, progress: Progress, todo: int):
        self.config, self.registry, self.run_dir, self.progress = config, registry, run_dir, progress
        self.workload = registry.workloads[config.workload.name]
        self.done, self.todo = 0, todo
        #: Each backend's wall seconds in its latest round.
        self.cost: dict[str, float] = {}

    def run(self, name: str, slot: DeviceSlot, k: int, pairing: Optional[Pairing] = None) -> CellResult:
        """Round ``k`` of ``name`` on ``slot``: the cold cell in round 1 (compile, memory, parity),
        a later round's cell (time and memory, the compile cache reused) after it."""
        self.done += 1
        label = self._label(name, slot, k)
        self.progress.start_cell(self.done, self.todo, label)
        result = run_cell(self.registry.get(name), self.registry.origin.get(name), slot, self.config, self.run_dir,
                          self.progress.phase, self.workload, cache_dir=self._cache(slot, name), judge=k == 1,
                          pairing=pairing)
        self.cost[name] = result.wall_s or 0.0
        self.progress.end_cell(label, summarize(result))
        return result

    def reference(self, slot: DeviceSlot, names: list[str]) -> Optional[ReferenceInfo]:
        """The device's parity reference for the backends ``names`` (``cell.ensure_reference``)."""
        self.progress.message(f"parity reference on {slot.name} (float64 and fp32 eager) ...")
        return ensure_reference([self.registry.get(n) for n in names], self.workload, slot, self.config,
                                self.run_dir)

    def eager_process(self, slot: DeviceSlot, where: str, warmup: int) -> Child:
        """A fresh eager process serving its steps, ``warmup`` warm-up steps like the cell it pairs with."""
        return Child(self.registry.get("eager"), self.workload, slot.name, replace(self.config, warmup=warmup),
                     where, self._cache(slot, "eager"), self.run_dir, _no_phase, judge=False, serve=True)

    def eager_round(self, slot: DeviceSlot, outcome: Outcome, samples: list[float]) -> CellResult:
        """Eager's row for a later round: the steps of every eager process it paired with."""
        result = result_of(outcome, self.config, row_fields(self.registry.get("eager"), None, slot, self.config))
        result.step_s = StepStats.from_samples(samples)
        result.wall_s = 0.0  # its time is in each row's
        self.done += 1  # eager's round, counted in the plan, is no cell of its own
        return result

    def _cache(self, slot: DeviceSlot, name: str) -> str:
        return os.path.join(self.run_dir, "caches", slot.name.replace(":", "-"), name)

    def _label(self, name: str, slot: DeviceSlot, k: int) -> str:
        rounds, target = self.config.rounds, self.config.target
        if k > rounds:
            why = "still contending for the pick" if target is None else f"its interval is still wider than ±{target:g} %"
            return f"{name} on {slot.name}, round {k} ({why})"
        return f"{name} on {slot.name}" + (f", round {k}/{rounds}" if rounds > 1 else "")


@dataclass
class Round:
    """Round ``k`` on ``slot``: the backends of ``order``, each one's cell in that order. ``info``
    is its entry in the report's round log (the order, the drift sentinel at its start, when it
    ended)."""

    slot: DeviceSlot
    k: int
    order: list[str]
    info: RoundInfo

    def run(self, cells: Cells, fold: Fold) -> None:
        """Each cell on its own, unpaired (no eager process to pair with: ``--nproc``, or eager
        failed or can't run here)."""
        for name in self.order:
            fold(cells.run(name, self.slot, self.k))

    def run_paired(self, cells: Cells, fold: Fold, eager_step_s: float, order_seed: Optional[int]) -> None:
        """Each cell paired, once warm, with a fresh eager process of its own warmed up as long;
        ``round_size`` step pairs at ``eager_step_s`` a step, the order inside each pair drawn from
        ``order_seed``. From round 2, eager's side of the pairs is folded last as eager's round."""
        config = cells.config
        cells.progress.message(f"round {self.k} on {self.slot.name}: each backend's process paired step by step "
                               "with a fresh eager process of its own")
        pairs, chunk = round_size(eager_step_s, config.steps, config.round_s)
        rng = random.Random(f"{order_seed}:{self.slot.name}:{self.k}:pairs")
        eager_samples: list[float] = []
        eager_outcome: Optional[Outcome] = None
        with tempfile.TemporaryDirectory(prefix="cnncompare-eager-") as eager_dir:
            twins = iter(range(len(self.order)))
            pairing = Pairing(lambda warmup: cells.eager_process(self.slot, os.path.join(eager_dir, str(next(twins))),
                                                                 warmup),
                              pairs, rng, config.timeout_s, chunk)
            for name in self.order:
                pairing.eager_samples = pairing.eager_outcome = None  # a cell that ends before its pairs has none
                fold(cells.run(name, self.slot, self.k, pairing))
                if pairing.eager_samples and pairing.eager_outcome is not None:
                    eager_samples += pairing.eager_samples
                    eager_outcome = eager_outcome or pairing.eager_outcome
        if self.k > 1 and eager_outcome is not None:
            fold(cells.eager_round(self.slot, eager_outcome, eager_samples))


def _no_phase(name: str, done: int, total: int) -> None:
    """Eager's paired processes show no phases of their own: the cell they pair with does."""
