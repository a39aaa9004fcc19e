"""One cell: a backend on a device, measured inside its own child process.

Order matters. Timing and memory are read first, from a cold start (fresh
process, fresh compile cache). The state after the first step (gradients,
buffers) and after the parity step (a warm-up step after the backend's own
warm-up: every loss so far, gradients, weights, buffers) is written to the
cell's directory, untimed and before the measured steps, so the parity check
judges the steady-state step the backend really runs, and its reference
models, built after every figure is taken, can't inflate the memory figures.

Phases and what a failure in each means:
  compile     backend.compile (+ compile_step)         -> fail_compile
  first_step  first step, training or inference (lazy compilers
              compile here)                            -> fail_compile if the
                                                          compiler raised, else fail_run
  warmup, steps                                        -> fail_run
  non-finite loss (inference: output) in any step      -> fail_accuracy
  allocated   two more steps under torch.profiler, on   -> a note only: no allocated peak,
              the CPU, round 1 (memory.allocated_peak_mb)  the RSS ratio stands in
  loop        the run's loop events (loop.py), round 1  -> the row's loop_rehearsal.error only:
              only, not under DDP                          the step's figures stand
  parity      steps 1 and N vs float64 eager, every
              step's loss vs fp32 eager (parity.py)    -> fail_accuracy

Every step trains on the next batch of the run's pool (``Job.batches``), made before the
first clock starts; ``compile`` gets an example batch of its own.
An out-of-memory error in any phase is ``oom``.
"""
from __future__ import annotations

import functools
import inspect
import math
import os
import sys
import time
import traceback
from typing import Any, Callable, Optional

import torch

from ...backends import base
from ...workloads.factory import WorkloadError
from ..config import RunConfig
from ..records import CacheArtifacts, CellRecord, Status
from . import rank as ddp
from . import reference
from .diagnostics import DynamoWatch
from .loop import rehearse
from .memory import DescendantsPeak, PhasePeaks, allocated_peak_mb, current_rss_mb, per_step_usage, process_usage, use_malloc
from .parity import compare_with_reference, output_snapshot, parity_step, snapshot, weights_snapshot
from .rank import Rank
from .roofline import roofline
from .serve import serve as serve_steps
from .timing import timed, timed_steps
from .training import EXAMPLE, Job, OutputLog, make_inference_step, make_train_step, step_seed, trained_parameters, with_scheduler

ERROR_TAIL_LINES = 15

#: ``on_phase(name, done, total)``: progress for the parent, never called inside a timed region.
PhaseReporter = Callable[[str, int, int], None]


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc).lower()
    return "out of memory" in text or "bad_alloc" in text or "can't allocate memory" in text


def _is_compiler_error(exc: BaseException) -> bool:
    return any(type(e).__module__.startswith(("torch._dynamo", "torch._inductor")) for e in _chain(exc))


def _chain(exc: Optional[BaseException]):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def classify(exc: BaseException, phase: str) -> Status:
    if _is_oom(exc):
        return Status.OOM
    if isinstance(exc, WorkloadError):  # the workload's own failure, whatever the phase
        return Status.FAIL_RUN
    if phase == "compile" or (phase == "first_step" and _is_compiler_error(exc)):
        return Status.FAIL_COMPILE
    return Status.FAIL_RUN


def fail(record: CellRecord, exc: BaseException, phase: str, status: Optional[Status] = None) -> CellRecord:
    """Mark ``record`` failed in ``phase`` by ``exc``: its status, a one-line error, the traceback's tail."""
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    summary = traceback.format_exception_only(type(exc), exc)[-1].strip()
    record.status = status or classify(exc, phase)
    # A workload's failure says so itself, whichever phase met it (make_batch runs in "compile").
    record.error = str(exc) if isinstance(exc, WorkloadError) else f"{phase}: {summary}"
    record.error_tail = "\n".join(lines[-ERROR_TAIL_LINES:])
    return record


