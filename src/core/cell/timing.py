"""Timing inside a cell: one synchronised region, or a loop of steps.

No backend times itself: every figure in the report is taken here.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import torch


def synchronize(device: torch.device) -> None:
    """Wait for queued device work; a no-op on the CPU (an unconditional cuda sync would crash there)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    """``fn()`` and its wall seconds, with the device synchronised on both sides."""
    synchronize(device)
    start = time.perf_counter()
    value = fn()
    synchronize(device)
    return value, time.perf_counter() - start


def timed_steps(step: Callable, inputs: Callable[[int], tuple[Any, Any]], first: int, n: int,
                device: torch.device, losses: list, tick: Callable[[int], None]) -> list[float]:
    """Per-step seconds of ``n`` calls of ``step(x, y)``, steps ``first`` .. ``first + n - 1``,
    each on ``inputs(k)`` (step k's batch, fetched outside the timed region), each loss appended
    to ``losses``.

    On CUDA, events bracket each step on the stream and one synchronize at the
    end collects them, so host-side timing can't miss queued work and no
    per-step sync distorts the loop. ``tick(i)`` runs between steps, outside
    the timed region."""
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for i, (start, end) in enumerate(events, 1):
            x, y = inputs(first + i - 1)
            start.record()
            out = step(x, y)
            end.record()
            losses.append(out)  # after the end event: an inference log's reduction is not the step's
            tick(i)
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1000.0 for start, end in events]
    samples = []
    for i in range(1, n + 1):
        x, y = inputs(first + i - 1)
        loss, seconds = timed(lambda: step(x, y), device)
        losses.append(loss)
        samples.append(seconds)
        tick(i)
    return samples
