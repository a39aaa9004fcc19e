"""Runs every (device, backend) cell, each in a fresh child process, into a ``RunReport``.

Isolation is the point: a crash, hang or memory blow-up in one backend
costs that cell alone, and each cell's peak memory is its own. Each cell
gets a fresh compile cache directory, so compile times are cold
(``--compile-cache warm`` runs it twice sharing one). Starting and
supervising a child is ``launch.py``'s; this module decides what runs and
turns each child's ``CellRecord`` and ending into the report's row.

With ``--nproc N`` a cell is the torchrun job and then, when it is ``ok``,
the backend in one process with one rank's threads and batch: the
single-process throughput that scaling efficiency divides by, measured in
the same run.
"""
from __future__ import annotations

import os
import signal
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Optional

from ...backends import base
from ...plugins import Registry
from ..config import RunConfig
from ..records import CellRecord, Status
from ..results import CellResult, RunReport
from . import torchrun
from .devices import DeviceSlot
from .launch import SERVER, Outcome, PhaseCallback, spawn
from .progress import Progress


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
    """Run the cells not already in ``report`` (a resumed run keeps its finished ones).

    ``on_result`` is called after each cell so results are written as they
    come. ``Interrupted``/``KeyboardInterrupt`` propagate after the running
    child's process group is killed.
    """
    done = {(r.backend, r.device) for r in report.results}
    todo = [c for c in cells if (c.backend, c.device.name) not in done]
    workload = registry.workloads[config.workload.name]
    progress.start_run(len(todo))
    try:
        # Private to this run: the parity reference and roofline per device, computed once and shared.
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as run_dir:
            for i, cell in enumerate(todo, 1):
                label = f"{cell.backend} on {cell.device.name}"
                progress.start_cell(i, len(todo), label)
                result = run_cell(registry.get(cell.backend), registry.origin.get(cell.backend), cell.device, config,
                                  run_dir, progress.phase, workload)
                report.add(result)
                on_result(report)
                progress.end_cell(label, summarize(result))
    finally:
        SERVER.close()
        progress.end_run()


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
             on_phase: PhaseCallback = Progress().phase, workload: Any = None) -> CellResult:
    """Measure one cell; never raises for a backend's failure (that is a result).

    ``workload`` is the config's workload object; None looks it up through the plugins."""
    if workload is None:
        from ...plugins import load_registry

        workload = load_registry().workloads[config.workload.name]
    row: dict[str, Any] = dict(backend=backend.name, device=slot.name, plugin=plugin,
                               description=base.description(backend))
    reason = slot.unavailable or _unavailable(backend, slot.name, config)
    if reason:
        return CellResult(status=Status.SKIPPED, error=reason, **row)
    row.update(compile_cache=config.compile_cache, compile_threads=config.compile_threads)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cnncompare-cell-") as cell_dir:
        outcome, cold = _measure(backend, workload, slot.name, config, cell_dir, run_dir, on_phase)
        result = _result(outcome, config, row)
        if cold is not None and cold.record is not None:
            result.cold_compile_s, result.cold_first_step_s = cold.record.compile_s, cold.record.first_step_s
        if config.distributed and result.status == Status.OK and result.distributed is not None:
            # Scaling efficiency's denominator; a failed DDP cell has no efficiency to compute.
            alone = config.single_process()
            single, _ = _measure(backend, workload, slot.name, alone, os.path.join(cell_dir, "single"), run_dir,
                                 lambda name, done, total: on_phase(f"single-process-{name}", done, total))
            one = _result(single, alone, row)
            result.distributed = replace(
                result.distributed, single_process_status=one.status.value,
                single_process_step_median_s=one.step_s.median if one.status == Status.OK and one.step_s else None,
                single_process_threads=one.threads, single_process_error=one.error)
    result.wall_s = time.perf_counter() - start
    if result.status == Status.FAIL_COMPILE and plugin and result.error:
        result.error = f"plugin {plugin!r}: {result.error}"
    return result


def _unavailable(backend: Any, device: str, config: RunConfig) -> Optional[str]:
    import torch

    reason = base.unavailable_reason(backend, torch.device(device))
    if reason is None and config.distributed:
        assert config.nproc is not None
        reason = torchrun.unavailable(device, config.nproc)
    return reason


def _measure(backend: Any, workload: Any, device: str, config: RunConfig, cell_dir: str, run_dir: Optional[str],
             on_phase: PhaseCallback) -> tuple[Outcome, Optional[Outcome]]:
    """The cell's measuring child(ren) in ``cell_dir``: one run with a cold compile cache, or
    with ``--compile-cache warm`` a cold run and then a warm one sharing its cache. Returns the
    outcome to report and, in warm mode, the cold one (its compile times go beside it)."""
    cache = os.path.join(cell_dir, "compile-cache")  # fresh per cell: the first compile is cold

    def child(name: str) -> Outcome:
        return spawn(backend, workload, device, config, os.path.join(cell_dir, name), cache, run_dir, on_phase)

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
