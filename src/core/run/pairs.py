"""Warm interleaved pairs, the parent's side: a backend's serving cell and an eager one, alternated.

Why: on a shared machine a process's speed drifts from minute to minute and differs from one
process to the next. Two cells measured minutes apart carry that drift into their ratio; two
warm processes alive side by side, asked for one step each in turn (the order inside each pair
drawn at random), see the same minute. Each pair of steps gives a ratio; the speedup's interval
then has two levels, process pairs and the step pairs inside them (``stats.paired_speedup``).

A serving cell (``cell/serve.py``) connects to a ``Listener`` once it is warm; the parent holds a
``Peer`` per cell and ``interleave`` drives two of them. Only one process steps at a time: the
other waits blocked on its socket, so the two never compete for the cores.
"""
from __future__ import annotations

import json
import math
import os
import random
import select
import shutil
import socket
import tempfile
import time
from typing import Callable, Optional


class PeerLost(RuntimeError):
    """A serving cell closed its socket or stopped answering (its record says why)."""


class Stopped(PeerLost):
    """The parent stopped the pairs: its supervision killed one of the processes (``Peer.waiting``)."""


class Listener:
    """A Unix socket one serving cell connects to. Its directory is private to this run (0700):
    only this user's processes can connect, and a Unix socket's path must stay short (about 100
    bytes), so it is made directly under the temporary directory, not in the cell's."""

    def __init__(self) -> None:
        where = tempfile.gettempdir()
        self.dir = tempfile.mkdtemp(prefix="cnc-", dir=where if len(where) < 60 else "/tmp")
        self.path = os.path.join(self.dir, "s")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(self.path)
        self._sock.listen(1)
        self._sock.setblocking(False)

    def accept(self) -> Optional["Peer"]:
        """The cell that connected and said it is ready, or None while none has."""
        if not select.select([self._sock], [], [], 0)[0]:
            return None
        conn, _ = self._sock.accept()
        conn.setblocking(True)
        peer = Peer(conn)
        hello = peer.read(timeout_s=60.0)
        peer.ready, peer.warmup = hello["ready"], int(hello.get("warmup", 0))
        return peer

    def close(self) -> None:
        self._sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def unsupervised() -> None:
    """No supervision: the default ``Peer.waiting`` and ``interleave``'s ``between``."""


#: While the parent waits on a cell's steps it wakes this often to run ``Peer.waiting``.
WAKE_S = 0.5


class Peer:
    """The parent's end of one serving cell."""

    def __init__(self, conn: socket.socket):
        self._conn, self._buffer, self.ready = conn, b"", 0
        #: The warm-up steps the cell ran after its first step, before it was ready.
        self.warmup = 0
        self.lost = False
        #: Run every ``WAKE_S`` while waiting for an answer (the parent's supervision of the
        #: processes it drives; it raises ``Stopped`` to stop waiting).
        self.waiting: Callable[[], None] = unsupervised

    def read(self, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerLost(f"no answer within {timeout_s:g} s")
            if not select.select([self._conn], [], [], min(left, WAKE_S))[0]:
                self.waiting()
                continue
            chunk = self._conn.recv(65536)
            if not chunk:
                raise PeerLost("the cell ended")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def _send(self, message: dict) -> None:
        try:
            self._conn.sendall((json.dumps(message) + "\n").encode())
        except OSError as exc:
            raise PeerLost(f"the cell ended ({exc})") from None

    def steps(self, n: int, timeout_s: float) -> list[float]:
        """The seconds of the cell's next ``n`` steps, each timed in the cell."""
        try:
            self._send({"steps": n})
            return [float(s) for s in self.read(timeout_s)["samples"]]
        except Stopped:  # the parent's own decision: which peer is lost, it has said
            raise
        except PeerLost:
            self.lost = True
            raise

    def stop(self) -> None:
        """Tell the cell to stop serving (it goes on to its parity check, then ends)."""
        if not self.lost:
            try:
                self._send({"stop": True})
            except PeerLost:
                pass
        self._conn.close()


#: A round's step pairs at most (``round_size``).
MAX_PAIRS = 1000
#: Steps shorter than this are alternated in chunks of about this many seconds: switching
#: process every millisecond would time each step in caches the other process just used.
CHUNK_S = 0.05


def round_size(eager_step_s: float, steps: int, round_s: float) -> tuple[int, int]:
    """``(pairs, chunk)`` for a round whose eager steps take about ``eager_step_s``: at least
    ``steps`` pairs (``--steps``), more when they would cover less than ``round_s`` seconds
    (``--round-time``: a small model's 4 steps are milliseconds, swamped by one step's noise,
    where a round's fixed cost, a process start and its warm-up, is seconds), at most
    ``MAX_PAIRS``; alternated ``chunk`` steps at a time."""
    pairs = max(steps, min(MAX_PAIRS, math.ceil(round_s / max(eager_step_s, 1e-9))))
    return pairs, max(1, min(pairs, int(CHUNK_S / max(eager_step_s, 1e-9))))


def interleave(backend: Peer, eager: Peer, pairs: int, rng: random.Random, timeout_s: float, chunk: int = 1,
               between: Callable[[], None] = unsupervised) -> tuple[list[float], list[float]]:
    """``pairs`` step pairs, ``chunk`` steps of each peer at a time in a random order: the
    backend's seconds and eager's, pair by pair (pair ``i`` is ``(backend[i], eager[i])``).
    ``between`` runs after each chunk of steps, when neither peer is stepping (the parent's
    supervision: it raises ``Stopped`` to end the pairs)."""
    mine: list[float] = []
    theirs: list[float] = []
    while len(mine) < pairs:
        n = min(chunk, pairs - len(mine))
        for peer in ((backend, eager) if rng.random() < 0.5 else (eager, backend)):
            (mine if peer is backend else theirs).extend(peer.steps(n, timeout_s))
            between()
    return mine, theirs
