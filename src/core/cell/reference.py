"""The parity reference: what every cell on a device is judged against, computed once per run in a
process of its own (``python -m cnncompare.core.cell.main`` with a ``ReferenceOrder``).

A clean process, TF32 off and matmuls at full precision, so that no backend's global settings
(``set_float32_matmul_precision``, cuDNN flags) leak into the limits every row is held to. It
trains the workload eagerly over the run's batches (``training.Job.batches``):

- in float64: the truth, to the deepest parity step any planned backend has (and its weights one
  step before each parity step: each row's last update is judged against the update they make);
- in fp32, three times: plain, and twice with every module's output and gradient perturbed by
  a seeded relative ``JITTER`` (256 fp32 ulps).
  The largest of the three errors is each tensor's *sensitivity* to a correct change of rounding.
  One fp32 run is a poor estimate: after a few Adam steps a near-zero gradient's sign decides a
  weight's direction, and whether rounding flips it is a lottery (ResNet at
  batch 2: fp32 eager 2.8e-5 off float64 at step 3, the same step perturbed by 8 ulps 10 %,
  a correct compile 2.2 %).
  Every fp32 run runs every step a cell runs (``steps``): plain fp32's losses are the trajectory
  the later steps are held to, the perturbed runs' largest departure from it their drift (one
  perturbed run's drift alone, measured, left a correct channels-last ResNet at batch 2 at 0.55
  of its limit);
- in each reduced precision the device has (autocast bf16; on CUDA also fp16, and fp32 with
  TF32): one step, so each row's *measured* precision can be named from its errors; where a
  planned backend declares that precision, over every step (its drift from plain fp32's losses)
  and twice more to the deepest parity step, perturbed by one ulp of that precision; the largest
  error of the three then raises that backend's limits.

A workload that draws random numbers (dropout) is detected here (two forwards under other
seeds differ); every cell and this reference then seed torch's generator before each step
(``training.step_seed``) and inductor draws eager's numbers (``fallback_random``), as
PyTorch's accuracy harness does.

Saved to the run's private directory with ``torch.save`` (tensors, numbers, strings: loaded with
``weights_only=True``); a failure is saved beside it as one line of text, which the cells raise
as the workload's error.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import time
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch
from torch import nn

from ...workloads.factory import WorkloadError
from ..fileio import write_atomic
from ..records import ReferencePlan
from .parity import UNIT_ROUNDOFF
from .training import Job, output_tensors, step_seed, summary, trained_parameters

#: Relative amplitude of the perturbed fp32 runs: 256 fp32 ulps (2^-16). Whether a few Adam
#: steps flip a near-zero gradient's sign is a threshold: measured on the ResNet at batch 2, 16
#: ulps left channels-last's NHWC convolutions (a correct fp32 change, identical to eager's
#: rounding at step 1) 10x over its limit at step 3; 256 ulps pass it at 0.07 while other Adam
#: betas still fail there at 3.3x.
JITTER = 2.0**-16
#: Amplitude of the perturbed runs in a reduced precision, in its unit roundoffs: 2, one ulp.
REDUCED_JITTER = 2.0
#: Reduced precisions a row's measured precision is named from, by device type.
CANDIDATES = {"cpu": ("bf16",), "cuda": ("tf32", "fp16", "bf16")}
_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def paths(run_dir: str, device: str) -> tuple[str, str, str]:
    """(the reference, its small metadata as JSON, the error a failed one leaves) in ``run_dir``."""
    stem = os.path.join(run_dir, f"reference-{device.replace(':', '-')}")
    return f"{stem}.pt", f"{stem}.json", f"{stem}.error"


@dataclass(frozen=True)
class Meta:
    """What a cell needs to know before it compiles: whether the step draws random numbers, and
    what the reference cost."""

    random: bool
    seconds: float
    #: When it was computed (UTC, ISO 8601).
    computed_at: Optional[str] = None

    @classmethod
    def load(cls, run_dir: str, device: str) -> "Meta":
        """The reference's metadata; raises ``WorkloadError`` with the reference's own failure."""
        ref, meta, error = paths(run_dir, device)
        if os.path.exists(error):
            with open(error) as f:
                raise WorkloadError(f.read().strip())
        with open(meta) as f:
            return cls(**json.load(f))


def load(run_dir: str, device: torch.device) -> dict:
    return torch.load(paths(run_dir, str(device))[0], map_location=device, weights_only=True, mmap=True)


@contextlib.contextmanager
def full_fp32() -> Iterator[None]:
    """fp32 as fp32: TF32 off for matmuls and cuDNN, matmul precision 'highest' (on the CPU
    'medium' lets oneDNN compute fp32 matmuls in bf16)."""
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


@contextlib.contextmanager
def computing_in(precision: str, device: torch.device) -> Iterator[None]:
    """The forward as a backend of ``precision`` runs it: fp32 plain, tf32 with TF32 allowed,
    bf16/fp16 under autocast."""
    if precision == "tf32":
        saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        try:
            yield
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    elif precision in _AUTOCAST:
        with torch.autocast(device_type=device.type, dtype=_AUTOCAST[precision]):
            yield
    else:
        yield


class _Noise:
    """Seeded uniform(-1, 1) noise of any shape, cheap: one buffer drawn once per device and dtype
    (at least twice the largest request), each request a window of it at a seeded random offset.
    Drawing every element afresh cost a perturbed run half again a plain one's time at the default
    config (5 s of 15); a window at a new offset is as random per element, step to step."""

    def __init__(self, seed: int):
        self.seed = seed
        self.gens: dict[torch.device, torch.Generator] = {}
        self.buffers: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def __call__(self, shape: torch.Size, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        n = math.prod(shape)
        g = self.gens.setdefault(device, torch.Generator(device=device).manual_seed(self.seed))
        buffer = self.buffers.get((device, dtype))
        if buffer is None or buffer.numel() < 2 * n:
            buffer = torch.empty(max(2 * n, 1 << 20), device=device, dtype=dtype).uniform_(-1, 1, generator=g)
            self.buffers[(device, dtype)] = buffer
        offset = int(torch.randint(0, buffer.numel() - n + 1, (1,), generator=g, device=device).item())
        return buffer[offset:offset + n].view(shape)


def jitter(model: nn.Module, seed: int, amplitude: float = JITTER) -> None:
    """Perturb every leaf module's floating-point output, and the gradient flowing back into it,
    by a seeded relative ``amplitude`` (uniform in +-amplitude per element)."""
    draw = _Noise(seed)

    def noise(t: torch.Tensor) -> torch.Tensor:
        # In at least fp32: 1 +- a fraction of a bf16 ulp, computed in bf16, rounds asymmetrically
        # (bf16's spacing is 2^-7 above 1 and 2^-8 below) and would bias every tensor's scale.
        return 1 + amplitude * draw(t.shape, t.device, torch.promote_types(t.dtype, torch.float32))

    def perturbed(t: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
        return (t * factor).to(t.dtype)

    def hook(module: nn.Module, inputs: Any, out: Any) -> Any:
        if not isinstance(out, torch.Tensor) or not out.is_floating_point():
            return out
        out = perturbed(out, noise(out))
        if out.requires_grad:
            back = noise(out)
            out.register_hook(lambda grad: perturbed(grad, back))
        return out

    for module in model.modules():
        if not any(True for _ in module.children()):
            module.register_forward_hook(hook)


def draws_random_numbers(job: Job, device: torch.device) -> bool:
    """Whether the workload's step draws random numbers: two forwards of the same model and
    batch under different seeds differ."""
    model = job.build_model(device)
    x = job.forward_input(0, device)
    outputs = []
    with torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            outputs.append([t.clone() for t in output_tensors(model(x))])
    return any(not torch.equal(a, b) for a, b in zip(*outputs))


def trajectory(job: Job, device: torch.device, dtype: torch.dtype, steps: int, snap_at: frozenset,
               shards: int = 1, precision: str = "fp32", perturb: Optional[int] = None,
               random: bool = False, amplitude: float = JITTER) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Plain eager over ``steps`` steps of the run's batches: the snapshots after each step in
    ``snap_at`` (``parity.snapshot``'s keys; inference: ``parity.output_snapshot``'s), copied,
    and every step's loss (inference: its output's ``summary``).

    ``precision`` computes the forward as a backend of it would (``computing_in``); ``perturb``
    seeds ``jitter`` of ``amplitude``. With ``shards`` > 1 it is what DDP computes for that many ranks, as
    rank 0 sees it: each rank's slice goes through the model on its own (BatchNorm normalises
    with the slice's statistics), the gradients are averaged (and clipped, where the recipe clips), one optimizer step; the loss is the
    mean of the slices'. DDP broadcasts rank 0's buffers before every forward, so the running
    statistics are rank 0's: the ones its slice alone produced.
    """
    from .parity import output_snapshot, snapshot

    model = job.build_model(device, dtype)
    if perturb is not None:
        jitter(model, perturb, amplitude)
    pools = [job.batches(device, shard, shards, dtype) for shard in range(shards)]
    losses: list[float] = []
    state: dict[str, torch.Tensor] = {}
    if job.inference:
        for k in range(1, steps + 1):
            if random:
                torch.manual_seed(step_seed(job.config.seed, k))
            x, _ = pools[0][(k - 1) % len(pools[0])]
            with torch.inference_mode(), computing_in(precision, device):
                out = model(x)
            losses.append(summary(out).item())
            if k in snap_at:
                state.update((key, v.clone()) for key, v in output_snapshot(model, model, out, k).items())
        return state, losses
    params = trained_parameters(model, model)
    optimizer = job.make_optimizer(params)
    scheduler = job.make_scheduler(optimizer)
    count, clip = job.recipe.accumulation_steps, job.recipe.clip_grad_norm
    tensors: list[torch.Tensor] = []
    for k in range(1, steps + 1):
        if random:
            torch.manual_seed(step_seed(job.config.seed, k))
        optimizer.zero_grad()
        total = torch.zeros((), dtype=dtype, device=device)
        rank0_buffers: Optional[list[torch.Tensor]] = None
        for shard, pool in enumerate(pools):
            for x, y in job.recipe.split(*pool[(k - 1) % len(pool)]):
                with computing_in(precision, device):
                    out = model(x)
                loss = job.loss(out.to(dtype) if isinstance(out, torch.Tensor) else out, y) / (shards * count)
                loss.backward()
                total += loss.detach()
            if shards > 1 and shard == 0:
                rank0_buffers = [b.detach().clone() for b in model.buffers()]
        if rank0_buffers is not None:
            with torch.no_grad():
                for b, kept in zip(model.buffers(), rank0_buffers):
                    b.copy_(kept)
        if clip is not None:  # of the averaged gradients, as each DDP rank clips after the all-reduce
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        tensors.append(total)
        losses.append(total.item())
        if k in snap_at:
            state.update((key, v.clone()) for key, v in snapshot(model, model, tensors).items())
    return state, losses


