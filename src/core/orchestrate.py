"""Runs every (device, backend) cell, each in a fresh child process.

Isolation is the point: a crash, hang or memory blow-up in one backend
costs that cell alone, and each cell's peak memory is its own. Each child
starts a new session (process group); a timeout, an over-memory cell or an
interrupted run kills the child's whole process tree (inductor compile
workers, and torchrun's ranks, which torchrun starts in sessions of their
own). Each cell gets a fresh compile cache directory, so compile times are
cold.

A single-process cell's child is forked from the fork server
(``forkserver``), which has imported torch and dynamo once for the run.
With ``--nproc N`` a cell is the torchrun job (``distributed``) and then,
when it is ``ok``, the backend in one process with one rank's threads and
batch: the single-process throughput that scaling efficiency divides by,
measured in the same run.
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

from cnncompare.backends import base
from cnncompare.core import distributed
from cnncompare.core.config import RunConfig
from cnncompare.core.devices import DeviceSlot
from cnncompare.core.forkserver import ForkServer
from cnncompare.core.progress import Progress
from cnncompare.core.results import CellResult, Parity, RunReport, StepStats, Status
from cnncompare.plugins import Registry

POLL_S = 0.05
#: Forks every single-process cell's child; started on first use, closed when a run ends.
_SERVER = ForkServer()
LOG_TAIL_LINES = 15


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


def run_cells(
    cells: list[Cell],
    config: RunConfig,
    registry: Registry,
    report: RunReport,
    on_result: Callable[[RunReport], None],
    progress: Progress = Progress(),
) -> None:
    """Run the cells not already in ``report`` (a resumed run keeps its finished ones).

    ``on_result`` is called after each cell so results are written as they
    come. ``Interrupted``/``KeyboardInterrupt`` propagate after the running
    child's process group is killed.
    """
    done = {(r.backend, r.device) for r in report.results}
    todo = [c for c in cells if (c.backend, c.device.name) not in done]
    progress.start_run(len(todo))
    try:
        # Private to this run: the parity reference and roofline per device, computed once and shared.
        with tempfile.TemporaryDirectory(prefix="cnncompare-run-") as run_dir:
            for i, cell in enumerate(todo, 1):
                backend = registry.get(cell.backend)
                label = f"{cell.backend} on {cell.device.name}"
                progress.start_cell(i, len(todo), label)
                result = run_cell(backend, registry.origin.get(cell.backend), cell.device, config, run_dir,
                                  progress.phase)
                report.results.append(result)
                on_result(report)
                progress.end_cell(label, summarize(result))
    finally:
        _SERVER.close()
        progress.end_run()


def summarize(r: CellResult) -> str:
    if r.step_s is not None and r.status in (Status.OK, Status.FAIL_ACCURACY):
        text = (
            f"{r.status.value}  median {r.step_s.median:.4g} s/step, compile {r.compile_s:.3g} s, "
            f"first step {r.first_step_s:.3g} s"
        )
    else:
        text = r.status.value
    if r.distributed and r.distributed.get("scaling_efficiency") is not None:
        text += (f", {r.distributed['nproc']} ranks {r.distributed['global_images_per_s']:.4g} images/s, "
                 f"scaling efficiency {r.distributed['scaling_efficiency']:.2f}")
    if r.error:
        text += f"  ({r.error.splitlines()[0][:160]})"
    return text + (f"  [{r.wall_s:.0f} s]" if r.wall_s else "")


def run_cell(backend: Any, plugin: Optional[str], slot: DeviceSlot, config: RunConfig,
             run_dir: Optional[str] = None,
             on_phase: Callable[[str, int, int], None] = Progress().phase) -> CellResult:
    """Measure one cell; never raises for a backend's failure (that is a result)."""
    result = CellResult(backend=backend.name, device=slot.name, status=Status.SKIPPED, plugin=plugin,
                        description=base.description(backend))
    if slot.unavailable:
        result.error = slot.unavailable
        return result
    import torch

    reason = base.unavailable_reason(backend, torch.device(slot.name))
    if reason:
        result.error = reason
        return result
    if config.distributed and (reason := distributed.unavailable(slot.name, config.nproc)):
        result.error = reason
        return result
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cnncompare-cell-") as cell_dir:
        _fill(result, *_measure(backend, slot.name, config, cell_dir, run_dir, on_phase), config)
        if config.distributed and result.status == Status.OK:
            # Scaling efficiency's denominator; a failed DDP cell has no efficiency to compute.
            alone = config.single_process()
            single = _measure(backend, slot.name, alone, os.path.join(cell_dir, "single"), run_dir,
                              lambda name, done, total: on_phase(f"single-process-{name}", done, total))
            _add_single_process(result, single, alone)
    result.compile_cache = config.compile_cache
    result.compile_threads = config.compile_threads
    result.wall_s = time.perf_counter() - start
    if result.status == Status.FAIL_COMPILE and plugin and result.error:
        result.error = f"plugin {plugin!r}: {result.error}"
    return result


