"""Runs every (device, backend) cell into a ``RunReport``, round by round.

Each round on a device runs its backends in a fresh shuffle seeded by the report's
``order_seed`` (drawn per run, recorded), with the drift sentinel timed at its start. With warm
pairs (any single-process run with eager on a device it can run on) eager's cold cell runs
first and alone; then in each round every backend's cell, once warm, is paired with a fresh
eager process of its own, warmed up as long (``cell.Pairing``, ``pairs.py``;
``pairs.round_size`` step pairs): round 1's cells are the cold ones (compile, memory, parity),
later rounds reuse each cell's compile cache and add their paired steps to its row. After
``--rounds``, the run's policy (``policy.py``) names each next round's backends while
``--budget`` lasts: the rows still contending for the pick, until it is decided (or, with
``--target``, the rows wider than it). Under ``--nproc`` the rounds are unpaired:
each cell once per round. What one cell does is ``cell.py``'s.
"""
from __future__ import annotations

import os
import random
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Callable, Optional

from ...plugins import Registry
from ..config import RunConfig
from ..records import Status
from ..results import CellResult, RoundInfo, RunReport
from ..stats import StepStats
from .cell import Pairing, _result, _row_fields, ensure_reference, paid, run_cell, summarize, unavailable
from .devices import DeviceSlot
from .launch import SERVER, Child
from .pairs import round_size
from .policy import policy_for, round_order
from .progress import Progress
from .sentinel import sentinel_s

__all__ = ["Cell", "Interrupted", "plan_cells", "run_cell", "run_cells", "summarize", "unavailable"]


