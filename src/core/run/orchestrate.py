"""Runs every (device, backend) cell, each in a fresh child process, into a ``RunReport``.

Isolation is the point: a crash, hang or memory blow-up in one backend
costs that cell alone, and each cell's peak memory is its own. Each cell
gets a fresh compile cache directory, so compile times are cold
(``--compile-cache warm`` runs it twice sharing one). Starting and
supervising a child is ``launch.py``'s; this module decides what runs and
turns each child's ``CellRecord`` and ending into the report's row.

With ``--rounds N`` each device's cells run N times, round by round, each round
in a fresh seeded shuffle of the backends (drift then hits every backend
alike) with the drift sentinel timed at its start. Round 1 is the cell as
above (cold compile, memory, parity); later rounds reuse the cell's compile
cache and add their step samples, medians and warm compile times to its row.

Before a device's first cell, the parity reference every cell on it is judged against is
computed in a child of its own (``cell/reference.py``), clean of any backend's settings.

With ``--nproc N`` a cell is the torchrun job and then, when it is ``ok``,
the backend in one process with one rank's threads and batch: the
single-process throughput that scaling efficiency divides by, measured in
the same run.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from ...backends import base
from ...plugins import Registry
from ..config import RunConfig
from ..records import CellRecord, ReferencePlan, Status
from ..results import CellResult, RoundInfo, RunReport
from ..stats import StepStats, half_width
from . import torchrun
from .devices import DeviceSlot
from .launch import SERVER, Child, Outcome, PhaseCallback, spawn
from .pairs import Peer, PeerLost, interleave
from .progress import Progress
from .sentinel import sentinel_s


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
    round on each device: ``--rounds`` of them, then, with warm pairs, more for the rows whose
    interval is wider than ``--target`` while ``--budget`` allows.

    ``on_result`` is called after each cell so results are written as they
    come. ``Interrupted``/``KeyboardInterrupt`` propagate after the running
    children's process groups are killed.
    """
    slots = list(dict.fromkeys(c.device for c in cells))
    # Every round of every cell still to run; a cell that ends round 1 not ok runs no more.
    todo = sum(1 for c in cells for k in range(1, config.rounds + 1)
               if _needs_round(report, c, k) or (k > 1 and _needs_round(report, c, 1)))
    progress.start_run(todo)
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


