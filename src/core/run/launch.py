"""Starting one cell's child and supervising it until it ends: the parent's side of the boundary.

A single-process cell's child is forked from the fork server
(``forkserver.py``); a ``--nproc`` cell is a torchrun job (``torchrun.py``).
Either way the parent writes a ``CellOrder`` into the cell's directory,
watches the child (timeout, ``--max-memory``, its progress over a FIFO),
kills its whole process tree when it ends, and reads its ``CellRecord``
back. Each child starts a new session (process group); a timeout, an
over-memory cell or an interrupted run kills the whole tree (inductor
compile workers, and torchrun's ranks, which torchrun starts in sessions of
their own). Every child also dies with its parent (``PR_SET_PDEATHSIG``), so
a run killed with SIGKILL leaves none behind.
"""
from __future__ import annotations

import functools
import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import psutil

from ..config import RunConfig
from ..processes import die_with_parent
from ..records import CacheArtifacts, CellOrder, CellRecord, ReferencePlan, Shipped, Status
from . import torchrun
from .forkserver import ForkServer
from .pairs import Listener, Peer, PeerLost

POLL_S = 0.05
LOG_TAIL_LINES = 15
#: Forks every single-process cell's child; started on first use, closed when a run ends.
SERVER = ForkServer()

PhaseCallback = Callable[[str, int, int], None]


@dataclass
class Outcome:
    """How one child ended: its record (None if it wrote none), its exit code (negative: killed by
    that signal), why the parent killed it (timeout, oom) and the tail of its log."""

    record: Optional[CellRecord]
    returncode: int
    killed_for: Optional[Status]
    log_tail: Optional[str]

    @property
    def succeeded(self) -> bool:
        r = self.record
        return (r is not None and r.complete and self.returncode == 0 and self.killed_for is None
                and r.status == Status.OK)


def child_env(cache_dir: str, config: RunConfig) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        # A cache directory per cell: nothing leaks between cells, and the first compile is cold.
        "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache_dir, "inductor"),
        "TRITON_CACHE_DIR": os.path.join(cache_dir, "triton"),
        "OMP_NUM_THREADS": str(config.resolved_threads),
        "PYTHONUNBUFFERED": "1",
    })
    # Unset: torch decides, as it would for the user (its count for the cores; the cell
    # records it). Workers outlive compilation and hold memory outside the cell's own RSS
    # (pytorch/pytorch#105832): the cell samples them apart (memory.DescendantsPeak).
    if config.compile_threads is not None:
        env["TORCHINDUCTOR_COMPILE_THREADS"] = str(config.compile_threads)
    return env


def renew_server(config: RunConfig) -> float:
    """A new fork server for the cells to come, its imports under their settings
    (``ForkServer.renew``: a new address-space layout); the seconds its start took."""
    return SERVER.renew(child_env("", config))


class _Forked:
    """A cell's child forked from the fork server, with the part of ``Popen``'s interface we use."""

    def __init__(self, server: ForkServer, order_path: str, env: dict, workdir: str, log_path: str):
        self._server = server
        self.pid = server.start_child(order_path, env, workdir, log_path)
        self.returncode: Optional[int] = None

    def poll(self) -> Optional[int]:
        if self.returncode is None:
            self.returncode = self._server.poll(self.pid)  # negative: killed by that signal
        return self.returncode

    def wait(self) -> int:
        while self.poll() is None:
            time.sleep(POLL_S)
        assert self.returncode is not None
        return self.returncode


def _start_torchrun(config: RunConfig, order_path: str, run_id: str, env: dict, workdir: str,
                    log_path: Path) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(torchrun.launch_command(config, order_path, run_id), stdin=subprocess.DEVNULL,
                                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=workdir,
                                start_new_session=True, preexec_fn=functools.partial(die_with_parent, os.getpid()))


def kill_tree(proc: Any) -> None:
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


def tree_rss_mb(pid: int) -> float:
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
    """Reads the child's "phase done total" lines from a non-blocking FIFO.

    The last phase is re-sent about once a second even when the child is
    silent (a long compile), so displays can show time passing.
    """

    RESEND_S = 1.0

    def __init__(self, fd: int, on_phase: PhaseCallback):
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