def weights_before(state: dict[str, torch.Tensor], steps: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """For each parity step N, the weights after step N - 1 keyed as after step N: a weight is
    judged by its last update (``parity._start_key``), where other Adam betas or another learning
    rate show at full size, not diluted by the first steps' identical ``+-lr`` moves."""
    return {f"step{n}/{key.split('/', 1)[1]}": v for n in steps
            for key, v in state.items() if key.startswith(f"step{n - 1}/weight:")}


def _cummax_drift(losses: list[float], base: list[float]) -> list[float]:
    """Per step, the largest relative difference of ``losses`` from ``base`` up to that step."""
    drift, worst = [], 0.0
    for a, b in zip(losses, base):
        worst = max(worst, abs(a - b) / max(abs(b), 1e-12)) if math.isfinite(a) else math.inf
        drift.append(worst)
    return drift


def _drift(losses: list[float], perturbed_losses: list[list[float]]) -> list[float]:
    """Per step, the largest relative departure of any perturbed run's loss from plain fp32's up
    to that step."""
    drifts = [_cummax_drift(p, losses) for p in perturbed_losses]
    return [max((d[k] for d in drifts), default=0.0) for k in range(len(losses))]


def compute(job: Job, device: torch.device, plan: ReferencePlan) -> dict:
    """The reference for ``plan`` (see the module's docstring), as saved."""
    from .parity import reference_name

    start = time.perf_counter()
    deepest = max(plan.parity_steps)
    snap_at = frozenset({1, *plan.parity_steps})
    before_at = frozenset() if job.inference else frozenset(n - 1 for n in plan.parity_steps)
    # Every training run also keeps its weights before each parity step: its last update is judged.
    judged_at = snap_at | before_at
    steps = max(plan.steps, deepest)
    random = draws_random_numbers(job, device)
    run = functools.partial(trajectory, job, device, shards=plan.shards, random=random)
    mps = device.type == "mps"  # no float64 on MPS: fp32 eager is the reference there
    with full_fp32():
        eager, losses = run(torch.float32, steps, judged_at)
        try:
            exact = eager if mps else run(torch.float64, deepest, judged_at)[0]
        except Exception as exc:
            raise WorkloadError(f"workload {job.workload.name!r} can't {'run' if job.inference else 'train'} in "
                                f"float64 for the parity reference: {type(exc).__name__}: {exc}") from exc
        init = {} if job.inference else weights_before(exact, plan.parity_steps)
        ref = {k: v for k, v in exact.items() if k.startswith("loss:") or int(k.split("/")[0][4:]) in snap_at}
        del exact
        perturbed, perturbed_losses = run(torch.float32, steps, judged_at, perturb=1)
        second, second_losses = run(torch.float32, steps, judged_at, perturb=2)
        precisions: dict[str, Any] = {}
        for p in dict.fromkeys((*CANDIDATES.get(device.type, ()), *plan.precisions)):
            full = p in plan.precisions
            try:
                computed = run(torch.float32, steps if full else 1, judged_at if full else frozenset({1}), precision=p)
                # One ulp of each reduced precision (twice its unit roundoff): a correct implementation may
                # round any op's result to either neighbour. Measured at the default config: perturbed by half a
                # unit roundoff, bf16 eager's last BatchNorm-weight update moved 0.1 % in scale where
                # compile-amp-bf16's (a correct bf16 recipe) is 3.5 % off; by one unit roundoff, enough to
                # cover that in one draw of the noise, 1.6-2x short of it in three others. Two draws, the
                # larger error counting, as for fp32; only their snapshots are used (the drift is the plain
                # run's), so they stop at the deepest parity step.
                perturbed_p = [run(torch.float32, deepest, judged_at, precision=p, perturb=seed,
                                   amplitude=REDUCED_JITTER * UNIT_ROUNDOFF[p])[0] for seed in (3, 4)] if full else []
            except Exception as exc:  # autocast in that dtype unsupported here: that precision isn't named
                precisions[p] = f"{type(exc).__name__}: {exc}"
                continue
            precisions[p] = (*computed, full, perturbed_p)
    name = reference_name("float32 eager (MPS has no float64)" if mps else "float64 eager", job.inference, deepest,
                          plan.shards)
    data = assemble(name, ref, init, eager, [perturbed, second], precisions, losses, [perturbed_losses, second_losses])
    data.update(random=random, seconds=time.perf_counter() - start)
    return data


def assemble(name: str, ref: dict, init: dict, eager: dict, perturbed: list[dict], precisions: dict[str, Any],
             losses: list[float], perturbed_losses: list[list[float]]) -> dict:
    """The reference as saved, from the computed states: ``ref`` (float64), ``init`` (its weights
    one step before each parity step), fp32 ``eager``'s and the ``perturbed`` runs' snapshots,
    per reduced precision ``(state, losses, full, perturbed states)`` or why it couldn't run, and the trajectories
    of plain fp32 and of each perturbed run. Each tensor's sensitivity is the largest error of the fp32
    runs; each precision's errors are kept per tensor for the limits and the measured
    precision (``parity.py``)."""
    from .parity import errors, group_errors, stats

    eager_stats = stats(eager, ref, init)
    eager_rel, eager_scale = errors(eager_stats)
    sens, sens_scale = dict(eager_rel), dict(eager_scale)
    for state in perturbed:
        rel, scale = errors(stats(state, ref, init))
        for key in rel:
            sens[key], sens_scale[key] = max(sens[key], rel[key]), max(sens_scale[key], scale[key])
    by_precision: dict[str, dict] = {}
    for p, computed in precisions.items():
        if isinstance(computed, str):
            by_precision[p] = {"error": computed}
            continue
        state, p_losses, full, perturbed_p = computed
        rel, scale = errors(stats(state, ref, init))
        for other in perturbed_p:
            more, more_scale = errors(stats(other, ref, init, only=list(rel)))
            rel = {k: max(v, more[k]) for k, v in rel.items()}
            scale = {k: max(v, more_scale[k]) for k, v in scale.items()}
        by_precision[p] = {"rel": rel, "scale": scale, "full": full,
                           "drift": _cummax_drift(p_losses, losses) if full else []}
    return {
        "name": name,
        "ref": ref,
        "init": init,
        "eager_rel": eager_rel,
        "eager_groups": group_errors(eager_stats),
        "sens": sens,
        "sens_scale": sens_scale,
        "precisions": by_precision,
        "losses": losses,
        "drift": _drift(losses, perturbed_losses),
        "random": False,
        "seconds": 0.0,
    }


def build(job: Job, device: torch.device, plan: ReferencePlan, run_dir: str) -> float:
    """Compute the reference for ``plan`` and save it (and its ``Meta``) in ``run_dir``; on the
    workload's failure save the error instead and re-raise. Returns the seconds it took."""
    ref_path, meta_path, error_path = paths(run_dir, str(device))
    try:
        data = compute(job, device, plan)
    except Exception as exc:
        message = str(exc) if isinstance(exc, WorkloadError) else \
            f"the parity reference failed: {type(exc).__name__}: {exc}"
        write_atomic(error_path, message)
        raise
    tmp = f"{ref_path}.{os.getpid()}.tmp"
    torch.save(data, tmp)
    os.replace(tmp, ref_path)
    write_atomic(meta_path, json.dumps({"random": data["random"], "seconds": data["seconds"],
                                        "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}))
    return data["seconds"]