def _prepare(backend: Any, job: Job, device: torch.device, rank: Optional[Rank] = None):
    """Build the model and batch, compile with the backend (timed), then the optimizer and step.

    The optimizer comes after the backend so it is built over the parameters
    the compiled module trains, already on their device (an optimizer built before can hold the wrong ones).
    Under DDP the compiled module is wrapped before the optimizer is built
    (the wrap is timed with the compile: it is part of the one-off cost).
    In inference the model is in eval mode, ``compile`` runs under ``no_grad`` and the step is
    one forward (no optimizer).
    Returns (model, forward, step, compile_s).
    """
    model = job.build_model(device)
    x = base.prepare_input(backend, job.forward_input(EXAMPLE, device, *((rank.rank, rank.world) if rank else ())))

    def compile_and_wrap():
        if job.inference:  # tracing, freezing and exporting want grad off (docs/inference.md)
            with torch.no_grad():
                return backend.compile(model, x, device)
        forward = backend.compile(model, x, device)
        return ddp.wrap(forward, device) if rank else forward

    # A compile may run the model on the example (tracing runs it several times): in train mode
    # that moves BatchNorm's running statistics. Those runs are not training, so the buffers are
    # put back (in place: a traced module shares them) after the timed call.
    buffers = [b.detach().clone() for b in model.buffers()]
    forward, compile_s = timed(compile_and_wrap, device)
    with torch.no_grad():
        for b, before in zip(model.buffers(), buffers):
            b.copy_(before)
    if job.inference:
        return model, forward, make_inference_step(forward, lambda: base.inference_context(backend)), compile_s
    params = trained_parameters(forward, model)
    optimizer = _optimizer(backend, job, params)
    step = _train_step(backend, job, forward, optimizer, params)
    compile_step = base.step_compiler(backend)
    if compile_step is not None:
        step, step_s = timed(lambda: compile_step(step, x, device), device)
        compile_s += step_s
    return model, forward, with_scheduler(step, job.make_scheduler(optimizer)), compile_s


def _optimizer(backend: Any, job: Job, params: list) -> torch.optim.Optimizer:
    """The workload's optimizer with the backend's change (``adapt_optimizer``); a backend of
    the older contract builds its own Adam (``make_optimizer``) where the recipe keeps Adam."""
    adapt, legacy = base.optimizer_adapter(backend), base.optimizer_maker(backend)
    if adapt is not None:
        return adapt(job.make_optimizer(params))
    if legacy is None:
        return job.make_optimizer(params)
    if job.recipe.optimizer is not None:
        raise base.NotApplicable("it builds its own Adam (make_optimizer), and the workload trains with an "
                                 "optimizer of its own (the backend needs adapt_optimizer)")
    return legacy(params, job.config.lr)


def _train_step(backend: Any, job: Job, forward: Callable, optimizer: torch.optim.Optimizer, params: list) -> Callable:
    """The harness's train step, or the backend's own (``make_train_step``) given the recipe
    where it takes it; one that can't take it is not applicable to a recipe that clips or
    accumulates (it would silently skip them)."""
    own = base.step_maker(backend)
    if own is None:
        return make_train_step(forward, optimizer, job.loss, job.recipe, params)
    taken = inspect.signature(own).parameters
    if "recipe" in taken and "params" in taken:
        return own(forward, optimizer, job.loss, recipe=job.recipe, params=params)
    if job.recipe.clip_grad_norm is not None or job.recipe.accumulation_steps > 1:
        raise base.NotApplicable("its own train step (make_train_step) takes no recipe, and this workload's clips "
                                 "gradients or accumulates micro-batches")
    return own(forward, optimizer, job.loss)


def _no_phase(name: str, done: int, total: int) -> None:
    pass


def _no_tick(i: int) -> None:
    pass