def _measure(backend: Any, device: str, config: RunConfig, cell_dir: str, run_dir: Optional[str],
             on_phase: Callable[[str, int, int], None]) -> tuple:
    """The cell's measuring child(ren) in ``cell_dir``: one run with a cold compile cache,
    or with ``--compile-cache warm`` a cold run and then a warm one sharing its cache
    (the warm run's figures, with the cold run's compile times added)."""
    cache = os.path.join(cell_dir, "compile-cache")  # fresh per cell: the first compile is cold
    if config.compile_cache != "warm":
        return _spawn(backend, device, config, os.path.join(cell_dir, "run"), cache, run_dir, on_phase)
    cold = _spawn(backend, device, config, os.path.join(cell_dir, "cold"), cache, run_dir, on_phase)
    if not _succeeded(cold):
        return cold
    data, *rest = _spawn(backend, device, config, os.path.join(cell_dir, "warm"), cache, run_dir, on_phase)
    if data is not None:
        data = {**data, "cold_compile_s": cold[0].get("compile_s"), "cold_first_step_s": cold[0].get("first_step_s")}
    return (data, *rest)


def _add_single_process(result: CellResult, single: tuple, config: RunConfig) -> None:
    """The same backend's single-process figures beside the DDP ones (scaling efficiency's
    denominator, derived in ``results.derive``)."""
    if result.distributed is None:
        return
    alone = CellResult(backend=result.backend, device=result.device, status=Status.SKIPPED)
    _fill(alone, *single, config)
    ok = alone.status == Status.OK and alone.step_s is not None
    result.distributed.update(
        single_process_status=alone.status.value,
        single_process_step_median_s=alone.step_s.median if ok else None,
        single_process_threads=alone.threads,
        single_process_error=alone.error,
    )


def _payload(backend: Any, device: str, config: RunConfig, result_path: str, cell_dir: str, run_dir: Optional[str],
             progress_path: str) -> bytes:
    try:
        backend_pickle, pickle_error = pickle.dumps(backend), None
    except Exception as exc:  # e.g. holds a lambda: the child finds it again through the plugins
        backend_pickle, pickle_error = None, f"{type(exc).__name__}: {exc}"
    return pickle.dumps({
        "sys_path": list(sys.path),
        "backend_pickle": backend_pickle,
        "pickle_error": pickle_error,
        "backend_name": backend.name,
        "config": config.to_dict(),
        "device": device,
        "result_path": result_path,
        "cell_dir": cell_dir,
        "run_dir": run_dir,
        "progress_path": progress_path,
    })


def _child_env(cache_dir: str, config: RunConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        # A cache directory per cell: nothing leaks between cells, and the first compile is cold.
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"),
        # 1 (the default) compiles in-process: worker pools outlive compilation and hold
        # memory the cell's peak RSS would not see (pytorch/pytorch#105832).
        "TORCHINDUCTOR_COMPILE_THREADS": str(config.compile_threads),
        "OMP_NUM_THREADS": str(config.resolved_threads),
        "PYTHONUNBUFFERED": "1",
    })
    return env