#: Rounds on one device at most, however wide an interval stays.
MAX_ROUNDS = 12


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
        """Every round on ``slot``: the first ``--rounds``, then the adaptive ones (warm pairs)."""
        config = self.config
        # Warm pairs need an eager process that runs here; DDP cells are torchrun jobs, unpaired.
        paired = (not config.distributed and "eager" in names and not slot.unavailable
                  and unavailable(self.registry.get("eager"), slot.name, config) is None)
        deadline = self.started + (config.budget_s - (time.monotonic() - self.started)) / devices_left \
            + (time.monotonic() - self.started)
        for k in range(1, MAX_ROUNDS + 1):
            if k <= config.rounds:
                due = [n for n in _round_order(names, config, slot.name, k)
                       if _needs_round(self.report, Cell(n, slot), k)]
            elif paired and config.rounds > 1:  # --rounds 1 is a quick look: one round, no more
                due = self._widest(slot, k, deadline)
                self.todo += len(due) + (1 if due else 0)
            else:
                break
            if not due:
                if k > config.rounds:
                    break
                continue
            reference_s = None
            if k == 1:
                self.progress.message(f"parity reference on {slot.name} (float64 and fp32 eager) ...")
                reference_s = ensure_reference([self.registry.get(n) for n in due], self.workload, slot, config,
                                               self.run_dir)
            if config.rounds > 1 or paired:
                self.report.round_log.setdefault(slot.name, []).append(
                    RoundInfo(order=due, sentinel_s=sentinel_s(config.resolved_threads)))
            if paired:
                self._paired_round(slot, k, [n for n in due if n != "eager"], reference_s)
            else:
                for name in due:
                    reference_s = self._fold(self._cell(name, slot, k), k, reference_s)

    def _label(self, name: str, slot: DeviceSlot, k: int) -> str:
        rounds = self.config.rounds
        if k > rounds:
            return f"{name} on {slot.name}, round {k} (its interval is still wider than ±{self.config.target:g} %)"
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
        """Round ``k`` with warm pairs: one eager process (round 1: eager's own cold cell), warm and
        serving, paired in turn with each backend's cell in ``due``; the rows not due this round
        keep an empty round (``_add_round``), so round ``k`` is the ``k``-th everywhere."""
        config, eager_row = self.config, _row(self.report, "eager", slot.name)
        judge = eager_row is None
        label = self._label("eager", slot, k)
        self.progress.message(f"{label}: a warm eager process, paired in turn with each backend of the round")
        start = time.perf_counter()
        cache = os.path.join(self.run_dir, "caches", slot.name.replace(":", "-"), "eager")
        with tempfile.TemporaryDirectory(prefix="cnncompare-cell-") as cell_dir:
            eager = Child(self.registry.get("eager"), self.workload, slot.name, config, os.path.join(cell_dir, "run"),
                          cache, self.run_dir, _no_phase, judge=judge, serve=True)
            try:
                pairing = Pairing(eager.wait_ready(), config.steps, random.Random(f"{config.seed}:{slot.name}:{k}"),
                                  config.timeout_s)
                self.cost["eager"] = time.perf_counter() - start
                for name in due:
                    reference_s = self._fold(self._cell(name, slot, k, pairing), k, reference_s)
                if pairing.eager is not None and not pairing.eager.lost and pairing.eager.served < config.steps:
                    try:  # no backend took its pairs (each failed or was skipped): eager's row still has its steps
                        pairing.eager.steps(config.steps - pairing.eager.served, config.timeout_s)
                    except PeerLost:
                        pass
                outcome = eager.finish()
            finally:
                eager.close()
        self.done += 1
        self.progress.start_cell(self.done, self.todo, label)
        result = _result(outcome, config, _row_fields(self.registry.get("eager"), None, slot, config))
        result.wall_s = time.perf_counter() - start
        if judge or (eager_row is not None and eager_row.status == Status.OK and len(eager_row.rounds or []) < k):
            self._fold(result, 1 if judge else k, reference_s)
        for row in self.report.rows(slot.name):  # the rows that sat this round out keep its place
            if row.status == Status.OK and len(row.rounds or []) < k:
                _add_round(self.report, None, k, row)
        self.report.rederive()
        self.progress.end_cell(label, summarize(result))

    def _widest(self, slot: DeviceSlot, k: int, deadline: float) -> list[str]:
        """Round ``k``'s backends: the rows whose interval is wider than ``--target``, widest first,
        as many as the time left until ``deadline`` pays for (each at its latest round's cost,
        plus the eager process's start)."""
        rows = [r for r in self.report.rows(slot.name) if r.target_reached is False and r.speedup_ci]
        rows.sort(key=lambda r: -half_width(r.speedup_vs_eager or 1.0, *(r.speedup_ci or [1.0, 1.0])))
        left = deadline - time.monotonic() - self._cost("eager", slot)
        due = []
        for r in rows:
            cost = self._cost(r.backend, slot)
            if cost <= left:
                due.append(r.backend)
                left -= cost
        return due


    def _cost(self, name: str, slot: DeviceSlot) -> float:
        """What another round of ``name`` costs: its latest round's wall time, else (a resumed run)
        its row's mean per round."""
        if name in self.cost:
            return self.cost[name]
        row = _row(self.report, name, slot.name)
        return (row.wall_s or 0.0) / max(1, len(row.rounds or [])) if row else 0.0


def _no_phase(name: str, done: int, total: int) -> None:
    pass


