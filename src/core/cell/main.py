"""Entry point of a cell's child process: ``python -m cnncompare.core.cell.main ORDER``.

The parent pickles one ``CellOrder`` into the cell's private directory
(created 0700 by this run, so it is the parent's own data). The child
answers with one ``CellRecord`` as JSON, written atomically, first after
timing and memory are taken and again at the end with ``complete`` set, so
a crash or timeout in the parity check keeps the figures. Under torchrun a
rank whose status is not ``ok`` also writes ``rank<N>.json`` and exits 1, so
that torchrun stops its peers (they would wait in a collective for it
otherwise).

A child never outlives its parent (``processes.die_with_parent``).
"""
from __future__ import annotations

import os
import pickle
import signal
import sys
import time
import warnings
from collections import Counter
from dataclasses import replace
from typing import Any, Callable, Optional

from ..fileio import write_atomic
from ..processes import die_with_parent
from ..records import CellOrder, CellRecord, Status

#: Imported before any cell's clock starts (by the fork server, else by ``main``), so that no
#: row's compile_s holds an import: inductor's alone is about 1.2 s, which a torch.compile row
#: would otherwise pay and eager's wouldn't. A user's script pays it once, not per model.
IMPORTED_BEFORE_TIMING = ("torch", "torch._dynamo", "torch._inductor.compile_fx")


def cuda_unusable_after_fork(device: str) -> Optional[str]:
    """Why a CUDA cell can't run in this process, or None: it was forked from a process that had
    initialised CUDA (the fork server must never touch CUDA; torch refuses CUDA in such a child
    with an error that names neither)."""
    if not device.startswith("cuda"):
        return None
    import torch

    if torch.cuda._is_in_bad_fork():
        return ("this cell was forked from a process that had initialised CUDA, where CUDA can't be used: "
                "cnncompare's fork server must not touch CUDA before it forks (a bug; please report it)")
    return None


def _capture_notes(caught: list) -> list[str]:
    counts = Counter(f"{w.category.__name__}: {str(w.message).strip()}" for w in caught)
    return [text if n == 1 else f"{text} (x{n})" for text, n in counts.items()]


def _lookup(kind: str, name: str) -> Any:
    from ...plugins import load_registry

    registry = load_registry()
    return (registry.backends if kind == "backend" else registry.workloads).get(name)


def main(argv: list[str]) -> int:
    with open(argv[0], "rb") as f:
        order: CellOrder = pickle.load(f)
    sys.path[:] = order.sys_path

    from .rank import Rank

    rank = Rank.from_env()
    if rank is not None:
        # Ranks racing on one compile cache corrupt it (pytorch/pytorch#92664): one per rank.
        for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            if var in os.environ:
                os.environ[var] = os.path.join(os.environ[var], f"rank{rank.rank}")

    def write(record: CellRecord, final: bool = False) -> int:
        """Write this process's record; the exit code: 1 for a failed rank, so torchrun stops its peers."""
        record.complete = final
        if rank is None or rank.reports:
            write_atomic(order.result_path, record.to_json())
        if rank is None or record.status == Status.OK:
            return 0
        # When one rank fails its peers fail next ("connection closed by peer"); the parent
        # reports the first failure, so each says when it failed.
        record.rank, record.failed_at = rank.rank, time.time()
        write_atomic(os.path.join(os.path.dirname(order.result_path), f"rank{rank.rank}.json"), record.to_json())
        return 1

    import importlib

    for name in IMPORTED_BEFORE_TIMING:  # already there in a cell forked from the server
        importlib.import_module(name)
    from ...backends import base
    from .measure import fail, measure

    if order.reference is not None:
        return write(_reference(order), final=True)
    try:
        backend = order.backend.unpack(_lookup)
        workload = order.workload.unpack(_lookup)
        base.configure(backend, order.config.backend_options.get(backend.name, {}))
    except Exception as exc:
        return write(fail(CellRecord(), exc, "loading the backend in the child", Status.FAIL_COMPILE), final=True)
    refused = cuda_unusable_after_fork(order.device)
    if refused:
        record = CellRecord(status=Status.CRASHED, error=refused)
        return write(record, final=True)

    with warnings.catch_warnings(record=True) as caught:
        # Every warning (TorchScript deprecations, TracerWarnings, recompiles) goes
        # to the report's notes instead of the terminal.
        warnings.simplefilter("always")

        def checkpoint(record: CellRecord) -> None:
            write(replace(record, notes=record.notes + _capture_notes(caught)))

        reporting = rank is None or rank.reports
        record = measure(backend, workload, order.config, order.device, checkpoint, order.cell_dir, order.run_dir,
                         _phase_reporter(order.progress_path if reporting else None), rank, judge=order.judge,
                         serve=order.serve, artifacts=order.artifacts)
    record.notes = record.notes + _capture_notes(caught)
    return write(record, final=True)


def _reference(order: CellOrder) -> CellRecord:
    """Compute the device's parity reference (``reference.build``); the record says how it went,
    its ``compile_s`` what it took."""
    import torch

    from ..config import malloc_supported
    from .measure import fail
    from .memory import use_malloc
    from .reference import build
    from .training import Job

    assert order.reference is not None and order.run_dir is not None
    if malloc_supported("reuse") is None:
        # Nothing here is timed: freed memory kept for the next step spares the reference the page
        # faults a cell measures (a fifth of its time at the default config).
        use_malloc("reuse")
    try:
        workload = order.workload.unpack(_lookup)
        torch.set_num_threads(order.config.resolved_threads)
        device = torch.device(order.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        seconds = build(Job(workload, order.config), device, order.reference, order.run_dir)
    except Exception as exc:
        return fail(CellRecord(), exc, "reference")
    return CellRecord(compile_s=seconds)


def forked_main(order_path: str, env: dict, workdir: str, log_path: str, server: int) -> int:
    """Entry point of a cell forked from the fork server (``run/forkserver.py``).

    The server has imported torch and dynamo and done nothing else, so this
    process starts clean without paying those imports (seconds) per cell. It
    makes itself what ``python -m cnncompare.core.cell.main`` would be: its own
    session, the cell's environment, directory and log; it dies with the
    server, which dies with the run. Returns the exit code.
    """
    os.setsid()
    die_with_parent(server)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(workdir)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the server ignores it
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Inductor's config read the environment when the server imported it: decide again with the
    # cell's (TORCHINDUCTOR_COMPILE_THREADS, or torch's own count for the cores).
    import torch._inductor.config as inductor_config

    inductor_config.compile_threads = inductor_config.decide_compile_threads()
    return main([order_path])


def _phase_reporter(path: Optional[str]) -> Callable[[str, int, int], None]:
    """Phase lines ("steps 5 20") on the parent's FIFO; silent if there is none or it is full."""
    fd: Optional[int] = None

    def report(name: str, done: int, total: int) -> None:
        nonlocal fd
        if path is None:
            return
        try:
            if fd is None:
                fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
            os.write(fd, f"{name} {done} {total}\n".encode())
        except OSError:
            pass

    return report


if __name__ == "__main__":
    die_with_parent(os.getppid())  # a torchrun rank: its parent is torchrun's agent, which dies with the run
    sys.exit(main(sys.argv[1:]))
