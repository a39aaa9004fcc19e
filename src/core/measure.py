"""One cell: a backend on a device, measured inside its own child process.

Order matters. Timing and memory are read first, from a cold start (fresh
process, fresh compile cache). The state after the timed first step (loss,
gradients, updated weights) is written to the cell's directory between the
memory phases, so the parity check judges the very step that was timed and
its reference models, built after every figure is taken, can't inflate the
memory figures.

Phases and what a failure in each means:
  compile     backend.compile (+ compile_step)         -> fail_compile
  first_step  first training step (lazy compilers
              compile here)                            -> fail_compile if the
                                                          compiler raised, else fail_run
  warmup, steps                                        -> fail_run
  non-finite loss in any step                          -> fail_accuracy
  parity      the timed first step vs float64 eager   -> fail_accuracy
An out-of-memory error in any phase is ``oom``.
"""
from __future__ import annotations

import math
import os
import time
import traceback
from dataclasses import asdict
from typing import Any, Callable, Optional

import torch
from torch import nn

from cnncompare.backends import base
from cnncompare.core import distributed
from cnncompare.core.config import RunConfig
from cnncompare.core.distributed import Rank
from cnncompare.core.memory import current_rss_mb, peak_rss_mb, per_step_usage, process_usage, reset_peak_rss, use_malloc
from cnncompare.core.results import Parity, Status
from cnncompare.core.roofline import roofline
from cnncompare.core.workload import build_model, make_batch, make_optimizer, make_train_step, trained_parameters

#: A compared tensor passes when rmse(backend) <= PARITY_MULTIPLIER * rmse(fp32 eager) + tolerance,
#: both against float64 eager (the rule of PyTorch's own dynamo benchmark harness).
PARITY_MULTIPLIER = 3.0
ERROR_TAIL_LINES = 15
_MB = 1024 * 1024