@dataclass
class Pairing:
    """A round's warm eager process, as the cells of the round are paired with it: each serving
    cell's ``drive`` interleaves ``steps`` step pairs with eager (``pairs.interleave``) and keeps
    eager's side in ``eager_samples``. Without an eager peer (it failed before it was warm, or
    was lost) a cell serves ``steps`` steps unpaired, and ``eager_samples`` is None."""

    eager: Optional[Peer]
    steps: int
    rng: random.Random
    timeout_s: float
    eager_samples: Optional[list[float]] = None

    def drive(self, peer: Peer) -> None:
        self.eager_samples = None
        if self.eager is not None and not self.eager.lost:
            try:
                _, self.eager_samples = interleave(peer, self.eager, self.steps, self.rng, self.timeout_s)
                return
            except PeerLost:
                self.eager_samples = None
                if peer.lost:  # the backend's cell ended: its record says why
                    return
        try:
            peer.steps(self.steps, self.timeout_s)
        except PeerLost:
            pass


def _round_order(names: list[str], config: RunConfig, device: str, k: int) -> list[str]:
    """Round ``k``'s order: a shuffle seeded by the run's seed, the device and the round, so a
    rerun (or a resumed run) repeats it. One round keeps the plan's order (eager first)."""
    if config.rounds == 1:
        return list(names)
    order = list(names)
    random.Random(f"{config.seed}:{device}:{k}").shuffle(order)
    return order


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


def summarize(r: CellResult) -> str:
    """The one line the progress display prints when a cell ends."""
    if r.step_s is not None and r.status in (Status.OK, Status.FAIL_ACCURACY):
        text = (f"{r.status.value}  median {r.step_s.median:.4g} s/step, compile {r.compile_s:.3g} s, "
                f"first step {r.first_step_s:.3g} s")
    else:
        text = r.status.value
    d = r.distributed
    if d is not None and d.scaling_efficiency is not None:
        text += (f", {d.nproc} ranks {d.global_images_per_s:.4g} samples/s, "
                 f"scaling efficiency {d.scaling_efficiency:.2f}")
    if r.error:
        text += f"  ({r.error.splitlines()[0][:160]})"
    return text + (f"  [{r.wall_s:.0f} s]" if r.wall_s else "")


def run_cell(backend: Any, plugin: Optional[str], slot: DeviceSlot, config: RunConfig, run_dir: Optional[str] = None,
             on_phase: PhaseCallback = Progress().phase, workload: Any = None, cache_dir: Optional[str] = None,
             judge: bool = True, pairing: Optional["Pairing"] = None) -> CellResult:
    """Measure one cell; never raises for a backend's failure (that is a result).

    ``cache_dir`` is the cell's compile cache (None: a fresh one, so the compile is cold);
    ``judge`` False measures time and memory only (a later round: no parity, no DDP
    single-process run). ``pairing``: the cell serves its measured steps, paired with the
    round's warm eager process (``Pairing``); the row's ``round_eager_samples`` holds eager's side.

    ``workload`` is the config's workload object; None looks it up through the plugins."""
    if workload is None:
        from ...plugins import load_registry

        workload = load_registry().workloads[config.workload.name]
    row = _row_fields(backend, plugin, slot, config)
    reason = slot.unavailable or unavailable(backend, slot.name, config)
    if reason:
        return CellResult(status=Status.SKIPPED, error=reason, **{**row, "compile_cache": None})
    if run_dir is None:  # a cell on its own: a run directory of its own, with its reference
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as own:
            reference_s = ensure_reference([backend], workload, slot, config, own) if judge else None
            result = run_cell(backend, plugin, slot, config, own, on_phase, workload, cache_dir, judge, pairing)
            if result.parity is not None:
                result.parity.reference_s = reference_s
            return result
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cnncompare-cell-") as cell_dir:
        outcome, cold = _measure(backend, workload, slot.name, config, cell_dir, run_dir, on_phase,
                                 cache_dir or os.path.join(cell_dir, "compile-cache"), judge, pairing)
        result = _result(outcome, config, row)
        if pairing is not None and result.step_s is not None:
            paired = pairing.eager_samples
            result.round_eager_samples = [paired if paired and len(paired) == result.step_s.n else []]
        if cold is not None and cold.record is not None:
            result.cold_compile_s, result.cold_first_step_s = cold.record.compile_s, cold.record.first_step_s
        if config.distributed and judge and result.status == Status.OK and result.distributed is not None:
            # Scaling efficiency's denominator; a failed DDP cell has no efficiency to compute.
            alone = config.single_process()
            single, _ = _measure(backend, workload, slot.name, alone, os.path.join(cell_dir, "single"), run_dir,
                                 lambda name, done, total: on_phase(f"single-process-{name}", done, total),
                                 os.path.join(cell_dir, "single-compile-cache"), judge=False)
            one = _result(single, alone, row)
            result.distributed = replace(
                result.distributed, single_process_status=one.status.value,
                single_process_step_median_s=one.step_s.median if one.status == Status.OK and one.step_s else None,
                single_process_threads=one.threads, single_process_error=one.error)
    result.wall_s = time.perf_counter() - start
    if result.status == Status.FAIL_COMPILE and plugin and result.error:
        result.error = f"plugin {plugin!r}: {result.error}"
    return result


