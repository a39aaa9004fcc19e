"""The loop around the step: each distinct event of the run's training loop met in the cell.

A repeated step hides what a user's loop pays: the recompile on an epoch's last, smaller
batch, on switching to evaluation and back, and a graph made dynamic by that batch that every
later step then runs. After the measured steps (so none of the step's figures, memory peaks or
diagnostics hold any of it) the cell meets each event the run's loop has (``config.LoopSpec``;
``records.LOOP_EVENTS``) once, then ``REPEATS`` more times, timing each and counting the
compiles dynamo starts. The parent projects the loop's time from them
(``stats.figures.loop_figures``); nothing here is a projection.
"""
from __future__ import annotations

import statistics
import traceback
from typing import Any, Callable, Optional

import torch

from ..config import LoopSpec
from ..records import LoopEvent, LoopRehearsal
from .timing import timed

#: Later times of each event after its first (``steady_s`` and ``ratio`` are their medians).
REPEATS = 3


def _compiled(time: tuple[float, Optional[int]]) -> bool:
    """Whether dynamo compiled during this time (False where it never ran)."""
    return bool(time[1])


def _set_mode(model: torch.nn.Module, forward: Any, training: bool) -> None:
    """Train or eval mode, on the model and on the backend's module where it is another one."""
    model.train(training)
    if isinstance(forward, torch.nn.Module) and forward is not model:
        forward.train(training)


def rehearse(loop: LoopSpec, batch_size: int, micro_batches: int, inference: bool, model: torch.nn.Module,
             forward: Any, step: Callable, batch: Callable[[int], tuple[Any, Any]], loss: Callable,
             device: torch.device, compiles: Callable[[], Optional[int]]) -> LoopRehearsal:
    """Meet ``loop``'s events with the cell's trained ``model``, the backend's ``forward`` and
    ``step`` (the step the cell measured, scheduler included), on ``batch(k)`` (the pool's k-th
    batch, ``micro_batches`` of ``batch_size`` samples). ``compiles()`` counts the compiles dynamo
    has started in the cell (None where it never ran). Never raises: an event that fails ends the
    rehearsal with its ``error``, the events before it kept. A loop of full steps alone has
    nothing to rehearse (the measured steps are its steps): no event.

    Each later time of an event is divided by a full step timed next to it (``LoopEvent.ratio``),
    so a ratio holds the event's cost, not the machine's drift between seconds. Evaluations come
    first, while full steps are still what the paired measurement timed. A full step in another
    state (``resume`` after an evaluation, ``after_ragged`` once a ragged batch has passed) costs
    a full step's (ratio 1) unless a compile came with that state (the resume's own first time;
    the first ragged step, after which a compiler may run a dynamic-shape graph): then its ratio
    is measured, the run of full steps after the first ragged one against those before it.
    Without a compile the same code runs, and what such a ratio measured on a 2-core machine was
    its drift over seconds (bench/loop_projection.py: an eager "after_ragged" at 1.49). A ragged
    step is compared with the full step right after it. The full steps timed before any ragged
    one are the ``full`` event."""
    rehearsal = LoopRehearsal()
    evaluates, ragged = bool(loop.eval_every) and not inference, loop.ragged(batch_size)
    if not (evaluates or ragged):
        return rehearsal
    counter = iter(range(1, 1 << 30))
    last = (loop.last_batch or batch_size) * micro_batches  # each micro-batch of the last step holds last_batch

    def full() -> Any:
        x, y = batch(next(counter))
        return step(x, y)

    def short() -> Any:
        x, y = batch(next(counter))
        return step(x[:last], y[:last])

    def evaluation() -> Any:
        x, y = batch(next(counter))
        x, y = x.chunk(micro_batches)[0], y.chunk(micro_batches)[0]
        with torch.no_grad():
            return loss(forward(x), y)

    def once(fn: Callable[[], Any]) -> tuple[float, Optional[int]]:
        before = compiles()
        _, seconds = timed(fn, device)
        after = compiles()
        return seconds, (after - before if before is not None and after is not None else None)

    def met(name: str, times: list[tuple[float, Optional[int]]], ratio: float) -> None:
        """The event from its first time and its later ones."""
        counts = [c for _, c in times[1:]]
        rehearsal.events.append(LoopEvent(
            name, times[0][0], statistics.median(s for s, _ in times[1:]), ratio, times[0][1],
            None if any(c is None for c in counts) else sum(c for c in counts if c is not None)))

    fulls: list[tuple[float, Optional[int]]] = []  # before any ragged batch
    name = "full"
    try:
        if evaluates:
            # Each evaluation switches to eval mode and back: its first batch and the first train
            # step after it are where a compiler recompiles; the later evaluations show whether it
            # does so every time. Each is compared with the full step just before it.
            evals, resumes, eval_ratios, resume_ratios = [], [], [], []
            for k in range(1 + REPEATS):
                name = "full"
                fulls.append(once(full))
                name = "eval"
                _set_mode(model, forward, False)
                evals.append(once(evaluation))
                _set_mode(model, forward, True)
                name = "resume"
                resumes.append(once(full))
                if k:
                    eval_ratios.append(evals[-1][0] / fulls[-1][0])
                    resume_ratios.append(resumes[-1][0] / fulls[-1][0])
            met("eval", evals, statistics.median(eval_ratios))
            met("resume", resumes, statistics.median(resume_ratios) if _compiled(resumes[0]) else 1.0)
        if ragged:
            name = "full"
            pre = [once(full) for _ in range(REPEATS)]
            fulls += pre
            name = "ragged"
            raggeds = [once(short)]
            # A run of full steps after it, as an epoch's steps run: the first once, then steady.
            name = "after_ragged"
            posts = [once(full) for _ in range(1 + REPEATS)]
            drift = statistics.median(s for s, _ in posts[1:]) / statistics.median(s for s, _ in pre)
            after = drift if _compiled(raggeds[0]) else 1.0
            ragged_ratios = []
            for _ in range(REPEATS):
                name = "ragged"
                raggeds.append(once(short))
                name = "full"
                neighbour, _ = once(full)
                ragged_ratios.append(raggeds[-1][0] / neighbour)
            met("ragged", raggeds, statistics.median(ragged_ratios) * after)
            if loop.epochs > 1:
                met("after_ragged", posts, after)
    except Exception as exc:
        _set_mode(model, forward, not inference)
        summary = traceback.format_exception_only(type(exc), exc)[-1].strip()
        rehearsal.error = f"{name}: {summary}"[:400]
    if len(fulls) > 1:
        met("full", fulls, 1.0)
        rehearsal.events.insert(0, rehearsal.events.pop())
    return rehearsal
