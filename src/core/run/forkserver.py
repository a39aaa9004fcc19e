"""A fork server: each cell's child forked from a process that has imported torch and its compilers.

Importing torch and torch._dynamo costs ~5 s per process on the 2-core
reference machine, more than the rest of a small cell, and inductor's compiler
another ~1.2 s that no row's compile_s should hold (``cell.main.IMPORTED_BEFORE_TIMING``).
The server (``python -m cnncompare.core.run.forkserver``) imports them once, then does
nothing else: no tensor, no thread pool, no CUDA, no compilation. A child
forked from it is as clean as a fresh interpreter; ``cell.main.forked_main``
gives it its own session, environment, directory and log. The server dies
with the run's process and each cell with the server (``PR_SET_PDEATHSIG``),
so a run killed with SIGKILL leaves nothing training.

Why not ``multiprocessing``'s forkserver: it re-imports the parent's main
module in every child (its "safe importing of main" rule), so a script
without an ``if __name__ == "__main__"`` guard would run again per cell.

torch reads most of its compile settings from the environment once, when their config module
is imported (``TORCHINDUCTOR_FX_GRAPH_CACHE``, ``TORCH_COMPILE_DEBUG``, ...): in the server,
not in the child. So the server is started with the cell's values of those variables
(``import_time_env``), and started again when a cell asks for different ones; without that, a
cell's ``TORCHINDUCTOR_FX_GRAPH_CACHE=0`` would be silently ignored and its "cold" compile
could load a graph an earlier cell compiled.

Protocol, one JSON object per line: the parent writes
``{"payload", "env", "workdir", "log"}`` on the server's stdin; the server
answers ``{"started": pid}`` and later ``{"exited": pid, "code": c}`` on its
stdout (``c`` negative for a signal, as ``subprocess`` says). EOF on stdin
(the parent is gone) ends the server.
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import Optional

from ..cell.main import IMPORTED_BEFORE_TIMING
from ..processes import PARENT_PID_ENV

#: Imported once in the server (not torch._inductor's compile workers: the child sets their count).
PRELOAD = (*IMPORTED_BEFORE_TIMING, "cnncompare.core.cell.measure", "cnncompare.core.cell.main")

#: Environment variables torch (and triton) may read when a module is imported.
IMPORT_TIME_PREFIXES = ("TORCH", "PYTORCH", "TRITON", "INDUCTOR")
#: Those read when used, which a forked child's own environment decides: the cell's compile cache
#: (``cache_dir_utils.cache_dir`` reads it per call) and the compile workers' count, which
#: ``cell.main.forked_main`` decides again in the child.
READ_WHEN_USED = frozenset({"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_COMPILE_THREADS"})


def import_time_env(env: dict) -> tuple[tuple[str, str], ...]:
    """The variables of ``env`` that torch may have read at import: the server's imports must
    have seen the same values as the cell's child would."""
    return tuple(sorted((k, v) for k, v in env.items()
                        if k.startswith(IMPORT_TIME_PREFIXES) and k not in READ_WHEN_USED))


def _exit_code(status: int) -> int:
    return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)


def serve() -> None:
    import importlib

    from ..cell.main import forked_main
    from ..processes import die_with_parent

    die_with_parent(int(os.environ[PARENT_PID_ENV]))
    server = os.getpid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    for name in PRELOAD:
        importlib.import_module(name)

    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    stdin = sys.stdin.fileno()
    buffer, running = b"", set[int]()
    while True:
        readable, _, _ = select.select([stdin], [], [], 0.05)
        while running:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            running.discard(pid)
            out.write(json.dumps({"exited": pid, "code": _exit_code(status)}) + "\n")
            out.flush()
        if not readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            return
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                _run_child(stdin, forked_main, request, server)
            running.add(pid)
            out.write(json.dumps({"started": pid}) + "\n")
            out.flush()


def _run_child(stdin: int, forked_main, request: dict, server: int) -> None:
    """In the forked child: run the cell and leave with its exit code, never returning into
    the server's loop."""
    code = 70
    try:
        os.close(stdin)
        code = forked_main(request["payload"], request["env"], request["workdir"], request["log"], server)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code)