class _Forked:
    """A cell's child forked from the fork server, with the part of ``Popen``'s interface we use."""

    def __init__(self, server: ForkServer, payload_path: str, env: dict, workdir: str, log_path: str):
        self._server = server
        self.pid = server.start_child(payload_path, env, workdir, log_path)
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self._server.poll(self.pid)  # negative: killed by that signal
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(POLL_S)
        return self.returncode


def _kill_tree(proc: Any) -> None:
    """SIGKILL the child's process group and every descendant (torchrun starts each rank in a
    session of its own, so the group alone would leave them running)."""
    try:
        child = psutil.Process(proc.pid)
        victims = child.children(recursive=True) + ([child] if proc.poll() is None else [])
    except psutil.NoSuchProcess:
        victims = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # gone, or killed before it made its own session: killed by pid below
    for p in victims:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if proc.poll() is None:
        proc.wait()


def _tree_rss_mb(pid: int) -> float:
    """Resident memory of a process and its descendants, in MB; 0 once it is gone.

    Any of them can exit between two calls (a forked cell is reaped by the fork server, not
    by us), so every lookup may find no such process."""
    try:
        proc = psutil.Process(pid)
        tree = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in tree:
        try:
            total += p.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total / (1024 * 1024)


class _PhaseReader:
    """Reads the child's "phase done total" lines from a non-blocking pipe.

    The last phase is re-sent about once a second even when the child is
    silent (a long compile), so displays can show time passing.
    """

    RESEND_S = 1.0

    def __init__(self, fd: int, on_phase: Callable[[str, int, int], None]):
        self.fd, self.on_phase, self.buffer = fd, on_phase, b""
        self.last: Optional[tuple[str, int, int]] = None
        self.last_sent = time.monotonic()
        os.set_blocking(fd, False)

    def _send(self, state: tuple[str, int, int]) -> None:
        self.last, self.last_sent = state, time.monotonic()
        self.on_phase(*state)

    def poll(self) -> None:
        try:
            while chunk := os.read(self.fd, 4096):
                self.buffer += chunk
        except BlockingIOError:
            pass
        except OSError:
            return
        *lines, self.buffer = self.buffer.split(b"\n")
        sent = False
        for line in lines:
            parts = line.decode(errors="replace").split()
            if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
                self._send((parts[0], int(parts[1]), int(parts[2])))
                sent = True
        if not sent and self.last is not None and time.monotonic() - self.last_sent >= self.RESEND_S:
            self._send(self.last)


def _succeeded(spawned: tuple) -> bool:
    data, returncode, killed_for, _ = spawned
    return (bool(data) and data.get("complete") and returncode == 0 and killed_for is None
            and data.get("status") == Status.OK.value)