#: References computed in this process, by what they depend on (``_reference_key``): a
#: library user (or the test suite) running job after job on the same workload, config and
#: device computes each once. Their files live in a directory removed when the process exits;
#: a run's directory links to them.
_REFERENCES: dict[str, str] = {}


def _reference_key(workload: Any, slot: DeviceSlot, config: RunConfig, plan: ReferencePlan) -> str:
    import json

    job = {k: v for k, v in config.to_dict().items()
           if k not in ("backends", "devices", "timeout_s", "max_memory_mb", "backend_options", "compile_cache",
                        "compile_threads", "rounds", "target", "budget_s")}
    return json.dumps([slot.name, workload.name, job, plan.__dict__], sort_keys=True, default=str)


def _process_dir(kind: str) -> str:
    import atexit

    path = tempfile.mkdtemp(prefix=f"cnncompare-{kind}-")
    atexit.register(shutil.rmtree, path, True)
    return path


def reference_plan(backends: list[Any], config: RunConfig) -> ReferencePlan:
    """What the reference must cover for ``backends`` on one device (``ReferencePlan``)."""
    from ..cell.parity import parity_step

    judged = [parity_step(base.min_warmup(b)) for b in backends] or [parity_step(0)]
    steps = max(1 + max(config.warmup, n - 1) + config.steps for n in judged)
    precisions = tuple(sorted({base.precision(b) for b in backends} - {"fp32"}))
    shards = (config.nproc or 1) * config.nnodes if config.distributed else 1
    return ReferencePlan(tuple(sorted(set(judged))), steps, precisions, shards)


def ensure_reference(backends: list[Any], workload: Any, slot: DeviceSlot, config: RunConfig,
                     run_dir: str) -> Optional[float]:
    """Make the parity reference for ``backends`` on ``slot`` available in ``run_dir``: computed
    in a child of its own, or linked from this process's earlier computation of the same one.
    Returns the seconds computing it took, None when it failed (the failure is left in
    ``run_dir`` for the cells to report as the workload's: ``reference.Meta.load``) or no
    backend here can run."""
    from ..cell.reference import Meta, paths

    runnable = [b for b in backends if not (slot.unavailable or unavailable(b, slot.name, config))]
    if not runnable:
        return None
    plan = reference_plan(runnable, config)
    key = _reference_key(workload, slot, config, plan)
    if key not in _REFERENCES:
        _REFERENCES[key] = _compute_reference(runnable[0], workload, slot, config, plan)
    for cached, linked in zip(paths(_REFERENCES[key], slot.name), paths(run_dir, slot.name)):
        if os.path.exists(cached) and not os.path.exists(linked):
            os.symlink(cached, linked)
    try:
        return Meta.load(run_dir, slot.name).seconds
    except Exception:
        return None