def synchronize(device: torch.device) -> None:
    """Wait for queued device work; a no-op on the CPU (an unconditional cuda sync would crash there)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def _timed(fn: Callable[[], Any], device: torch.device) -> tuple[Any, float]:
    synchronize(device)
    start = time.perf_counter()
    value = fn()
    synchronize(device)
    return value, time.perf_counter() - start


def _timed_steps(step: Callable, x, y, n: int, device: torch.device, losses: list,
                 tick: Callable[[int], None]) -> list[float]:
    """Per-step seconds. On CUDA, events bracket each step on the stream and one
    synchronize at the end collects them, so host-side timing can't miss queued work
    and no per-step sync distorts the loop. ``tick(i)`` runs between steps, outside
    the timed region."""
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
        for i, (start, end) in enumerate(events, 1):
            start.record()
            losses.append(step(x, y))
            end.record()
            tick(i)
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) / 1000.0 for start, end in events]
    samples = []
    for i in range(1, n + 1):
        loss, seconds = _timed(lambda: step(x, y), device)
        losses.append(loss)
        samples.append(seconds)
        tick(i)
    return samples


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
    if phase == "compile" or (phase == "first_step" and _is_compiler_error(exc)):
        return Status.FAIL_COMPILE
    return Status.FAIL_RUN


def error_fields(exc: BaseException, phase: str) -> dict:
    lines = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)).rstrip().splitlines()
    summary = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return {"error": f"{phase}: {summary}", "error_tail": "\n".join(lines[-ERROR_TAIL_LINES:])}


def _prepare(backend: Any, config: RunConfig, device: torch.device, rank: Optional[Rank] = None):
    """Build the model and batch, compile with the backend (timed), then the optimizer and step.

    The optimizer comes after the backend so it is built over the parameters
    the compiled module trains, already on their device (the seed's pitfall).
    Under DDP the compiled module is wrapped before the optimizer is built
    (the wrap is timed with the compile: it is part of the one-off cost).
    Returns (model, forward, step, x, y, compile_s).
    """
    model = build_model(config, device)
    x, y = make_batch(config, device, *((rank.rank, rank.world) if rank else ()))
    x = base.prepare_input(backend, x)

    def compile_and_wrap():
        forward = backend.compile(model, x, device)
        return distributed.wrap(forward, device) if rank else forward

    forward, compile_s = _timed(compile_and_wrap, device)
    params = trained_parameters(forward, model)
    maker = base.optimizer_maker(backend)
    optimizer = maker(params, config.lr) if maker else make_optimizer(params, config)
    step = (base.step_maker(backend) or make_train_step)(forward, optimizer, nn.NLLLoss())
    compile_step = base.step_compiler(backend)
    if compile_step is not None:
        step, step_s = _timed(lambda: compile_step(step, x, device), device)
        compile_s += step_s
    return model, forward, step, x, y, compile_s


def _no_phase(name: str, done: int, total: int) -> None:
    pass


def run_cell(backend: Any, config: RunConfig, device_name: str, checkpoint: Callable[[dict], None],
             cell_dir: str, run_dir: Optional[str] = None,
             on_phase: Callable[[str, int, int], None] = _no_phase, rank: Optional[Rank] = None) -> dict:
    """Measure ``backend`` on ``device_name``; return the child's share of a CellResult as a dict.

    ``checkpoint`` is called with the figures once timing and memory are
    known, so they survive a crash or timeout in the parity check.
    ``cell_dir`` is this cell's private directory (the first-step snapshot);
    ``run_dir`` is shared by the run's cells (per-device reference and roofline).
    ``on_phase(name, done, total)`` reports progress, never inside a timed region.

    Under torchrun ``rank`` says where this process sits (see ``distributed``):
    the returned dict is then the node's combined row on a reporting rank; a
    non-ok status on any rank must end the job (the child exits non-zero).
    """
    from cnncompare.core.diagnostics import DynamoWatch

    device = torch.device(distributed.rank_device(device_name, rank) if rank else device_name)
    torch.set_num_threads(config.resolved_threads)
    use_malloc(config.malloc)  # before the model: the policy governs blocks allocated after it
    out: dict[str, Any] = {"status": Status.OK.value, "threads": torch.get_num_threads(), "warmup_s": []}
    cuda = device.type == "cuda"
    cuda_index = None
    if cuda:
        torch.cuda.set_device(device)
        cuda_index = torch.cuda.current_device()
    out["rss_baseline_mb"] = current_rss_mb()
    warmup = max(config.warmup, base.min_warmup(backend))
    snapshot = os.path.join(cell_dir, "first-step.pt")  # under DDP only global rank 0 writes it (its parity)
    losses: list[torch.Tensor] = []
    watch = DynamoWatch().start()
    phase = "compile"
    on_phase(phase, 0, 1)
    try:
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        if rank:
            pg_backend = distributed.init(device, config.timeout_s)
        model, forward, step, x, y, out["compile_s"] = _prepare(backend, config, device, rank)
        phase = "first_step"
        on_phase(phase, 0, 1)
        loss, out["first_step_s"] = _timed(lambda: step(x, y), device)
        losses.append(loss)
        out["peak_rss_first_step_mb"] = peak_rss_mb()
        if cuda:
            out["cuda_peak_allocated_first_step_mb"] = torch.cuda.max_memory_allocated(device) / _MB
            out["cuda_peak_reserved_first_step_mb"] = torch.cuda.max_memory_reserved(device) / _MB
        # Between the two memory phases: torch.save streams the tensors without copies on the
        # CPU, and both peaks are reset after it (so are the collectives that check DDP's ranks).
        if rank:
            loss = distributed.mean_loss(loss)
            spread = distributed.weight_spread(trained_parameters(forward, model))
        if rank is None or rank.rank == 0:
            torch.save(_step_state(model, forward, loss), snapshot)
        if cuda:
            torch.cuda.reset_peak_memory_stats(device)
        steady_peak_known = reset_peak_rss()
        phase = "warmup"
        on_phase(phase, 0, warmup)
        out["warmup_s"] = _timed_steps(step, x, y, warmup, device, losses, lambda i: on_phase("warmup", i, warmup))
        phase = "steps"
        on_phase(phase, 0, config.steps)
        usage = process_usage()
        out["step_samples"] = _timed_steps(step, x, y, config.steps, device, losses,
                                           lambda i: on_phase("steps", i, config.steps))
        out.update(per_step_usage(usage, process_usage(), config.steps))
        steady = peak_rss_mb()
        out["peak_rss_steady_mb"] = steady if steady_peak_known else None
        out["peak_rss_mb"] = max(out["peak_rss_first_step_mb"], steady)
        if cuda:
            out["cuda_peak_allocated_mb"] = max(out["cuda_peak_allocated_first_step_mb"], torch.cuda.max_memory_allocated(device) / _MB)
            out["cuda_peak_reserved_mb"] = max(out["cuda_peak_reserved_first_step_mb"], torch.cuda.max_memory_reserved(device) / _MB)
    except Exception as exc:
        out.update(status=classify(exc, phase).value, **error_fields(exc, phase))
        out["dynamo"] = watch.report(cuda_index)
        return out
    out["dynamo"] = watch.report(cuda_index)

    bad = [i for i, value in enumerate(torch.stack([l.float() for l in losses]).tolist()) if not math.isfinite(value)]
    if bad:
        out.update(status=Status.FAIL_ACCURACY.value, error=f"non-finite loss at step {bad[0] + 1} of {len(losses)}")
        return out
    del model, forward, step, x, y, losses  # free the measured model before building the references
    if rank:
        per_rank = distributed.gather(out)
        distributed.finish()  # no collective after this: other ranks may leave
        if not rank.reports:
            return out
        out = distributed.combine(per_rank, rank, pg_backend, config.batch_size)
        out["distributed"].update(ranks_identical=spread == 0.0, max_rank_weight_diff=spread)
        if rank.rank != 0:
            # torchrun's c10d rendezvous numbers ranks by arrival, not by --node-rank.
            out["notes"] = [f"parity is checked on the node that holds global rank 0 (its report has the verdict); "
                            f"this node's ranks start at {rank.rank}"]
            return out
    checkpoint(out)

    phase = "parity"
    on_phase(phase, 0, 1)
    try:
        shards = rank.world if rank else 1
        reference = reference_state(config, device, _shared(run_dir, f"reference-x{shards}", device, ".pt"), shards)
        got = torch.load(snapshot, map_location=device, weights_only=True, mmap=True)
        parity = compare_with_reference(got, reference, base.parity_tolerance(backend))
        if rank and not out["distributed"]["ranks_identical"]:
            parity.passed = False
            parity.detail = (f"ranks hold different weights after the first step "
                             f"(max |difference| {out['distributed']['max_rank_weight_diff']:.3g}); " + (parity.detail or ""))
        out.update(roofline(config, device, _shared(run_dir, "roofline", device, ".json")))
    except Exception as exc:
        out.update(status=classify(exc, phase).value, **error_fields(exc, phase))
        return out
    out["parity"] = asdict(parity)
    if not parity.passed:
        out.update(status=Status.FAIL_ACCURACY.value, error=f"parity: {parity.detail}")
    return out


def _shared(run_dir: Optional[str], kind: str, device: torch.device, suffix: str) -> Optional[str]:
    if run_dir is None:
        return None
    return os.path.join(run_dir, f"{kind}-{str(device).replace(':', '-')}{suffix}")


def _step_state(model: nn.Module, forward: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """Loss, every gradient and every updated weight after one step, by parameter name (no copies)."""
    names = [name for name, _ in model.named_parameters()]
    params = trained_parameters(forward, model)
    if len(names) != len(params):
        names = [f"param{i}" for i in range(len(params))]
    state = {"loss": loss.detach().reshape(())}
    for name, p in zip(names, params):
        state[f"grad:{name}"] = p.grad.detach() if p.grad is not None else torch.zeros_like(p)
        state[f"weight:{name}"] = p.detach()
    return state


def _first_step_state(config: RunConfig, device: torch.device, dtype: torch.dtype,
                      shards: int = 1) -> dict[str, torch.Tensor]:
    """Eager's state after one training step from the seeded start, in ``dtype``.

    With ``shards`` > 1 it is what DDP computes for that many ranks: each
    rank's slice goes through the model on its own (BatchNorm uses the
    slice's statistics), the gradients are averaged, one Adam step; the loss
    is the mean of the slices' losses.
    """
    model = build_model(config, device, dtype)
    optimizer = make_optimizer(model.parameters(), config)
    loss_fn = nn.NLLLoss()
    optimizer.zero_grad()
    total = torch.zeros((), dtype=dtype, device=device)
    for shard in range(shards):
        x, y = make_batch(config, device, shard, shards)
        loss = loss_fn(model(x.to(dtype)), y) / shards
        loss.backward()
        total += loss.detach()
    optimizer.step()
    return _step_state(model, model, total)


#: Elements per piece when comparing on the CPU. A whole-tensor float64 difference of the
#: 51 M-parameter linear weight is a fresh 400 MB buffer whose page faults dominated: the
#: seed config's comparison took 3.4 s whole and 0.15 s in pieces that stay in cache.
_CHUNK = 1 << 18


def _sq_error(a: torch.Tensor, b: Optional[torch.Tensor] = None) -> float:
    """Sum of squared differences ``a - b`` (of ``a`` itself without ``b``), computed in the
    wider of the two dtypes (float64 against the reference) and summed in Python floats, one
    piece at a time on the CPU."""
    a = a.reshape(-1)
    b = None if b is None else b.reshape(-1)
    chunk = _CHUNK if a.device.type == "cpu" else max(a.numel(), 1)
    return sum(torch.linalg.vector_norm(a[i:i + chunk] if b is None else a[i:i + chunk] - b[i:i + chunk]).item() ** 2
               for i in range(0, a.numel(), chunk))


_GROUPS = ("loss", "grad:", "weight:")


def _group(key: str) -> str:
    return next(p for p in _GROUPS if key.startswith(p))


def _errors(state: dict, ref: dict, ref_sq: dict[str, float]) -> tuple[dict[str, float], dict[str, float]]:
    """Per tensor RMSE against ``ref``, and per group (loss, gradients, weights) the relative
    error ||state - ref|| / ||ref|| over all of the group's elements."""
    rmse, group_sq = {}, dict.fromkeys(_GROUPS, 0.0)
    for key, r in ref.items():
        sq = _sq_error(state[key], r)
        rmse[key] = math.sqrt(sq / max(r.numel(), 1))
        group_sq[_group(key)] += sq
    rel = {p: math.sqrt(group_sq[p]) / math.sqrt(ref_sq[p]) if ref_sq[p] > 0 else math.sqrt(group_sq[p])
           for p in _GROUPS}
    return rmse, rel


def reference_state(config: RunConfig, device: torch.device, cache_path: Optional[str] = None,
                    shards: int = 1) -> dict:
    """The float64 eager first step, and fp32 eager's own error against it, per tensor.

    Every cell on a device is judged against the same reference. It is
    computed by the first cell that needs it and saved to ``cache_path`` (the
    run's private temp directory, written atomically), so later cells load it
    instead of running two more reference steps. Only tensors are saved and
    they are loaded with ``weights_only=True``.
    """
    if cache_path and os.path.exists(cache_path):
        return torch.load(cache_path, map_location=device, weights_only=True, mmap=True)
    eager = _first_step_state(config, device, torch.float32, shards)
    if device.type == "mps":  # no float64 on MPS
        name, ref = "float32 eager (MPS has no float64)", eager
    else:
        name, ref = "float64 eager", _first_step_state(config, device, torch.float64, shards)
    if shards > 1:
        name += f" over the same {shards} slices (DDP's averaged gradients)"
    ref_sq = dict.fromkeys(_GROUPS, 0.0)
    for key, r in ref.items():
        ref_sq[_group(key)] += _sq_error(r)
    eager_rmse, eager_rel = _errors(eager, ref, ref_sq)
    data = {
        "name": name,
        "ref": {k: v.clone() for k, v in ref.items()},
        "ref_sq": ref_sq,
        "eager_rmse": eager_rmse,
        "eager_rel": eager_rel,
    }
    if cache_path:
        tmp = f"{cache_path}.{os.getpid()}.tmp"
        torch.save(data, tmp)
        os.replace(tmp, cache_path)
    return data


def compare_with_reference(got: dict[str, torch.Tensor], reference: dict, tolerance: float) -> Parity:
    """Judge a first-step state against the reference: per tensor,
    ``rmse(got) <= PARITY_MULTIPLIER * rmse(fp32 eager) + tolerance``."""
    ref, eager_rmse = reference["ref"], reference["eager_rmse"]
    worst = (0.0, None, 0.0, 0.0)  # (rmse / limit, tensor, rmse, limit)
    detail = None
    for key, r in ref.items():
        if key not in got or got[key].shape != r.shape:
            found = tuple(got[key].shape) if key in got else "missing"
            detail = f"{key} is {found}, expected shape {tuple(r.shape)}"
            worst = (math.inf, key, math.nan, 0.0)
            break
    shapes_match = detail is None
    rmses, rel = _errors(got, ref, reference["ref_sq"]) if shapes_match else ({}, dict.fromkeys(_GROUPS, math.nan))
    for key, rmse in rmses.items():
        limit = PARITY_MULTIPLIER * eager_rmse[key] + tolerance
        ratio = rmse / limit if math.isfinite(rmse) and math.isfinite(limit) else math.inf
        if ratio > worst[0]:
            worst = (ratio, key, rmse, limit)
    passed = worst[0] <= 1.0
    if not passed and shapes_match:
        detail = (
            f"{worst[1]}: RMSE {worst[2]:.3g} vs {reference['name']} exceeds "
            f"{PARITY_MULTIPLIER:g} x fp32 eager's + {tolerance:g} = {worst[3]:.3g}"
        )
    eager_rel = reference["eager_rel"]
    return Parity(
        passed=passed,
        reference=reference["name"],
        multiplier=PARITY_MULTIPLIER,
        tolerance=tolerance,
        loss_rel_error=rel["loss"],
        grad_rel_error=rel["grad:"],
        weight_rel_error=rel["weight:"],
        eager_loss_rel_error=eager_rel["loss"],
        eager_grad_rel_error=eager_rel["grad:"],
        eager_weight_rel_error=eager_rel["weight:"],
        worst_tensor=worst[1],
        worst_rmse=worst[2],
        worst_limit=worst[3],
        detail=detail,
    )