class ForkServer:
    """The parent's handle on one server, started on first use and kept for this process's later
    runs (a library user, or the test suite, running job after job pays its start once: torch
    and its compilers imported, ~3 s here) until ``renew`` replaces it (each round, by default:
    ``--fork-server``). It ends when the parent closes it, when the parent exits (its stdin
    closes), or when the parent dies (``die_with_parent``)."""

    def __init__(self) -> None:
        self._proc: Optional[subprocess.Popen] = None
        self._buffer = b""
        self.exit_codes: dict[int, int] = {}
        self._closes_at_exit = False
        self._imported_with: tuple[tuple[str, str], ...] = ()
        self._started: list[int] = []  # by the running server

    @property
    def pid(self) -> Optional[int]:
        """The running server's pid, None when none runs."""
        return self._proc.pid if self._proc is not None and self._proc.poll() is None else None

    def _start(self, imported_with: tuple[tuple[str, str], ...]) -> subprocess.Popen:
        # Its own session: a Ctrl-C in the terminal is the parent's, and killing a cell's
        # process group never reaches the server. Its imports see the cell's import-time
        # variables, and none of ours that the cell lacks.
        env = {k: v for k, v in os.environ.items() if not import_time_env({k: v})}
        env.update(imported_with)
        env[PARENT_PID_ENV] = str(os.getpid())
        self._imported_with = imported_with
        proc = subprocess.Popen([sys.executable, "-m", "cnncompare.core.run.forkserver"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, start_new_session=True, env=env)
        self._proc, self._buffer = proc, b""
        if not self._closes_at_exit:
            import atexit

            atexit.register(self.close)
            self._closes_at_exit = True
        message = self._read_message(block=True)
        if message is None or "ready" not in message:
            raise RuntimeError("the cnncompare fork server did not start (run 'python -m cnncompare.core.run.forkserver' "
                               "to see why)")
        return proc

    def _read_message(self, block: bool) -> Optional[dict]:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buffer:
            if not block and not select.select([fd], [], [], 0)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def renew(self, env: dict) -> float:
        """Replace the server with a new one whose imports saw ``env``'s import-time variables; the
        seconds its start took (the imports). The children forked from then on are copies of a new
        process image: a new address-space layout (ASLR: where the libraries, the heap and the
        stacks lie), where every child of one server has the same. Call it between rounds: the old
        server's children die with it."""
        self.close()
        start = time.perf_counter()
        self._start(import_time_env(env))
        return time.perf_counter() - start

    def start_child(self, payload: str, env: dict, workdir: str, log: str) -> int:
        """Fork a cell's child running ``forked_main`` with ``env``; its pid. A server whose
        imports saw other values of ``env``'s import-time variables is replaced first, which
        needs its children to have ended (they die with it)."""
        wanted = import_time_env(env)
        if self.pid is not None and wanted != self._imported_with:
            running = [pid for pid in self._started if self.poll(pid) is None]
            if running:
                raise RuntimeError(f"a cell needs torch imported under other settings ({dict(wanted)}) while "
                                   f"cells {running} run under {dict(self._imported_with)}")
            self.close()
        if self.pid is None:
            self._start(wanted)
        assert self._proc is not None and self._proc.stdin is not None
        request = {"payload": payload, "env": env, "workdir": workdir, "log": log}
        self._proc.stdin.write((json.dumps(request) + "\n").encode())
        self._proc.stdin.flush()
        while True:
            message = self._read_message(block=True)
            if message is None:
                raise RuntimeError("the cnncompare fork server died")
            if "started" in message:
                self._started.append(message["started"])
                return message["started"]
            self._record(message)

    def _record(self, message: dict) -> None:
        if "exited" in message:
            self.exit_codes[message["exited"]] = message["code"]

    def poll(self, pid: int) -> Optional[int]:
        """The child's exit code once the server has reaped it, else None."""
        while pid not in self.exit_codes:
            message = self._read_message(block=False)
            if message is None:
                if self._proc is not None and self._proc.poll() is not None and pid not in self.exit_codes:
                    return -signal.SIGKILL  # the server died and took the child's status with it
                return None
            self._record(message)
        return self.exit_codes[pid]

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc, self._started = None, []


if __name__ == "__main__":
    serve()