class Child:
    """One child process (one torchrun job under ``--nproc``), started at construction and
    supervised by ``wait_ready`` and ``finish`` (``judge``, ``reference``, ``serve`` and ``artifacts``: see
    ``CellOrder``).

    A serving child (``serve``) connects to its ``Listener`` once warm: ``wait_ready`` returns its
    ``Peer`` (None if it ended first), the caller drives it, and ``finish`` tells it to stop and
    supervises the rest (its parity check). The timeout counts from the start to the peer's
    ready, and again from ``finish``: a serving cell's steps each have ``timeout_s`` of their own.
    """

    def __init__(self, backend: Any, workload: Any, device: str, config: RunConfig, workdir: str, cache_dir: str,
                 run_dir: Optional[str], on_phase: PhaseCallback, judge: bool = True,
                 reference: Optional[ReferencePlan] = None, serve: bool = False,
                 artifacts: Optional[CacheArtifacts] = None):
        os.makedirs(workdir)
        self.config, self.workdir = config, workdir
        self.listener = Listener() if serve else None
        self.peer: Optional[Peer] = None
        progress = os.path.join(workdir, "progress")
        order = CellOrder(sys_path=list(sys.path), backend=Shipped.of("backend", backend),
                          workload=Shipped.of("workload", workload), config=config, device=device,
                          result_path=os.path.join(workdir, "result.json"), cell_dir=workdir, run_dir=run_dir,
                          progress_path=progress, judge=judge, reference=reference,
                          serve=self.listener.path if self.listener else None, artifacts=artifacts)
        order_path = os.path.join(workdir, "order.pkl")
        fd = os.open(order_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            pickle.dump(order, f)
        # A FIFO rather than an inherited pipe: torchrun's ranks don't inherit our descriptors.
        os.mkfifo(progress, 0o600)
        self._phase_fd = os.open(progress, os.O_RDONLY | os.O_NONBLOCK)
        self.log_path = Path(workdir) / "child.log"
        env = child_env(cache_dir, config)
        if config.distributed:
            self.proc: Any = _start_torchrun(config, order_path, torchrun.run_id(backend.name, device), env, workdir,
                                             self.log_path)
        else:
            self.proc = _Forked(SERVER, order_path, env, workdir, str(self.log_path))
        self._phases = _PhaseReader(self._phase_fd, on_phase)
        self.killed_for: Optional[Status] = None
        self._closed = False

    def _watch(self, until) -> None:
        """Supervise until ``until()`` is true or the child ends; on a timeout or over-memory, kill it."""
        deadline = time.monotonic() + self.config.timeout_s
        while self.proc.poll() is None and not until():
            self._phases.poll()
            if time.monotonic() > deadline:
                self.killed_for = Status.TIMEOUT
                kill_tree(self.proc)
            if self.killed():
                return
            time.sleep(POLL_S)

    def killed(self) -> bool:
        """Whether the child has been killed: for a timeout, or for ``--max-memory``, which this
        checks now against its process tree's RSS (killing it if over). Also called while the
        parent drives a serving cell's pairs instead of ``_watch``ing it (``cell.Pairing``)."""
        limit = self.config.max_memory_mb
        if not self.killed_for and limit and self.proc.poll() is None and tree_rss_mb(self.proc.pid) > limit:
            self.killed_for = Status.OOM
            kill_tree(self.proc)
        return self.killed_for is not None

    def wait_ready(self) -> Optional[Peer]:
        """The serving child's peer once it is warm; None if it ended (or was killed) first."""
        assert self.listener is not None
        try:
            self._watch(lambda: self._accept() is not None)
        except BaseException:
            self.close()
            raise
        return self.peer

    def _accept(self) -> Optional[Peer]:
        assert self.listener is not None
        if self.peer is None:
            try:
                self.peer = self.listener.accept()
            except PeerLost:
                return None
        return self.peer

    def finish(self) -> Outcome:
        """Stop serving (if it was), supervise the child to its end, and read its record."""
        try:
            if self.peer is not None:
                self.peer.stop()
            if not self.killed_for:
                self._watch(lambda: False)
        finally:
            self.close()
        record, returncode = _read_record(self.workdir, self.proc.returncode)
        return Outcome(record, returncode, self.killed_for, _log_tail(self.log_path))

    def close(self) -> None:
        """Kill whatever is left of the child's tree (compile workers, ranks) and free its resources."""
        if self._closed:
            return
        self._closed = True
        kill_tree(self.proc)
        os.close(self._phase_fd)
        if self.listener is not None:
            self.listener.close()


def spawn(backend: Any, workload: Any, device: str, config: RunConfig, workdir: str, cache_dir: str,
          run_dir: Optional[str], on_phase: PhaseCallback, judge: bool = True,
          reference: Optional[ReferencePlan] = None) -> Outcome:
    """One child process, or one torchrun job under ``--nproc``, from start to end."""
    return Child(backend, workload, device, config, workdir, cache_dir, run_dir, on_phase, judge, reference).finish()


#: How a rank's collective fails when a peer is gone: a consequence, never the cause.
PEER_LOST = ("closed by peer", "reset by peer", "remote worker", "broken pipe", "communicator was aborted",
             "remote process exited")


def _read_record(workdir: str, returncode: int) -> tuple[Optional[CellRecord], int]:
    """The child's record. For a torchrun job where a rank failed: the first rank to fail of
    its own accord (its peers then fail on the broken collective: that is not the cause). A
    failed rank exits 1 on purpose, so that exit is the result, not a crash. When every
    failure is a lost peer, a rank died without a word: no record (crashed, torchrun's summary
    in the log tail names the rank and the signal)."""
    path = Path(workdir) / "result.json"
    record = _load_record(path) if path.exists() else None
    failed = [_load_record(p) for p in Path(workdir).glob("rank*.json")]
    causes = [f for f in failed if not any(s in (f.error or "").lower() for s in PEER_LOST)]
    if causes:
        first = min(causes, key=lambda f: f.failed_at or 0.0)
        first.error = f"rank {first.rank}: {first.error}"
        return first, 0
    if failed:
        return None, returncode or 1
    return record, returncode


def _load_record(path: Path) -> CellRecord:
    """The record at ``path``; one the parent can't read (strict reading: an unknown key, a wrong
    type) ends that cell as ``crashed`` with the reason, never the whole run."""
    try:
        return CellRecord.from_json(path.read_text())
    except (OSError, ValueError, TypeError) as exc:
        return CellRecord(status=Status.CRASHED, error=f"the cell's record could not be read: {type(exc).__name__}: {exc}")


def _log_tail(path: Path) -> Optional[str]:
    try:
        lines = path.read_text(errors="replace").rstrip().splitlines()
    except OSError:
        return None
    return "\n".join(lines[-LOG_TAIL_LINES:]) or None
