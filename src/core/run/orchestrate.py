"""Runs every (device, backend) cell into a ``RunReport``, round by round: which round comes next
on a device and when its rounds stop.

Device by device: round 1 runs every backend (the device's parity reference first; with warm
pairs eager's cold cell alone, then each backend's cold cell paired with a fresh eager process),
then rounds 2 to ``--rounds`` every backend again; after them the run's policy (``policy.py``)
names each next round's backends while ``--budget`` lasts: the rows still contending for the
pick, until it is decided (or, with ``--target``, the rows wider than it). Each round's order is
a shuffle seeded by the report's ``order_seed`` (drawn per run, recorded), the drift sentinel
timed at its start, its cells forked from a new fork server (``--fork-server per-round``). What
one round does is ``rounds.Round``'s, one cell ``cell.py``'s, and how a cell joins its row
``results.RunReport.fold``'s. Under ``--nproc`` the rounds are unpaired: each cell once per round.
"""
from __future__ import annotations

import random
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Callable

from ...plugins import Registry
from ..config import RunConfig
from ..records import Status
from ..results import CellResult, RoundInfo, RunReport
from .cell import paid, run_cell, summarize, unavailable
from .devices import DeviceSlot
from .launch import SERVER, renew_server
from .policy import policy_for, round_order
from .progress import Progress
from .rounds import Cells, Round
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
    try:
        # Private to this run: the parity reference and roofline per device, computed once and
        # shared, and each cell's compile cache, kept from round to round.
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as run_dir:
            run = _Run(config, Cells(config, registry, run_dir, progress, todo), report, on_result)
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
    """One run's rounds, device by device (``run_cells``): which round comes next and when a
    device's rounds stop; each round's cells are ``rounds.Round``'s."""

    def __init__(self, config: RunConfig, cells: Cells, report: RunReport, on_result: Callable[[RunReport], None]):
        self.config, self.cells, self.report, self.on_result = config, cells, report, on_result
        self.started = time.monotonic()
        #: What starting a round's fork server took last (``--fork-server per-round``): part of
        #: what another round costs.
        self.server_s = 0.0

    def device(self, slot: DeviceSlot, names: list[str], devices_left: int) -> None:
        """Every round on ``slot``: the first ``--rounds``, then those the policy names (warm pairs)."""
        config, report = self.config, self.report
        # Warm pairs need an eager process that runs here; DDP cells are torchrun jobs, unpaired.
        paired = (not config.distributed and "eager" in names and not slot.unavailable
                  and unavailable(self.cells.registry.get("eager"), slot.name, config) is None)
        # The budget left is shared among the devices still to run.
        now = time.monotonic()
        deadline = now + (config.budget_s - (now - self.started)) / devices_left
        policy = policy_for(config)
        for k in range(1, max(config.rounds, MAX_ROUNDS) + 1):
            if k <= config.rounds:
                due = [n for n in round_order(names, report.order_seed, slot.name, k, config.rounds)
                       if _needs_round(report, Cell(n, slot), k)]
                if paired:  # the eager process comes first: the cell, or the process the round pairs with
                    due.sort(key=lambda n: n != "eager")
            elif paired and policy is not None:
                names_due = policy.next_round(k, report.rows(slot.name), report.verdicts[slot.name],
                                              deadline - time.monotonic() - self.server_s, lambda n: self._cost(n, slot))
                due = round_order(names_due, report.order_seed, slot.name, k, config.rounds)
                self.cells.todo += len(due) + 1  # and eager's round
            else:
                break
            if not due:
                if k > config.rounds:
                    break
                continue
            self._round(Round(slot, k, due, RoundInfo(order=due, sentinel_s=sentinel_s(config.resolved_threads))),
                        paired)

    def _round(self, this: Round, paired: bool) -> None:
        """Run round ``this`` and fold each cell into the report as it ends; round 1 first makes the
        device's parity reference, and with warm pairs runs eager's cold cell alone before the pairs."""
        config, report, slot, k = self.config, self.report, this.slot, this.k
        if k > 1 and config.fork_server == "per-round" and not config.distributed:
            # Every child of one server shares its address-space layout, which moves a small step's
            # time by a few per cent, differently per backend: a new layout per round makes it part
            # of the round-to-round scatter the interval covers (docs/verdicts.md, "One layout per run").
            self.server_s = renew_server(config)
        reference_s = None  # the reference's seconds, put on round 1's first row with a parity check
        if k == 1:
            info = self.cells.reference(slot, this.order)
            if info is not None:
                report.references[slot.name] = info
            reference_s = paid(info)
        if config.rounds > 1 or paired:
            report.round_log.setdefault(slot.name, []).append(this.info)

        def fold(result: CellResult) -> None:
            nonlocal reference_s
            if k == 1 and reference_s is not None and result.parity is not None:
                result.parity.reference_s, reference_s = reference_s, None
            eager = report.row("eager", slot.name) if result.backend == "eager" else None
            if k > 1 and eager is not None and len(eager.rounds or []) >= k:
                return  # eager's round k from its pairs, where a resumed run's eager row already has it
            report.fold(result, k)
            if k == 1 and result.status != Status.OK:
                self.cells.todo -= config.rounds - 1
            self.on_result(report)

        if paired and k == 1 and this.order[0] == "eager":
            # Eager's cold cell runs alone and first, as every speedup's baseline: its row is
            # safe before any pair runs, and its memory and steps are its own.
            fold(self.cells.run("eager", slot, 1))
            this = replace(this, order=this.order[1:])
        eager = report.row("eager", slot.name)
        if paired and eager is not None and eager.status == Status.OK and eager.step_s is not None:
            # Eager's later rounds are the processes each backend's cell is paired with.
            pairs = replace(this, order=[n for n in this.order if n != "eager"])
            if pairs.order:
                pairs.run_paired(self.cells, fold, eager.step_s.median, report.order_seed)
            report.end_round(slot.name, k)
        else:
            this.run(self.cells, fold)
        log = report.round_log.get(slot.name)
        if log and len(log) == k:  # written with the next cell's result, or the run's last write
            log[-1].ended_s = time.monotonic() - self.started

    def _cost(self, name: str, slot: DeviceSlot) -> float:
        """What another round of ``name`` costs: its latest round's wall time, else (a resumed run)
        its row's mean per round."""
        if name in self.cells.cost:
            return self.cells.cost[name]
        row = self.report.row(name, slot.name)
        return (row.wall_s or 0.0) / max(1, len(row.rounds or [])) if row else 0.0


def _needs_round(report: RunReport, cell: Cell, k: int) -> bool:
    """Whether round ``k`` of ``cell`` is still to run: round 1 when it has no row; a later round
    when its row is ``ok`` and has fewer rounds (a failed or skipped backend is not re-run)."""
    row = report.row(cell.backend, cell.device.name)
    if row is None:
        return k == 1
    if k == 1 or row.status != Status.OK:
        return False
    return len(row.rounds or [None]) < k
