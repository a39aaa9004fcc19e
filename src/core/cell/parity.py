"""Parity: the backend's training trajectory against a float64 eager reference of the same steps.

What is judged. The cell snapshots its state twice, both untimed: after the
first step, and after its *parity step* N (``parity_step``), the first step
after the backend's own warm-up (``min_warmup``, at least 2), by when CUDA
graphs replay, TorchScript runs its optimised graph and Adam has state: step
3 for every built-in. The cell runs at least N - 1 warm-up steps, so step N
is always a warm-up step and the measured steps follow it. Compared, each tensor on its own:

- every gradient of step 1 and of step N (Adam's update is blind to a
  gradient's scale, so a gradient 10 % too large only shows in the gradient;
  step 1's are pure rounding, before Adam's updates make fp32 chaotic),
- every buffer after step 1 and step N (BatchNorm's running mean and
  variance and batch count: a backend that never updates them),
- every weight after step N (a skipped update, other Adam betas),
- the loss of every step 1..N (a backend that stops training shows here).

The rule, per tensor ``t``, with norm-relative errors ``||t - ref|| / ||ref||``
against float64 eager after the same steps::

    rel(backend) <= PARITY_MULTIPLIER * rel(fp32 eager) + rtol

``rtol`` is the backend's (``parity_rtol``, default ``DEFAULT_PARITY_RTOL``):
the room a correct fp32 algorithm change (NHWC convolutions, a fused
optimizer, inductor's reordered reductions) needs beyond eager's own error.
The reference (float64 and fp32 eager, N steps each) is computed once per
device, parity step and DDP shards per run, by the first cell that needs
it, and shared through the run's private directory.

In inference (``--mode inference``) the judged state is the forward's output
after step 1 and step N, and every buffer after each, against float64 and
fp32 eager's forward of the eval-mode model on the same batch, by the same
rule (``output_snapshot``, ``eager_outputs``; docs/inference.md).
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Optional

import torch
from torch import nn

from ...workloads.factory import WorkloadError
from ..records import Parity
from .training import Job, make_optimizer, output_tensors, trained_parameters

#: A compared tensor passes when rel(backend) <= PARITY_MULTIPLIER * rel(fp32 eager) + rtol.
#: After a few Adam steps fp32 is chaotic (Adam moves every weight by about lr whatever its
#: gradient's size, so a near-zero gradient whose sign rounding flips moves its weight the
#: other way): a correct backend's error is then a multiple of fp32 eager's own, not the same.
#: Measured at the seed config after step 4: channels-last's largest weight is 3.4 x eager's
#: error (0.79 % vs 0.23 %). 5 keeps such a backend under half its limit.
PARITY_MULTIPLIER = 5.0

#: Steps before the parity step, at least: it is then step 3 or later, after Adam has state
#: (step 2), after a CUDA-graph tree has recorded (step 2) and replays, and after a step
#: whose loss could only be right if step 2 trained.
PARITY_MIN_WARMUP = 2

#: Tensors whose fp32 eager error is above this are rounding noise, not judged: a conv bias
#: before BatchNorm has a gradient of exactly zero in exact arithmetic (BatchNorm subtracts
#: the mean), so fp32's is noise 1e9 times float64's, and Adam turns it into +-lr steps of
#: random sign (fp32 eager's own error on those weights: 0.7-1.9 % at the tiny config). Every
#: other tensor of the seed CNN sits below 4e-4. The report names the tensors left out.
NOISE_REL = 1e-2

#: Unit roundoff of each backend precision (``backends.base.precision``). fp32 eager's error on
#: a tensor is about its sensitivity to rounding times fp32's unit roundoff, so the same tensor
#: computed in bf16 is expected to be off by that error x (bf16's / fp32's) = x 65536: a reduced-
#: precision backend's limit adds that expected error (``limit``). Well-conditioned tensors
#: (fp32 error ~1e-7) barely move; ill-conditioned ones get the room their precision needs: at
#: the tiny config the last BatchNorm bias's gradient has fp32 error 3.4e-5, so bf16's expected
#: error is 2.2 (measured on torch 2.6 and 2.15: 1.6, above amp-bf16's 0.6 tolerance alone).
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "bf16": 2.0**-8, "fp16": 2.0**-11}

_GROUPS = ("loss", "grad", "weight", "buffer", "output")


def parity_step(min_warmup: int) -> int:
    """The step whose full state is judged (steps count from 1): the first after the backend's
    own warm-up of ``min_warmup`` steps, and never before ``1 + PARITY_MIN_WARMUP``."""
    return 1 + max(min_warmup, PARITY_MIN_WARMUP)


def snapshot(model: nn.Module, trained: Any, losses: list[torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state judged by parity after ``len(losses)`` steps, by name (no copies).

    After step 1: ``step1/grad:<name>`` and ``step1/buffer:<name>``. After a
    later step k: ``loss:1``..``loss:k``, then ``step<k>/grad:``, ``step<k>/weight:``
    and ``step<k>/buffer:`` for every gradient, weight and buffer of the module
    ``trained`` trains. Names are ``model``'s (a compiled or traced module may
    prefix or drop them); the tensors are ``trained``'s own where it is a
    module, in the same order.
    """
    owner = trained if isinstance(trained, nn.Module) else model
    params = trained_parameters(trained, model)
    buffers = list(owner.buffers())
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    buffer_names = [name for name, _ in model.named_buffers()]
    if len(names) != len(params):
        names = [f"param{i}" for i in range(len(params))]
    if len(buffer_names) != len(buffers):
        buffer_names = [f"buffer{i}" for i in range(len(buffers))]
    step = len(losses)
    first = step == 1
    state = {} if first else {f"loss:{k}": loss.detach().reshape(()) for k, loss in enumerate(losses, 1)}
    for name, p in zip(names, params):
        state[f"step{step}/grad:{name}"] = p.grad.detach() if p.grad is not None else torch.zeros_like(p)
    if not first:  # after one Adam step a weight is w0 - lr * sign(g): nothing the gradients don't show
        for name, p in zip(names, params):
            state[f"step{step}/weight:{name}"] = p.detach()
    for name, b in zip(buffer_names, buffers):
        state[f"step{step}/buffer:{name}"] = b.detach()
    return state


