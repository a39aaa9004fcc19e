"""The cell's side of a warm pair: after its warm-up the cell serves measured steps on command.

The parent (``run/pairs.py``) listens on a Unix socket in the run's directory; the cell
connects, says it is ready, and then answers each ``{"steps": n}`` with the seconds of its next
``n`` steps, timed in the cell exactly as ``timing.timed_steps`` times any step. ``{"stop": true}``
(or the parent's end: EOF) ends the serving and the cell goes on to its parity check.

Protocol, one JSON object per line: cell -> ``{"ready": pid, "warmup": steps}`` (the warm-up steps it
ran after its first step: its eager partner runs as many); parent -> ``{"steps": n}``;
cell -> ``{"samples": [seconds, ...]}``; parent -> ``{"stop": true}``. A step that raises ends the
cell as it would end a measured step (its record says why; the parent sees the socket close).
"""
from __future__ import annotations

import json
import os
import socket
from typing import Callable


def serve(path: str, run_steps: Callable[[int], list[float]], warmup: int) -> int:
    """Serve ``run_steps(n)`` to the parent listening at ``path`` until it says stop, having run
    ``warmup`` warm-up steps; the number of steps served."""
    served = 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        stream = sock.makefile("rwb", buffering=0)

        def send(message: dict) -> None:
            stream.write((json.dumps(message) + "\n").encode())

        send({"ready": os.getpid(), "warmup": warmup})
        for line in stream:
            command = json.loads(line)
            if "steps" not in command:
                break
            samples = run_steps(int(command["steps"]))
            served += len(samples)
            send({"samples": samples})
    return served
