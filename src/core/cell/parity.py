"""Parity: the backend's first training step against a float64 eager reference.

The verdict is per tensor (loss, every gradient, every updated weight):
``rmse(backend) <= PARITY_MULTIPLIER * rmse(fp32 eager) + tolerance``, both
against float64 eager (the rule of PyTorch's own dynamo benchmark harness).
The reference is computed once per device per run and shared through the
run's private directory.
"""
from __future__ import annotations

import math
import os
from typing import Any, Optional

import torch
from torch import nn

from ..records import Parity
from .training import Job, make_optimizer, trained_parameters

#: A compared tensor passes when rmse(backend) <= PARITY_MULTIPLIER * rmse(fp32 eager) + tolerance.
PARITY_MULTIPLIER = 3.0


def step_state(model: nn.Module, forward: Any, loss: torch.Tensor) -> dict[str, torch.Tensor]:
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


def first_step_state(job: Job, device: torch.device, dtype: torch.dtype,
                     shards: int = 1) -> dict[str, torch.Tensor]:
    """Eager's state after one training step from the seeded start, in ``dtype``.

    With ``shards`` > 1 it is what DDP computes for that many ranks: each
    rank's slice goes through the model on its own (BatchNorm uses the
    slice's statistics), the gradients are averaged, one Adam step; the loss
    is the mean of the slices' losses.
    """
    model = job.build_model(device, dtype)
    optimizer = make_optimizer(model.parameters(), job.config.lr)
    optimizer.zero_grad()
    total = torch.zeros((), dtype=dtype, device=device)
    for shard in range(shards):
        x, y = job.make_batch(device, shard, shards, dtype)
        loss = job.loss(model(x), y) / shards
        loss.backward()
        total += loss.detach()
    optimizer.step()
    return step_state(model, model, total)


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


def reference_state(job: Job, device: torch.device, cache_path: Optional[str] = None,
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
    eager = first_step_state(job, device, torch.float32, shards)
    if device.type == "mps":  # no float64 on MPS
        name, ref = "float32 eager (MPS has no float64)", eager
    else:
        name, ref = "float64 eager", first_step_state(job, device, torch.float64, shards)
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
    worst: tuple[float, Optional[str], float, float] = (0.0, None, 0.0, 0.0)  # (rmse / limit, tensor, rmse, limit)
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