def output_snapshot(model: nn.Module, trained: Any, output: Any, step: int) -> dict[str, torch.Tensor]:
    """Inference's judged state after ``step`` forwards, by name (no copies): ``step<k>/output:<i>``
    for each floating-point tensor of ``output`` (``training.output_tensors``' order) and
    ``step<k>/buffer:<name>`` for every buffer of the module that ran (BatchNorm's running
    statistics must not move in eval mode). A module that holds none of them as buffers (a
    frozen graph inlines them as constants) is judged by its outputs, with ``model``'s buffers."""
    buffer_names = [name for name, _ in model.named_buffers()]
    buffers = list(trained.buffers()) if isinstance(trained, nn.Module) else []
    if len(buffers) != len(buffer_names):
        buffers = list(model.buffers())
    state = {f"step{step}/output:{i}": t.detach() for i, t in enumerate(output_tensors(output))}
    state.update((f"step{step}/buffer:{name}", b.detach()) for name, b in zip(buffer_names, buffers))
    return state


def eager_outputs(job: Job, device: torch.device, dtype: torch.dtype, steps: int) -> dict[str, torch.Tensor]:
    """Plain eager's inference state in ``dtype``: the eval-mode model's forward of the seeded
    batch under ``inference_mode``, keyed as after step 1 and after ``steps`` (a forward has no
    state to carry, so both are the same numbers), copied."""
    model = job.build_model(device, dtype)
    x, _ = job.make_batch(device, dtype=dtype)
    with torch.inference_mode():
        output = model(x)
        state = {k: v.clone() for k, v in output_snapshot(model, model, output, 1).items()}
        state.update((k, v.clone()) for k, v in output_snapshot(model, model, output, steps).items())
    return state


def eager_trajectory(job: Job, device: torch.device, dtype: torch.dtype, steps: int,
                     shards: int = 1) -> dict[str, torch.Tensor]:
    """Plain eager's snapshots after step 1 and after ``steps`` steps from the seeded start, in
    ``dtype`` (one dict: their keys differ), copied.

    With ``shards`` > 1 it is what DDP computes for that many ranks, as rank 0
    sees it: each rank's slice goes through the model on its own (BatchNorm
    normalises with the slice's statistics), the gradients are averaged, one
    Adam step; the loss is the mean of the slices'. DDP broadcasts rank 0's
    buffers before every forward, so the running statistics are rank 0's: the
    ones its slice alone produced.
    """
    model = job.build_model(device, dtype)
    optimizer = make_optimizer(model.parameters(), job.config.lr)
    batches = [job.make_batch(device, shard, shards, dtype) for shard in range(shards)]
    losses: list[torch.Tensor] = []
    state: dict[str, torch.Tensor] = {}
    for _ in range(steps):
        optimizer.zero_grad()
        total = torch.zeros((), dtype=dtype, device=device)
        rank0_buffers: Optional[list[torch.Tensor]] = None
        for shard, (x, y) in enumerate(batches):
            loss = job.loss(model(x), y) / shards
            loss.backward()
            total += loss.detach()
            if shards > 1 and shard == 0:
                rank0_buffers = [b.detach().clone() for b in model.buffers()]
        if rank0_buffers is not None:
            with torch.no_grad():
                for b, kept in zip(model.buffers(), rank0_buffers):
                    b.copy_(kept)
        optimizer.step()
        losses.append(total)
        if len(losses) in (1, steps):
            state.update((k, v.clone()) for k, v in snapshot(model, model, losses).items())
    return state