def measure(backend: Any, workload: Any, config: RunConfig, device_name: str,
            checkpoint: Callable[[CellRecord], None], cell_dir: str, run_dir: Optional[str] = None,
            on_phase: PhaseReporter = _no_phase, rank: Optional[Rank] = None, judge: bool = True,
            serve: Optional[str] = None, artifacts: Optional[CacheArtifacts] = None) -> CellRecord:
    """Measure ``backend`` training ``workload`` on ``device_name``; return the child's record.

    ``checkpoint`` is called with the record once timing and memory are
    known, so they survive a crash or timeout in the parity check.
    ``cell_dir`` is this cell's private directory (the first-step snapshot);
    ``run_dir`` is shared by the run's cells (per-device reference and roofline).

    ``judge`` False (a later round of ``--rounds``) takes time and memory only: no parity
    snapshots, check or roofline (the first round's stand for the row).

    ``artifacts``: write the cell's portable compile cache after its steps, or load one before
    its compile (``records.CacheArtifacts``; the load counts in ``compile_s``).

    ``serve`` (a socket path): after the warm-up the measured steps are the ones the parent asks
    for through it (``serve.py``), interleaved with an eager peer's, instead of ``config.steps``
    in a row; the steady-state memory and per-step CPU figures are over those steps.

    Under torchrun ``rank`` says where this process sits (see ``rank.py``):
    the returned record is then the node's combined row on a reporting rank;
    a non-ok status on any rank must end the job (the child exits non-zero).
    """
    job = Job(workload, config)
    device = torch.device(ddp.rank_device(device_name, rank) if rank else device_name)
    torch.set_num_threads(config.resolved_threads)
    use_malloc(config.malloc)  # before the model: the policy governs blocks allocated after it
    record = CellRecord(threads=torch.get_num_threads(), rss_baseline_mb=current_rss_mb())
    cuda = device.type == "cuda"
    cuda_index = None
    if cuda:
        torch.cuda.set_device(device)
        cuda_index = torch.cuda.current_device()
    judged = parity_step(base.min_warmup(backend))
    # The parity step is always a warm-up step (the eager process a cell is paired with runs as
    # many: ``serve``'s ready message says how many). A later round's cell has a full compile
    # cache, but still takes the whole warm-up: with one
    # step, the first step pair of a round leaned 2-4 % toward the process warm for longer
    # (measured over the committed runs' rounds).
    warmup = max(config.warmup, judged - 1) if judge else max(base.min_warmup(backend), config.warmup)
    # Under DDP only global rank 0 writes them (its parity).
    # In training also the weights after step N - 1: the row's own last update is judged.
    snapshot_paths = [os.path.join(cell_dir, f"parity-step{k}.pt")
                      for k in ((1, judged) if job.inference else (1, judged - 1, judged))]
    # Every step's loss; in inference each forward's largest magnitude, and the last output.
    losses: list[Any] = OutputLog() if job.inference else []

    def judged_state(model, forward, losses) -> dict[str, torch.Tensor]:
        if job.inference:
            return output_snapshot(model, forward, losses.last, len(losses))
        return snapshot(model, forward, losses)

    # The reference (computed before the cells) says whether the step draws random numbers; its
    # failure is the workload's, reported in the parity phase after timing, as a check's would be.
    reference_error: Optional[Exception] = None
    random = False
    if run_dir is not None:
        try:
            random = reference.Meta.load(run_dir, str(device)).random
        except (WorkloadError, OSError) as exc:
            reference_error = exc
    if random:  # inductor draws eager's random numbers (docs/parity.md: randomness)
        import torch._inductor.config as inductor_config

        inductor_config.fallback_random = True

    pool: list[tuple[Any, Any]] = []  # the run's batches (training.Job.batches), made in the compile phase
    watch = DynamoWatch().start()
    workers = DescendantsPeak().start()  # compile workers are processes of their own
    phase = "compile"
    on_phase(phase, 0, 1)
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        if rank:
            pg_backend = ddp.init(device, config.timeout_s)
        pool.extend((base.prepare_input(backend, x), y)
                    for x, y in job.batches(device, *((rank.rank, rank.world) if rank else ())))

        def inputs(k: int) -> tuple[Any, Any]:
            """Step ``k``'s batch (steps count from 1), its RNG seeded where the step draws one."""
            if random:
                torch.manual_seed(step_seed(config.seed, k))
            return pool[(k - 1) % len(pool)]

        loaded_s = 0.0
        if artifacts is not None and artifacts.load:  # what a start from a shipped cache pays first
            record.artifacts_mb, loaded_s = load_artifacts(artifacts.path, device)
            record.artifacts_load_s = loaded_s
        model, forward, step, compile_s = _prepare(backend, job, device, rank)
        record.compile_s = loaded_s + compile_s
        phase = "first_step"
        on_phase(phase, 0, 1)
        loss, record.first_step_s = timed(functools.partial(step, *inputs(1)), device)
        losses.append(loss)
        peaks = PhasePeaks(device if cuda else None)
        record.peak_rss_first_step_mb, record.cuda_peak_allocated_first_step_mb, \
            record.cuda_peak_reserved_first_step_mb = peaks.take()
        # Between the memory phases: torch.save streams the tensors without copies on the
        # CPU, and the peaks are reset after it (so are the collectives that check DDP's ranks).
        if rank:
            spread = ddp.weight_spread(trained_parameters(forward, model))
        if judge and (rank is None or rank.rank == 0):
            torch.save(judged_state(model, forward, losses), snapshot_paths[0])
        peaks.reset()
        phase = "warmup"
        on_phase(phase, 0, warmup)

        def after_warmup_step(i: int, model=model, forward=forward, losses=losses) -> None:
            on_phase("warmup", i, warmup)
            if judge and 1 + i == judged - 1 and not job.inference and (rank is None or rank.rank == 0):
                torch.save(weights_snapshot(model, forward, judged - 1), snapshot_paths[1])
            if judge and 1 + i == judged:  # the parity step's state (untimed; the losses are the ranks' mean under DDP)
                judged_losses = ddp.mean_losses(losses) if rank else losses
                if rank is None or rank.rank == 0:
                    torch.save(judged_state(model, forward, judged_losses), snapshot_paths[-1])

        record.warmup_s = timed_steps(step, inputs, 2, warmup, device, losses, after_warmup_step)
        # Warm-up's peaks are one-off (CUDA-graph recording, recompiles, the parity snapshot):
        # the steady state is the measured steps alone.
        record.peak_rss_warmup_mb, record.cuda_peak_allocated_warmup_mb, \
            record.cuda_peak_reserved_warmup_mb = peaks.take()
        record.workers_peak_rss_mb = workers.stop()  # sampled until here; idle from here on
        steady_peak_known = peaks.reset()
        phase = "steps"
        on_phase(phase, 0, config.steps)
        usage = process_usage()
        if serve is None:
            record.step_samples = timed_steps(step, inputs, 2 + warmup, config.steps, device, losses,
                                              lambda i: on_phase("steps", i, config.steps))
        else:  # one of a warm pair: the parent asks for steps, interleaved with its eager peer's
            served: list[float] = []

            def run_steps(n: int, first: int = 2 + warmup, step=step, inputs=inputs, losses=losses) -> list[float]:
                samples = timed_steps(step, inputs, first + len(served), n, device, losses, _no_tick)
                served.extend(samples)
                on_phase("steps", len(served), len(served))
                return samples

            serve_steps(serve, run_steps, warmup)
            del run_steps  # it holds the model, freed before the parity check
            if not served:
                raise RuntimeError("the parent asked for no step (its warm pair ended before it began)")
            record.step_samples = served
        record.cpu_user_s_per_step, record.cpu_sys_s_per_step, record.page_faults_per_step = \
            per_step_usage(usage, process_usage(), len(record.step_samples))
        steady, record.cuda_peak_allocated_steady_mb, record.cuda_peak_reserved_steady_mb = peaks.take()
        record.peak_rss_steady_mb = steady if steady_peak_known else None
        record.peak_rss_mb = max(v for v in (record.peak_rss_first_step_mb, record.peak_rss_warmup_mb, steady)
                                 if v is not None)
        if cuda:
            record.cuda_peak_allocated_mb = max(record.cuda_peak_allocated_first_step_mb or 0,
                                                record.cuda_peak_allocated_warmup_mb or 0,
                                                record.cuda_peak_allocated_steady_mb or 0)
            record.cuda_peak_reserved_mb = max(record.cuda_peak_reserved_first_step_mb or 0,
                                               record.cuda_peak_reserved_warmup_mb or 0,
                                               record.cuda_peak_reserved_steady_mb or 0)
    except base.NotApplicable as exc:
        workers.stop()
        record.status, record.error = Status.SKIPPED, str(exc)
        return record
    except Exception as exc:
        workers.stop()
        record.dynamo = watch.report(cuda_index)
        return fail(record, exc, phase)
    record.dynamo = watch.report(cuda_index)
    record.compile_threads = compile_threads() if record.dynamo is not None else None
    if judge and not cuda and rank is None:
        # Two more steps, untimed, after every step figure and the diagnostics (what compiles the
        # profiler's presence might cause counts nowhere): the allocated peak memory_ratio compares.
        def another(after=iter(range(2 + warmup + len(record.step_samples), sys.maxsize)), step=step,
                    inputs=inputs) -> Any:
            return step(*inputs(next(after)))

        try:
            record.allocated_peak_steady_mb = allocated_peak_mb(another)
        except Exception as exc:  # the profiler's, most likely: the steps ran before; the RSS ratio stands in
            record.notes.append(f"no allocated peak: {type(exc).__name__}: {exc}")
        del another  # it holds the model, freed before the parity check
    if judge and rank is None:  # after every step figure and the diagnostics: the loop's events
        on_phase("loop", 0, 1)
        record.loop_rehearsal = rehearse(
            config.workload.loop, config.batch_size, job.micro_batches, job.inference, model, forward, step,
            inputs, job.loss, device, watch.compiles if record.dynamo is not None else lambda: None)
    if artifacts is not None and not artifacts.load and (rank is None or rank.rank == 0):
        # After the loop's compiles: what a user would ship. One rank writes it.
        save_artifacts(artifacts.path)
    if cuda and base.own_allocator(backend):
        record.cuda_memory_incomparable = (f"{backend.name} keeps its device memory in an allocator of its own, "
                                           "which torch's CUDA peaks don't see")
        record.notes.append(f"CUDA memory not comparable: {record.cuda_memory_incomparable}")

    values = torch.stack([loss.float() for loss in losses]).tolist()
    bad = [i for i, value in enumerate(values) if not math.isfinite(value)]
    if bad:
        record.status = Status.FAIL_ACCURACY
        what = "output" if job.inference else "loss"
        record.error = f"non-finite {what} at step {bad[0] + 1} of {len(losses)}"
        return record
    if rank:  # the trajectory the reference follows: the global batch's loss (every rank takes part)
        values = [float(v) for v in ddp.mean_losses(losses)]
    # Free the measured model before loading the reference; under DDP also before the process
    # group goes (``ddp.finish``): a DDP module freed after it hangs in gloo's destructor. The
    # warm-up hook and the batches' closure hold the model and batches too.
    pool.clear()
    del model, forward, step, inputs, losses, after_warmup_step
    if rank:
        per_rank = ddp.gather(record)
        ddp.finish()  # no collective after this: other ranks may leave
        if not rank.reports:
            return record
        record = ddp.combine(per_rank, rank, pg_backend, config.batch_size, spread)
        if rank.rank != 0:
            # torchrun's c10d rendezvous numbers ranks by arrival, not by --node-rank.
            record.notes = [f"parity is checked on the node that holds global rank 0 (its report has the verdict); "
                            f"this node's ranks start at {rank.rank}"]
            return record
    checkpoint(record)
    if not judge:
        return record

    phase = "parity"
    on_phase(phase, 0, 1)
    try:
        start = time.perf_counter()
        if run_dir is None:
            raise RuntimeError("a judged cell needs the run's directory, where its parity reference is")
        if reference_error is not None:
            raise reference_error
        expected = reference.load(run_dir, device)
        got = {key: value for path in snapshot_paths
               for key, value in torch.load(path, map_location=device, weights_only=True, mmap=True).items()}
        parity = compare_with_reference(got, expected, base.parity_rtol(backend), judged, base.precision(backend),
                                        values)
        parity.check_s = time.perf_counter() - start
        if record.distributed is not None and not record.distributed.ranks_identical:
            parity.passed = False
            parity.detail = (f"ranks hold different weights after the first step (max |difference| "
                             f"{record.distributed.max_rank_weight_diff:.3g}); " + (parity.detail or ""))
        del got, expected
        record.gflop_per_step, record.peak_gflops, record.peak_precision = roofline(
            job, device, _shared(run_dir, "roofline", device, ".json"), base.precision(backend))
    except Exception as exc:
        return fail(record, exc, phase)
    record.parity = parity
    if not parity.passed:
        record.status = Status.FAIL_ACCURACY
        record.error = f"parity: {parity.detail}"
    return record


