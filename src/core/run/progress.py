"""What the user sees while cells run: a live bar on a terminal, plain lines in a pipe or CI.

Children report their phase over a pipe (compile, first step, warm-up i/n,
steps i/n, parity); both displays show it, so a long cold compile never looks
like a hang.
"""
from __future__ import annotations

import sys
import time
from typing import IO, Any, Optional

#: Plain mode prints the current phase this often while nothing else is printed.
HEARTBEAT_S = 20.0

PHASE_LABELS = {
    "compile": "compile",
    "first_step": "first step (lazy compilers compile here)",
    "warmup": "warm-up",
    "steps": "measured steps",
    "loop": "the loop's events (ragged batch, evaluation)",
    "parity": "parity check",
}


def phase_label(name: str) -> str:
    """'steps' -> 'measured steps'; under --nproc, 'single-process-steps' -> 'single process: measured steps'."""
    prefix = "single-process-"
    if name.startswith(prefix):
        return "single process: " + phase_label(name[len(prefix):])
    return PHASE_LABELS.get(name, name)


class Progress:
    """Receives the orchestrator's events; this base class shows nothing (library use, tests)."""

    def start_run(self, total: int) -> None: ...
    def start_cell(self, index: int, total: int, label: str) -> None: ...
    def phase(self, name: str, done: int, total: int) -> None: ...
    def end_cell(self, label: str, summary: str) -> None: ...
    def end_run(self) -> None: ...
    def message(self, text: str) -> None: ...


class LineProgress(Progress):
    """One line per event, flushed: readable in CI logs and pipes."""

    def __init__(self, stream: IO[str] = sys.stderr):
        self.stream = stream
        self._label = ""
        self._phase: Optional[str] = None
        self._phase_start = self._last_line = time.monotonic()

    def _print(self, text: str) -> None:
        print(text, file=self.stream, flush=True)
        self._last_line = time.monotonic()

    def start_cell(self, index: int, total: int, label: str) -> None:
        self._label, self._phase = f"[{index}/{total}] {label}", None
        self._print(f"{self._label} ...")

    def phase(self, name: str, done: int, total: int) -> None:
        # Quiet for quick phases; a line every HEARTBEAT_S while one is slow.
        now = time.monotonic()
        if name != self._phase:
            self._phase, self._phase_start = name, now
        if now - self._last_line >= HEARTBEAT_S:
            count = f" {done}/{total}," if total > 1 else ""
            self._print(f"{self._label}: still in {phase_label(name)},{count} {now - self._phase_start:.0f} s")

    def end_cell(self, label: str, summary: str) -> None:
        self._print(f"{self._label}: {summary}")

    def message(self, text: str) -> None:
        self._print(text)


class BarProgress(Progress):
    """A tqdm bar over the cells, its text the current cell, phase, step count and time in phase."""

    def __init__(self, stream: IO[str] = sys.stderr):
        self.stream = stream
        self.bar: Any = None
        self._phase_start = time.monotonic()
        self._phase: Optional[str] = None

    def start_run(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, file=self.stream, unit="cell", dynamic_ncols=True,
                        bar_format="{l_bar}{bar:20}| {n_fmt}/{total_fmt} cells [{elapsed}<{remaining}] {postfix}")

    def start_cell(self, index: int, total: int, label: str) -> None:
        if self.bar.total != total:  # a cell that failed or was skipped runs no later rounds
            self.bar.total = total
            self.bar.refresh()
        self.bar.set_description_str(label)
        self._phase = None

    def phase(self, name: str, done: int, total: int) -> None:
        now = time.monotonic()
        if name != self._phase:
            self._phase, self._phase_start = name, now
        count = f" {done}/{total}" if total > 1 else ""
        self.bar.set_postfix_str(f"{phase_label(name)}{count}, {now - self._phase_start:.0f} s")

    def end_cell(self, label: str, summary: str) -> None:
        self.bar.write(f"{label}: {summary}", file=self.stream)
        self.bar.update(1)

    def end_run(self) -> None:
        if self.bar is not None:
            self.bar.close()

    def message(self, text: str) -> None:
        (self.bar.write if self.bar is not None else print)(text, file=self.stream)


def for_stream(stream: IO[str] = sys.stderr) -> Progress:
    return BarProgress(stream) if stream.isatty() else LineProgress(stream)