def _spawn(backend: Any, device: str, config: RunConfig, workdir: str, cache_dir: str, run_dir: Optional[str],
           on_phase: Callable[[str, int, int], None]) -> tuple[Optional[dict], int, Optional[Status], Optional[str]]:
    """One child process, or one torchrun job under ``--nproc``: returns (its JSON or None,
    return code, why the parent killed it, log tail)."""
    os.makedirs(workdir)
    result_path = os.path.join(workdir, "result.json")
    payload_path = os.path.join(workdir, "payload.pkl")
    fd = os.open(payload_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(_payload(backend, device, config, result_path, workdir, run_dir, os.path.join(workdir, "progress")))
    # A FIFO rather than an inherited pipe: torchrun's ranks don't inherit our descriptors.
    os.mkfifo(os.path.join(workdir, "progress"), 0o600)
    phase_fd = os.open(os.path.join(workdir, "progress"), os.O_RDONLY | os.O_NONBLOCK)
    log_path = Path(workdir) / "child.log"
    env = _child_env(cache_dir, config)
    if config.distributed:
        with open(log_path, "wb") as log:
            proc: Any = subprocess.Popen(distributed.launch_command(config, payload_path, _run_id(backend.name, device)),
                                         stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         cwd=workdir, start_new_session=True)
    else:
        proc = _Forked(_SERVER, payload_path, env, workdir, str(log_path))
    phases = _PhaseReader(phase_fd, on_phase)
    killed_for: Optional[Status] = None
    try:
        deadline = time.monotonic() + config.timeout_s
        while proc.poll() is None:
            phases.poll()
            if time.monotonic() > deadline:
                killed_for = Status.TIMEOUT
            elif config.max_memory_mb and _tree_rss_mb(proc.pid) > config.max_memory_mb:
                killed_for = Status.OOM
            if killed_for:
                break
            time.sleep(POLL_S)
    finally:
        # Interrupted, killed, or finished: anything left in its tree (compile workers, ranks) goes.
        _kill_tree(proc)
        os.close(phase_fd)
    data, returncode = _read_result(workdir, proc.returncode)
    return data, returncode, killed_for, _log_tail(log_path)


#: How a rank's collective fails when a peer is gone: a consequence, never the cause.
PEER_LOST = ("closed by peer", "reset by peer", "remote worker", "broken pipe", "communicator was aborted",
             "remote process exited")


def _read_result(workdir: str, returncode: int) -> tuple[Optional[dict], int]:
    """The child's result. For a torchrun job where a rank failed: the first rank to fail of
    its own accord (its peers then fail on the broken collective: that is not the cause). A
    failed rank exits 1 on purpose, so that exit is the result, not a crash. When every
    failure is a lost peer, a rank died without a word: no result (crashed, torchrun's summary
    in the log tail names the rank and the signal)."""
    path = Path(workdir) / "result.json"
    data = json.loads(path.read_text()) if path.exists() else None
    failed = [json.loads(p.read_text()) for p in Path(workdir).glob("rank*.json")]
    causes = [f for f in failed if not any(s in (f.get("error") or "").lower() for s in PEER_LOST)]
    if causes:
        first = min(causes, key=lambda f: f["failed_at"])
        first["error"] = f"rank {first['rank']}: {first.get('error')}"
        return first, 0
    if failed:
        return None, returncode or 1
    return data, returncode


def _run_id(backend: str, device: str) -> str:
    """A rendezvous id every node derives alike for the same cell."""
    return "cnncompare-" + "".join(c if c.isalnum() else "-" for c in f"{backend}-{device}")


def _log_tail(path: Path) -> Optional[str]:
    try:
        lines = path.read_text(errors="replace").rstrip().splitlines()
    except OSError:
        return None
    return "\n".join(lines[-LOG_TAIL_LINES:]) or None


def _fill(result: CellResult, data: Optional[dict], returncode: int, killed_for: Optional[Status],
          log_tail: Optional[str], config: RunConfig) -> None:
    """Merge the child's JSON (maybe partial) with how the child ended."""
    if data:
        data = dict(data)
        samples = data.pop("step_samples", None)
        if samples:
            result.step_s = StepStats.from_samples(samples)
        for key, value in data.items():
            if key == "status":
                result.status = Status(value)
            elif key == "parity" and value is not None:
                result.parity = Parity(**value)
            elif hasattr(result, key):
                setattr(result, key, value)
    finished = data is not None and data.get("complete")
    if killed_for is Status.TIMEOUT:
        result.status = Status.TIMEOUT
        where = "in the parity check, after timing" if data else "before any figure was taken"
        result.error = f"timed out after {config.timeout_s:g} s ({where}); the child's process tree was killed"
        result.error_tail = log_tail
    elif killed_for is Status.OOM:
        result.status = Status.OOM
        result.error = f"the cell's processes exceeded --max-memory {config.max_memory_mb} MB RSS and were killed"
        result.error_tail = log_tail
    elif returncode != 0 or not finished:
        result.status = Status.CRASHED
        if returncode < 0:
            name = signal.Signals(-returncode).name
            hint = " (the kernel's OOM killer sends SIGKILL)" if -returncode == signal.SIGKILL else ""
            result.error = f"the child was killed by {name}{hint}"
        elif config.distributed:  # torchrun's own summary (which rank, which signal) is in the log tail
            result.error = f"torchrun exited with code {returncode} without a result: a rank died"
        else:
            result.error = f"the child exited with code {returncode} without a result"
        if data:
            result.error += " during the parity check, after timing"
        result.error_tail = log_tail