#: Elements per piece when comparing on the CPU. A whole-tensor float64 difference of the
#: 51 M-parameter linear weight is a fresh 400 MB buffer whose page faults dominated: the
#: seed config's comparison took 3.4 s whole and 0.15 s in pieces that stay in cache.
_CHUNK = 1 << 18


def _sq_norm(a: torch.Tensor, b: Optional[torch.Tensor] = None) -> float:
    """``||a - b||²`` (``||a||²`` without ``b``) in float64, summed in Python floats, one
    piece at a time on the CPU. Integer buffers (batch counts) are compared as numbers."""
    a = a.reshape(-1)
    b = None if b is None else b.reshape(-1)
    chunk = _CHUNK if a.device.type == "cpu" else max(a.numel(), 1)
    total = 0.0
    for i in range(0, a.numel(), chunk):
        piece = a[i:i + chunk].double()
        if b is not None:
            piece = piece - b[i:i + chunk].double()
        total += torch.linalg.vector_norm(piece).item() ** 2
    return total


def _group(key: str) -> str:
    """``loss``, ``grad``, ``weight`` or ``buffer``."""
    return key.split("/")[-1].split(":", 1)[0]


def _relative_errors(state: dict, ref: dict, ref_sq: dict[str, float],
                     noise: frozenset = frozenset()) -> tuple[dict[str, float], dict[str, Optional[float]]]:
    """Per tensor ``||state - ref|| / ||ref||`` (the absolute norm where ``ref`` is zero), and per
    group (losses, gradients, weights, buffers) the same over the group's elements, ``noise`` left out."""
    per_tensor, group_sq, group_ref = {}, dict.fromkeys(_GROUPS, 0.0), dict.fromkeys(_GROUPS, 0.0)
    present = {_group(key) for key in ref}
    for key, r in ref.items():
        sq = _sq_norm(state[key], r)
        per_tensor[key] = math.sqrt(sq / ref_sq[key]) if ref_sq[key] > 0 else math.sqrt(sq)
        if key not in noise:
            group_sq[_group(key)] += sq
            group_ref[_group(key)] += ref_sq[key]
    # A group the mode has no tensors of (gradients in inference, outputs in training) is None.
    groups = {g: (math.sqrt(group_sq[g] / group_ref[g]) if group_ref[g] > 0 else math.sqrt(group_sq[g]))
              if g in present else None for g in _GROUPS}
    return per_tensor, groups