class Interrupted(Exception):
    """Raised in the parent on SIGINT/SIGTERM; carries the exit code (130 / 143)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


@dataclass(frozen=True)
class Cell:
    backend: str
    device: DeviceSlot


def plan_cells(config: RunConfig, slots: list[DeviceSlot]) -> list[Cell]:
    """Device by device; eager first on each, since every speedup is measured against it."""
    order = sorted(config.backends, key=lambda name: name != "eager")
    return [Cell(name, slot) for slot in slots for name in order]


def run_cells(cells: list[Cell], config: RunConfig, registry: Registry, report: RunReport,
              on_result: Callable[[RunReport], None], progress: Progress = Progress()) -> None:
    """Run the cells not already in ``report`` (a resumed run keeps its finished ones), round by
    round on each device: ``--rounds`` of them, then, with warm pairs, the rounds the run's policy
    names (``policy.py``) while ``--budget`` allows.

    ``on_result`` is called after each cell so results are written as they
    come. ``Interrupted``/``KeyboardInterrupt`` propagate after the running
    children's process groups are killed.
    """
    slots = list(dict.fromkeys(c.device for c in cells))
    # Every round of every cell still to run; a cell that ends round 1 not ok runs no more.
    todo = sum(1 for c in cells for k in range(1, config.rounds + 1)
               if _needs_round(report, c, k) or (k > 1 and _needs_round(report, c, 1)))
    progress.start_run(todo)
    if report.order_seed is None:  # a resumed run keeps its own
        report.order_seed = random.SystemRandom().randrange(2 ** 32)
    run = _Run(config, registry, report, on_result, progress, todo)
    try:
        # Private to this run: the parity reference and roofline per device, computed once and
        # shared, and each cell's compile cache, kept from round to round.
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as run_dir:
            run.run_dir = run_dir
            for i, slot in enumerate(slots):
                run.device(slot, [c.backend for c in cells if c.device == slot], devices_left=len(slots) - i)
    except BaseException:
        SERVER.close()  # an interrupted or failed run leaves no process behind
        raise
    finally:
        progress.end_run()


#: Rounds on one device at most (unless --rounds asks for more), however wide an interval stays:
#: a backstop, the budget ends a run first. A ±3 % interval took some 13 rounds on a noisy 2-core
#: machine (docs/verdicts.md).
MAX_ROUNDS = 50


class _Run:
    """One run's rounds, device by device (``run_cells``)."""

    def __init__(self, config: RunConfig, registry: Registry, report: RunReport,
                 on_result: Callable[[RunReport], None], progress: Progress, todo: int):
        self.config, self.registry, self.report = config, registry, report
        self.on_result, self.progress, self.todo, self.done = on_result, progress, todo, 0
        self.workload = registry.workloads[config.workload.name]
        self.started = time.monotonic()
        self.run_dir = ""
        #: Each backend's wall seconds in its latest round (what another round would cost).
        self.cost: dict[str, float] = {}

    def device(self, slot: DeviceSlot, names: list[str], devices_left: int) -> None:
        """Every round on ``slot``: the first ``--rounds``, then those the policy names (warm pairs)."""
        config = self.config
        # Warm pairs need an eager process that runs here; DDP cells are torchrun jobs, unpaired.
        paired = (not config.distributed and "eager" in names and not slot.unavailable
                  and unavailable(self.registry.get("eager"), slot.name, config) is None)
        # The budget left is shared among the devices still to run.
        now = time.monotonic()
        deadline = now + (config.budget_s - (now - self.started)) / devices_left
        policy = policy_for(config)
        for k in range(1, max(config.rounds, MAX_ROUNDS) + 1):
            if k <= config.rounds:
                due = [n for n in round_order(names, self.report.order_seed, slot.name, k, config.rounds)
                       if _needs_round(self.report, Cell(n, slot), k)]
                if paired:  # the eager process comes first: the cell, or the process the round pairs with
                    due.sort(key=lambda n: n != "eager")
            elif paired and policy is not None:
                names_due = policy.next_round(k, self.report.rows(slot.name), self.report.verdicts[slot.name],
                                              deadline - time.monotonic(), lambda n: self._cost(n, slot))
                due = round_order(names_due, self.report.order_seed, slot.name, k, config.rounds)
                self.todo += len(due) + 1  # and eager's round
            else:
                break
            if not due:
                if k > config.rounds:
                    break
                continue
            reference_s = None
            if k == 1:
                self.progress.message(f"parity reference on {slot.name} (float64 and fp32 eager) ...")
                info = ensure_reference([self.registry.get(n) for n in due], self.workload, slot, config,
                                        self.run_dir)
                if info is not None:
                    self.report.references[slot.name] = info
                reference_s = paid(info)
            if config.rounds > 1 or paired:
                self.report.round_log.setdefault(slot.name, []).append(
                    RoundInfo(order=due, sentinel_s=sentinel_s(config.resolved_threads)))
            if paired and k == 1 and due[0] == "eager":
                # Eager's cold cell runs alone and first, as every speedup's baseline: its row
                # is safe before any pair runs, and its memory and steps are its own.
                reference_s = self._fold(self._cell("eager", slot, 1), 1, reference_s)
                due = due[1:]
            eager_row = _row(self.report, "eager", slot.name)
            if paired and eager_row is not None and eager_row.status == Status.OK:
                self._paired_round(slot, k, [n for n in due if n != "eager"], reference_s)
            else:
                for name in due:
                    reference_s = self._fold(self._cell(name, slot, k), k, reference_s)
            log = self.report.round_log.get(slot.name)
            if log and len(log) == k:  # written with the next cell's result, or the run's last write
                log[-1].ended_s = time.monotonic() - self.started

    def _label(self, name: str, slot: DeviceSlot, k: int) -> str:
        rounds, target = self.config.rounds, self.config.target
        if k > rounds:
            why = "still contending for the pick" if target is None else f"its interval is still wider than ±{target:g} %"
            return f"{name} on {slot.name}, round {k} ({why})"
        return f"{name} on {slot.name}" + (f", round {k}/{rounds}" if rounds > 1 else "")

    def _cell(self, name: str, slot: DeviceSlot, k: int, pairing: Optional[Pairing] = None) -> CellResult:
        self.done += 1
        label = self._label(name, slot, k)
        self.progress.start_cell(self.done, self.todo, label)
        cache = os.path.join(self.run_dir, "caches", slot.name.replace(":", "-"), name)
        result = run_cell(self.registry.get(name), self.registry.origin.get(name), slot, self.config, self.run_dir,
                          self.progress.phase, self.workload, cache_dir=cache, judge=k == 1, pairing=pairing)
        self.cost[name] = result.wall_s or 0.0
        self.progress.end_cell(label, summarize(result))
        return result

    def _fold(self, result: CellResult, k: int, reference_s: Optional[float]) -> Optional[float]:
        """Put round ``k``'s ``result`` into the report (a new row in round 1); the reference's
        seconds still to be put on a row."""
        if k == 1:
            if reference_s is not None and result.parity is not None:
                result.parity.reference_s, reference_s = reference_s, None
            result.rounds = [result.step_s.median] if result.step_s else None
            self.report.add(result, first=result.backend == "eager")
            if result.status != Status.OK:
                self.todo -= self.config.rounds - 1
        else:
            _add_round(self.report, result, k)
        self.on_result(self.report)
        return reference_s

    def _paired_round(self, slot: DeviceSlot, k: int, due: list[str], reference_s: Optional[float]) -> None:
        """Round ``k`` with warm pairs: each backend's cell in ``due``, in the round's order (round
        1's cells are the cold ones), paired once warm with a fresh eager process of its own
        (``cell.Pairing``). From round 2 those eager processes' steps are also the eager row's
        round ``k``; the rows not due this round keep an empty round (``_add_round``), so round
        ``k`` is the ``k``-th everywhere."""
        config = self.config
        if due:
            self.progress.message(f"round {k} on {slot.name}: each backend's process paired step by step with a "
                                  "fresh eager process of its own")
            pairs, chunk = round_size(_eager_step_s(self.report, slot.name), config.steps, config.round_s)
            rng = random.Random(f"{self.report.order_seed}:{slot.name}:{k}:pairs")
            # Eager's side of the round: every eager process's steps, and the first one's outcome.
            eager_samples: list[float] = []
            eager_outcome = None
            with tempfile.TemporaryDirectory(prefix="cnncompare-eager-") as eager_dir:
                twins = iter(range(len(due)))
                cache = os.path.join(self.run_dir, "caches", slot.name.replace(":", "-"), "eager")

                def start_eager(warmup: int) -> Child:
                    """Eager's process for the cell now warm: as many warm-up steps as it ran."""
                    return Child(self.registry.get("eager"), self.workload, slot.name, replace(config, warmup=warmup),
                                 os.path.join(eager_dir, str(next(twins))), cache, self.run_dir, _no_phase,
                                 judge=False, serve=True)

                pairing = Pairing(start_eager, pairs, rng, config.timeout_s, chunk)
                for name in due:
                    pairing.eager_samples = pairing.eager_outcome = None  # a cell that ends before its pairs has none
                    reference_s = self._fold(self._cell(name, slot, k, pairing), k, reference_s)
                    if pairing.eager_samples and pairing.eager_outcome is not None:
                        eager_samples += pairing.eager_samples
                        eager_outcome = eager_outcome or pairing.eager_outcome
            eager_row = _row(self.report, "eager", slot.name)
            if k > 1 and eager_outcome is not None and eager_row is not None and len(eager_row.rounds or []) < k:
                # Eager's round k: the steps of every eager process of the round.
                result = _result(eager_outcome, config, _row_fields(self.registry.get("eager"), None, slot, config))
                result.step_s = StepStats.from_samples(eager_samples)
                result.wall_s = 0.0  # its time is in each row's
                self.done += 1  # eager's round, counted in the plan, is no cell of its own
                self._fold(result, k, None)
        for row in self.report.rows(slot.name):  # the rows that sat this round out keep its place
            if row.status == Status.OK and len(row.rounds or []) < k:
                _add_round(self.report, None, k, row)
        self.report.rederive()

    def _cost(self, name: str, slot: DeviceSlot) -> float:
        """What another round of ``name`` costs: its latest round's wall time, else (a resumed run)
        its row's mean per round."""
        if name in self.cost:
            return self.cost[name]
        row = _row(self.report, name, slot.name)
        return (row.wall_s or 0.0) / max(1, len(row.rounds or [])) if row else 0.0