def _compute_reference(backend: Any, workload: Any, slot: DeviceSlot, config: RunConfig,
                       plan: ReferencePlan) -> str:
    """Compute a reference into a directory of this process's; the directory."""
    from ..cell.reference import paths

    where = _process_dir("reference")
    alone = config.single_process() if config.distributed else config
    workdir = os.path.join(where, "child")
    outcome = spawn(backend, workload, slot.name, alone, workdir, os.path.join(workdir, "cache"), where,
                    lambda name, done, total: None, reference=plan)
    error = paths(where, slot.name)[2]
    if not outcome.succeeded and not os.path.exists(error):  # crashed or timed out before it could say why
        from ..fileio import write_atomic

        why = (outcome.record.error if outcome.record and outcome.record.error else
               f"the parity reference's process ended with code {outcome.returncode}"
               + (f" ({outcome.killed_for.value})" if outcome.killed_for else ""))
        write_atomic(error, f"{why}; log: {outcome.log_tail or ''}".strip())
    shutil.rmtree(workdir, ignore_errors=True)
    return where


def _row_fields(backend: Any, plugin: Optional[str], slot: DeviceSlot, config: RunConfig) -> dict[str, Any]:
    """What the parent knows of a row before its child says anything."""
    return dict(backend=backend.name, device=slot.name, plugin=plugin, description=base.description(backend),
                compile_cache=config.compile_cache)


def unavailable(backend: Any, device: str, config: RunConfig) -> Optional[str]:
    """Why ``backend`` can't run on ``device`` under ``config`` (its modes, the device, torchrun),
    or None: such a cell is a ``skipped`` row."""
    import torch

    reason = base.mode_reason(backend, config.mode) or base.unavailable_reason(backend, torch.device(device))
    if reason is None and config.distributed:
        assert config.nproc is not None
        reason = torchrun.unavailable(device, config.nproc)
    return reason


def _measure(backend: Any, workload: Any, device: str, config: RunConfig, cell_dir: str, run_dir: Optional[str],
             on_phase: PhaseCallback, cache: str, judge: bool = True,
             pairing: Optional[Pairing] = None) -> tuple[Outcome, Optional[Outcome]]:
    """The cell's measuring child(ren) in ``cell_dir`` with the compile cache ``cache``: one run,
    or with ``--compile-cache warm`` a cold run and then a warm one sharing it. Returns the
    outcome to report and, in warm mode, the cold one (its compile times go beside it). With
    ``pairing`` the reported child serves its steps, driven by ``pairing.drive``."""

    def child(name: str, serve: bool) -> Outcome:
        started = Child(backend, workload, device, config, os.path.join(cell_dir, name), cache, run_dir, on_phase,
                        judge, serve=serve)
        try:
            if serve and (peer := started.wait_ready()) is not None:
                assert pairing is not None
                pairing.drive(peer)
            return started.finish()
        finally:
            started.close()

    if config.compile_cache != "warm":
        return child("run", pairing is not None), None
    cold = child("cold", False)
    if not cold.succeeded:
        return cold, None
    return child("warm", pairing is not None), cold


def _result(outcome: Outcome, config: RunConfig, row: dict) -> CellResult:
    """The report's row from the child's record (maybe partial) and how the child ended."""
    record = outcome.record or CellRecord()
    result = CellResult.from_record(record, **row)
    finished = outcome.record is not None and outcome.record.complete
    if outcome.killed_for is Status.TIMEOUT:
        result.status = Status.TIMEOUT
        where = "in the parity check, after timing" if outcome.record else "before any figure was taken"
        result.error = f"timed out after {config.timeout_s:g} s ({where}); the child's process tree was killed"
        result.error_tail = outcome.log_tail
    elif outcome.killed_for is Status.OOM:
        result.status = Status.OOM
        result.error = f"the cell's processes exceeded --max-memory {config.max_memory_mb} MB RSS and were killed"
        result.error_tail = outcome.log_tail
    elif outcome.returncode != 0 or not finished:
        result.status = Status.CRASHED
        code = outcome.returncode
        if code < 0:
            name = signal.Signals(-code).name
            hint = " (the kernel's OOM killer sends SIGKILL)" if -code == signal.SIGKILL else ""
            result.error = f"the child was killed by {name}{hint}"
        elif config.distributed:  # torchrun's own summary (which rank, which signal) is in the log tail
            result.error = f"torchrun exited with code {code} without a result: a rank died"
        else:
            result.error = f"the child exited with code {code} without a result"
        if outcome.record:
            result.error += " during the parity check, after timing"
        result.error_tail = outcome.log_tail
    return result