def save_artifacts(path: str) -> None:
    """Write what this process compiled as a portable cache (``torch.compiler.save_cache_artifacts``)
    to ``path``; nothing where nothing was compiled or this torch has no such API."""
    save = getattr(torch.compiler, "save_cache_artifacts", None)
    saved = save() if save is not None and "torch._dynamo" in sys.modules else None
    if saved is not None and saved[0]:
        with open(path, "wb") as f:
            f.write(saved[0])


def load_artifacts(path: str, device: torch.device) -> tuple[float, float]:
    """Load the portable cache at ``path`` into this process's (empty) compile cache; its size in
    MB and the seconds loading it took."""
    with open(path, "rb") as f:
        data = f.read()
    _, seconds = timed(lambda: torch.compiler.load_cache_artifacts(data), device)
    return len(data) / 2**20, seconds


def compile_threads() -> Optional[int]:
    """Inductor's compile workers in this process (1: compiles in-process), None without inductor."""
    if "torch._inductor.config" not in sys.modules:
        return None
    return int(sys.modules["torch._inductor.config"].compile_threads)


def _shared(run_dir: Optional[str], kind: str, device: torch.device, suffix: str) -> Optional[str]:
    if run_dir is None:
        return None
    return os.path.join(run_dir, f"{kind}-{str(device).replace(':', '-')}{suffix}")