def reference_state(job: Job, device: torch.device, steps: int, cache_path: Optional[str] = None,
                    shards: int = 1) -> dict:
    """The float64 eager state after ``steps`` steps, and fp32 eager's own error against it.

    Every cell on a device with the same parity step is judged against the
    same reference. It is computed by the first cell that needs it and saved
    to ``cache_path`` (the run's private temp directory, written atomically),
    so later cells load it. Only tensors, numbers and strings are saved, and
    loaded with ``weights_only=True``. ``seconds`` is what computing it took.
    """
    if cache_path and os.path.exists(cache_path):
        return torch.load(cache_path, map_location=device, weights_only=True, mmap=True)
    start = time.perf_counter()

    def trajectory(dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return eager_outputs(job, device, dtype, steps) if job.inference else \
            eager_trajectory(job, device, dtype, steps, shards)

    eager = trajectory(torch.float32)
    if device.type == "mps":  # no float64 on MPS
        name, ref = "float32 eager (MPS has no float64)", eager
    else:
        try:
            ref = trajectory(torch.float64)
        except Exception as exc:
            raise WorkloadError(f"workload {job.workload.name!r} can't {'run' if job.inference else 'train'} in "
                                f"float64 for the parity reference: "
                                f"{type(exc).__name__}: {exc}") from exc
        name = "float64 eager"
    name += " forward (eval mode)" if job.inference else f", {steps} steps"
    if shards > 1:
        name += f" over the same {shards} slices (DDP's averaged gradients, rank 0's buffers)"
    ref_sq = {key: _sq_norm(r) for key, r in ref.items()}
    eager_rel, _ = _relative_errors(eager, ref, ref_sq)
    noise = sorted(key for key, error in eager_rel.items() if error > NOISE_REL)
    _, eager_groups = _relative_errors(eager, ref, ref_sq, frozenset(noise))
    data = {
        "name": name,
        "ref": ref,
        "ref_sq": ref_sq,
        "eager_rel": eager_rel,
        "eager_groups": eager_groups,
        "noise": noise,
        "seconds": time.perf_counter() - start,
    }
    if cache_path:
        tmp = f"{cache_path}.{os.getpid()}.tmp"
        torch.save(data, tmp)
        os.replace(tmp, cache_path)
    return data


def limit(eager_error: float, rtol: float, precision: str = "fp32") -> float:
    """A tensor's limit: PARITY_MULTIPLIER x fp32 eager's error, plus the backend's tolerance, plus
    (for a reduced precision) the error fp32 eager's scaled to that precision would be."""
    scale = UNIT_ROUNDOFF[precision] / UNIT_ROUNDOFF["fp32"]
    return (PARITY_MULTIPLIER + scale - 1) * eager_error + rtol


def _worst(got: dict, reference: dict, rtol: float,
           precision: str) -> tuple[float, Optional[str], float, float, dict[str, Optional[float]]]:
    """(error ÷ limit, tensor, error, limit) of the tensor nearest its limit, and the group errors."""
    ref = reference["ref"]
    for key, r in ref.items():
        if key not in got or got[key].shape != r.shape:
            present = {_group(k) for k in ref}
            return math.inf, key, math.nan, math.nan, {g: math.nan if g in present else None for g in _GROUPS}
    noise = frozenset(reference["noise"])
    errors, groups = _relative_errors(got, ref, reference["ref_sq"], noise)
    worst: tuple[float, Optional[str], float, float] = (0.0, None, 0.0, 0.0)
    for key, error in errors.items():
        if key in noise:
            continue
        most = limit(reference["eager_rel"][key], rtol, precision)
        ratio = error / most if math.isfinite(error) else math.inf
        if ratio > worst[0] or worst[1] is None:
            worst = (ratio, key, error, most)
    return (*worst, groups)


def compare_with_reference(got: dict[str, torch.Tensor], reference: dict, rtol: float, step: int,
                           precision: str = "fp32") -> Parity:
    """Judge a snapshot (``snapshot``) taken after ``step`` steps against the reference of as many:
    per tensor, ``rel(got) <= limit(rel(fp32 eager), rtol, precision)``; fp32 eager's rounding
    noise (``NOISE_REL``) is not judged."""
    ratio, key, error, most, groups = _worst(got, reference, rtol, precision)
    detail = None
    if key is not None and math.isnan(error):
        found = tuple(got[key].shape) if key in got else "missing"
        detail = f"{key} is {found}, expected shape {tuple(reference['ref'][key].shape)}"
    elif ratio > 1.0:
        eager = reference["eager_rel"][key]
        expected = f" + {precision}'s expected ({most - PARITY_MULTIPLIER * eager - rtol:.2g})" \
            if precision != "fp32" else ""
        detail = (f"{key} after step {step}: relative error {error:.3g} vs {reference['name']} exceeds "
                  f"{PARITY_MULTIPLIER:g} x fp32 eager's ({eager:.2g}) + {rtol:g}{expected} = {most:.3g}")
    eager_groups = reference["eager_groups"]
    return Parity(
        passed=ratio <= 1.0,
        reference=reference["name"],
        multiplier=PARITY_MULTIPLIER,
        tolerance=rtol,
        loss_rel_error=groups["loss"],
        grad_rel_error=groups["grad"],
        weight_rel_error=groups["weight"],
        buffer_rel_error=groups["buffer"],
        eager_loss_rel_error=eager_groups["loss"],
        eager_grad_rel_error=eager_groups["grad"],
        eager_weight_rel_error=eager_groups["weight"],
        eager_buffer_rel_error=eager_groups["buffer"],
        output_rel_error=groups["output"],
        eager_output_rel_error=eager_groups["output"],
        worst_tensor=key,
        worst_error=error,
        worst_limit=most,
        margin=ratio,
        step=step,
        tensors=len(reference["ref"]) - len(reference["noise"]),
        not_judged=list(reference["noise"]),
        detail=detail,
    )
