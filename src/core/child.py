"""Entry point of a cell's child process: ``python -m cnncompare.core.child PAYLOAD``.

The parent writes one pickled payload into the cell's private directory
(created 0700 by this run, so it is the parent's own data): the backend
object (or its name, when it can't be pickled, to be looked up again through
the plugins), the config, the device, where to write the result and the
FIFO to report progress on. A file rather than stdin because under
``--nproc`` torchrun starts the ranks and their stdin is not ours.

The result is JSON, written atomically, first after timing and memory are
taken and again at the end with ``"complete": true``, so a crash or timeout
in the parity check keeps the figures. Under torchrun every rank also writes
``rank<N>.json``; a rank whose status is not ``ok`` exits 1 so that torchrun
stops its peers (they would wait in a collective for it otherwise).
"""
from __future__ import annotations

import json
import os
import pickle
import signal
import sys
import time
import warnings
from collections import Counter
from typing import Any, Optional


def _capture_notes(caught: list) -> list[str]:
    counts = Counter(f"{w.category.__name__}: {str(w.message).strip()}" for w in caught)
    return [text if n == 1 else f"{text} (x{n})" for text, n in counts.items()]


def main(argv: list[str]) -> int:
    with open(argv[0], "rb") as f:
        payload = pickle.load(f)
    # Backends defined in the parent's modules (tests, embedding apps) must import here too.
    sys.path[:] = payload["sys_path"]

    from cnncompare.core.distributed import Rank

    rank = Rank.from_env()
    if rank is not None:
        # Ranks racing on one compile cache corrupt it (pytorch/pytorch#92664): one per rank.
        for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
            if var in os.environ:
                os.environ[var] = os.path.join(os.environ[var], f"rank{rank.rank}")

    from cnncompare.core.config import RunConfig
    from cnncompare.core.fileio import write_atomic
    from cnncompare.core.measure import error_fields
    from cnncompare.core.results import Status

    def write(data: dict, final: bool = False) -> int:
        """Write this process's result; the exit code: 1 for a failed rank, so torchrun stops its peers."""
        data = {**data, "complete": final}
        if rank is None or rank.reports:
            write_atomic(payload["result_path"], json.dumps(data))
        if rank is None or data.get("status") == Status.OK.value:
            return 0
        # When one rank fails its peers fail next ("connection closed by peer"); the parent
        # reports the first failure, so each says when it failed.
        write_atomic(os.path.join(os.path.dirname(payload["result_path"]), f"rank{rank.rank}.json"),
                     json.dumps({**data, "rank": rank.rank, "failed_at": time.time()}))
        return 1

    try:
        backend = _load_backend(payload)
    except Exception as exc:
        return write({"status": Status.FAIL_COMPILE.value, **error_fields(exc, "loading the backend in the child")},
                     final=True)

    from cnncompare.core.measure import run_cell

    config = RunConfig.from_dict(payload["config"])
    with warnings.catch_warnings(record=True) as caught:
        # Every warning (TorchScript deprecations, TracerWarnings, recompiles) goes
        # to the report's notes instead of the terminal.
        warnings.simplefilter("always")

        def checkpoint(data: dict) -> None:
            write({**data, "notes": _capture_notes(caught)})

        reporting = rank is None or rank.reports
        out = run_cell(backend, config, payload["device"], checkpoint, payload["cell_dir"], payload.get("run_dir"),
                       _phase_reporter(payload.get("progress_path") if reporting else None), rank)
    return write({**out, "notes": out.get("notes", []) + _capture_notes(caught)}, final=True)


def forked_main(payload_path: str, env: dict, workdir: str, log_path: str) -> int:
    """Entry point of a cell forked from the fork server (``core/forkserver.py``).

    The server has imported torch and dynamo and done nothing else, so this
    process starts clean without paying those imports (seconds) per cell. It
    makes itself what ``python -m cnncompare.core.child`` would be: its own
    session, the cell's environment, directory and log. Returns the exit code.
    """
    os.setsid()
    os.environ.clear()
    os.environ.update(env)
    os.chdir(workdir)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout.reconfigure(line_buffering=True)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # the server ignores it
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    # Read from the environment when inductor's config was imported, i.e. in the server.
    import torch._inductor.config

    torch._inductor.config.compile_threads = int(env.get("TORCHINDUCTOR_COMPILE_THREADS", "1"))
    return main([payload_path])


def _phase_reporter(path: Optional[str]):
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


def _load_backend(payload: dict) -> Any:
    if payload.get("backend_pickle") is not None:
        return pickle.loads(payload["backend_pickle"])
    from cnncompare.plugins import load_registry

    name = payload["backend_name"]
    registry = load_registry()
    if name not in registry.backends:
        raise LookupError(
            f"backend {name!r} can't be pickled ({payload['pickle_error']}) and no installed plugin "
            "registers it in the child; make it picklable or register it through an entry point"
        )
    return registry.get(name)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