def _no_phase(name: str, done: int, total: int) -> None:
    pass


def _needs_round(report: RunReport, cell: Cell, k: int) -> bool:
    """Whether round ``k`` of ``cell`` is still to run: round 1 when it has no row; a later round
    when its row is ``ok`` and has fewer rounds (a failed or skipped backend is not re-run)."""
    row = next((r for r in report.results if (r.backend, r.device) == (cell.backend, cell.device.name)), None)
    if row is None:
        return k == 1
    if k == 1 or row.status != Status.OK:
        return False
    return len(row.rounds or [None]) < k


def _row(report: RunReport, backend: str, device: str) -> Optional[CellResult]:
    return next((r for r in report.results if (r.backend, r.device) == (backend, device)), None)


def _eager_step_s(report: RunReport, device: str) -> float:
    """Eager's median step on ``device`` (its row is ``ok`` before any pair runs)."""
    row = _row(report, "eager", device)
    assert row is not None and row.step_s is not None
    return row.step_s.median


def _add_round(report: RunReport, later: Optional[CellResult], k: int, row: Optional[CellResult] = None) -> None:
    """Fold round ``k`` into its row: its samples and median (paired with eager's where it was
    paired), its warm compile times. A round that failed leaves a note and an empty round (the row
    keeps round 1's status and verdicts); ``later`` None (with ``row``): the row sat the round
    out, an empty round too. Either way round ``k`` still pairs with eager's round ``k``."""
    row = row or _row(report, later.backend, later.device) if later else row
    assert row is not None and row.step_s is not None
    failed = later is None or later.status != Status.OK or later.step_s is None
    if later is not None and failed:
        row.notes.append(f"round {k}: {later.status.value}" + (f" ({later.error})" if later.error else ""))
    samples = [] if failed or later is None or later.step_s is None else later.step_s.samples
    row.round_samples = (row.round_samples or [row.step_s.samples]) + [samples]
    row.rounds = [statistics.median(s) if s else None for s in row.round_samples]
    if row.round_eager_samples is not None:
        paired = [] if failed or later is None or not later.round_eager_samples else later.round_eager_samples[0]
        row.round_eager_samples = row.round_eager_samples + [paired]
    if failed or later is None:
        report.rederive()
        return
    row.step_s = StepStats.from_samples([s for samples in row.round_samples for s in samples])
    row.round_compile_s = (row.round_compile_s or [row.compile_s]) + [later.compile_s]
    row.round_first_step_s = (row.round_first_step_s or [row.first_step_s]) + [later.first_step_s]
    row.wall_s = (row.wall_s or 0.0) + (later.wall_s or 0.0)
    report.rederive()
