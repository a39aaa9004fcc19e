"""Entry point of a cell's child process: ``python -m cnncompare.core.child``.

The parent sends one pickled payload on stdin (it is the parent's own data,
never read from a file): the backend object (or its name, when it can't be
pickled, to be looked up again through the plugins), the config, the device
and where to write the result. The result is JSON, written atomically,
first after timing and memory are taken and again at the end, so a crash or
timeout in the parity check keeps the figures.
"""
from __future__ import annotations

import json
import os
import pickle
import sys
import warnings
from collections import Counter
from typing import Any, Optional


def _capture_notes(caught: list) -> list[str]:
    counts = Counter(f"{w.category.__name__}: {str(w.message).strip()}" for w in caught)
    return [text if n == 1 else f"{text} (x{n})" for text, n in counts.items()]


def main() -> int:
    payload = pickle.load(sys.stdin.buffer)
    # Backends defined in the parent's modules (tests, embedding apps) must import here too.
    sys.path[:] = payload["sys_path"]

    from cnncompare.core.config import RunConfig
    from cnncompare.core.fileio import write_atomic
    from cnncompare.core.measure import error_fields
    from cnncompare.core.results import Status

    result_path = payload["result_path"]

    def write(data: dict) -> None:
        write_atomic(result_path, json.dumps(data))

    try:
        backend = _load_backend(payload)
    except Exception as exc:
        write({"status": Status.FAIL_COMPILE.value, **error_fields(exc, "loading the backend in the child")})
        return 0

    from cnncompare.core.measure import run_cell

    config = RunConfig.from_dict(payload["config"])
    with warnings.catch_warnings(record=True) as caught:
        # Every warning (TorchScript deprecations, TracerWarnings, recompiles) goes
        # to the report's notes instead of the terminal.
        warnings.simplefilter("always")

        def checkpoint(data: dict) -> None:
            write({**data, "notes": _capture_notes(caught)})

        out = run_cell(backend, config, payload["device"], checkpoint, payload["cell_dir"], payload.get("run_dir"),
                       _phase_reporter(payload.get("progress_fd")))
    write({**out, "notes": _capture_notes(caught)})
    return 0


def _phase_reporter(fd: Optional[int]):
    """Phase lines ("steps 5 20") on the pipe the parent gave us; silent if it is gone."""

    def report(name: str, done: int, total: int) -> None:
        if fd is None:
            return
        try:
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
    sys.exit(main())
