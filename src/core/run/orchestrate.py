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
from ..stats import StepStats
from . import torchrun
from .devices import DeviceSlot
from .launch import SERVER, Outcome, PhaseCallback, spawn
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
    round on each device (``--rounds``; one round by default).

    ``on_result`` is called after each cell so results are written as they
    come. ``Interrupted``/``KeyboardInterrupt`` propagate after the running
    child's process group is killed.
    """
    workload = registry.workloads[config.workload.name]
    slots = list(dict.fromkeys(c.device for c in cells))
    # Every round of every cell still to run; a cell that ends round 1 not ok runs no more.
    todo = sum(1 for c in cells for k in range(1, config.rounds + 1)
               if _needs_round(report, c, k) or (k > 1 and _needs_round(report, c, 1)))
    progress.start_run(todo)
    done = 0
    try:
        # Private to this run: the parity reference and roofline per device, computed once and
        # shared, and each cell's compile cache, kept from round to round.
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as run_dir:
            for slot in slots:
                names = [c.backend for c in cells if c.device == slot]
                log = report.round_log.setdefault(slot.name, [])
                for k in range(1, config.rounds + 1):
                    due = [n for n in _round_order(names, config, slot.name, k)
                           if _needs_round(report, Cell(n, slot), k)]
                    if not due:
                        continue
                    reference_s = None
                    if k == 1:
                        progress.message(f"parity reference on {slot.name} (float64 and fp32 eager) ...")
                        reference_s = ensure_reference([registry.get(n) for n in due], workload, slot, config,
                                                       run_dir)
                    if config.rounds > 1:
                        log.append(RoundInfo(order=due, sentinel_s=sentinel_s(config.resolved_threads)))
                    for name in due:
                        done += 1
                        label = f"{name} on {slot.name}" + (f", round {k}/{config.rounds}" if config.rounds > 1 else "")
                        progress.start_cell(done, todo, label)
                        cache = os.path.join(run_dir, "caches", slot.name.replace(":", "-"), name)
                        result = run_cell(registry.get(name), registry.origin.get(name), slot, config, run_dir,
                                          progress.phase, workload, cache_dir=cache, judge=k == 1)
                        if k == 1:
                            if reference_s is not None and result.parity is not None:
                                result.parity.reference_s, reference_s = reference_s, None
                            result.rounds = [result.step_s.median] if result.step_s else None
                            report.add(result)
                            if result.status != Status.OK:
                                todo -= config.rounds - 1
                        else:
                            _add_round(report, result, k)
                        on_result(report)
                        progress.end_cell(label, summarize(result))
    except BaseException:
        SERVER.close()  # an interrupted or failed run leaves no process behind
        raise
    finally:
        progress.end_run()


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


def _add_round(report: RunReport, later: CellResult, k: int) -> None:
    """Fold a later round into its row: its samples and median, its warm compile times; a round
    that failed leaves a note and no figure (the row keeps round 1's status and verdicts)."""
    row = next(r for r in report.results if (r.backend, r.device) == (later.backend, later.device))
    assert row.step_s is not None
    failed = later.status != Status.OK or later.step_s is None
    if failed:
        row.notes.append(f"round {k}: {later.status.value}" + (f" ({later.error})" if later.error else ""))
    # A failed round keeps its place (an empty round), so round k still pairs with eager's round k.
    row.round_samples = (row.round_samples or [row.step_s.samples]) + [[] if later.step_s is None or failed
                                                                        else later.step_s.samples]
    row.rounds = [statistics.median(s) if s else None for s in row.round_samples]
    if failed:
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
             judge: bool = True) -> CellResult:
    """Measure one cell; never raises for a backend's failure (that is a result).

    ``cache_dir`` is the cell's compile cache (None: a fresh one, so the compile is cold);
    ``judge`` False measures time and memory only (a later round: no parity, no DDP
    single-process run).

    ``workload`` is the config's workload object; None looks it up through the plugins."""
    if workload is None:
        from ...plugins import load_registry

        workload = load_registry().workloads[config.workload.name]
    row: dict[str, Any] = dict(backend=backend.name, device=slot.name, plugin=plugin,
                               description=base.description(backend))
    reason = slot.unavailable or unavailable(backend, slot.name, config)
    if reason:
        return CellResult(status=Status.SKIPPED, error=reason, **row)
    if run_dir is None:  # a cell on its own: a run directory of its own, with its reference
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as own:
            reference_s = ensure_reference([backend], workload, slot, config, own) if judge else None
            result = run_cell(backend, plugin, slot, config, own, on_phase, workload, cache_dir, judge)
            if result.parity is not None:
                result.parity.reference_s = reference_s
            return result
    row.update(compile_cache=config.compile_cache)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cnncompare-cell-") as cell_dir:
        outcome, cold = _measure(backend, workload, slot.name, config, cell_dir, run_dir, on_phase,
                                 cache_dir or os.path.join(cell_dir, "compile-cache"), judge)
        result = _result(outcome, config, row)
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
                        "compile_threads", "rounds")}
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
             on_phase: PhaseCallback, cache: str, judge: bool = True) -> tuple[Outcome, Optional[Outcome]]:
    """The cell's measuring child(ren) in ``cell_dir`` with the compile cache ``cache``: one run,
    or with ``--compile-cache warm`` a cold run and then a warm one sharing it. Returns the
    outcome to report and, in warm mode, the cold one (its compile times go beside it)."""

    def child(name: str) -> Outcome:
        return spawn(backend, workload, device, config, os.path.join(cell_dir, name), cache, run_dir, on_phase,
                     judge)

    if config.compile_cache != "warm":
        return child("run"), None
    cold = child("cold")
    if not cold.succeeded:
        return cold, None
    return child("warm"), cold


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
