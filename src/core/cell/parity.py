"""Parity: the backend's training (in inference, its forwards) against eager computed exactly.

What is judged, all of it outside any timed region. Every step trains on a new batch of the
run's seeded sequence (``training.Job.batches``), the same for every backend and the reference.
The cell snapshots its state after the first step and after its *parity step* N
(``parity_step``), the first step after the backend's own warm-up (``min_warmup``, at least 2),
by when CUDA graphs replay, TorchScript runs its optimised graph and Adam has state: step 3 for
every built-in. Compared, each tensor on its own, against float64 eager after the same steps
(``reference.py``):

- every gradient of step 1 and of step N (Adam's update is blind to a gradient's scale, so a
  gradient 10 % too large only shows in the gradient; step 1's are pure rounding),
- every buffer after step 1 and step N (BatchNorm's running statistics and batch count),
- every weight after step N, against how far the reference's moved in step N (a skipped
  update, other Adam betas, another learning rate: its last update shows them at full size),
- every weight's update in step N alone (the row's weights after N less its own after N - 1)
  against the reference's: where training's earlier drift is larger than one update (bf16),
  the weight check can't see the update itself, this one can (``judged_keys``),
- the loss of every step 1..N;

and then the *trajectory*: the loss of every step the cell ran in its first round (warm-up and
measured steps included) against fp32 eager's over the same batches, so a backend that goes
wrong after the parity step (a recompile, a re-recorded graph, a bug that grows with optimizer
state) fails too. In inference the judged state is the forward's output at step 1 and step N
(different batches: a replayed output fails) and every buffer, and the trajectory is each
forward's largest output magnitude.

The rules, with ``s`` the tensor's *sensitivity* (the largest error of three correct fp32
computations: plain eager and two perturbed by 256 ulps; ``reference.py`` says why one is not
enough), scaled for every step after the first by ``f`` (below), and ``rtol`` the backend's
``parity_rtol`` (the room a correct fp32 algorithm change needs: NHWC convolutions, a fused
optimizer, inductor's reordered reductions):

- norm:  ``||t - ref|| / ||ref|| <= PARITY_MULTIPLIER * s + rtol`` (weights: over the
  reference's last update ``||ref - ref_before||``; outputs: over their spread
  ``||ref - mean(ref)||``, since a model's log-probabilities near initialisation are all about
  ``-ln(classes)`` and another batch's output differs from them by well under 1 %);
- scale: ``|<t - ref, ref>| / <ref, ref> <= PARITY_MULTIPLIER * s_scale + SCALE_RTOL``, the
  tensor's size along the reference's direction (weights: its last update's), ``s_scale`` the
  largest of the correct computations' own. Rounding is unbiased,
  so this stays small where the norm error of a reduced precision is large: it is what catches
  a bf16 gradient 10 % too large;

each of the two judged only where fp32 resolves it (its own fp32 sensitivity at most
``NOISE_REL``): a tensor's norm can be chaotic where its scale is steady;
- trajectory: each step's loss within ``PARITY_MULTIPLIER x d_k x f + rtol`` of fp32 eager's,
  ``d_k`` the perturbed fp32 runs' largest relative drift from plain fp32 up to step k.

``f`` is how far the row's own first step was from the reference (the median over its
first-step tensors of error ÷ sensitivity, at least 1): training amplifies a correct algorithm
change's first differences as it amplifies the perturbation's, and a row that matched eager's
rounding at step 1 is held to the tight limits.

A backend that declares a reduced ``precision`` (bf16, fp16) is held to the same rules with
``s`` raised to that precision's own error on the tensor, the larger of two eager runs under
autocast in that precision over the same steps, one of them perturbed by up to its unit
roundoff (a value may round to either neighbour): the room its precision needs, and no more. Every row's
*measured* precision is named from its first-step errors against the references of each
precision (``measured_precision``): a row that declares fp32 and computes in bf16 is said to.
"""
from __future__ import annotations

import math
import statistics
from typing import Any, Optional

import torch
from torch import nn

# Steps before the parity step, at least: stated in config, where the command line and the report read it
# without torch.
from ..config import PARITY_MIN_WARMUP
from ..records import Parity, StepCoverage
from .training import output_tensors, trained_parameters

#: A limit's multiple of the tensor's sensitivity. Measured at the default config after step 4:
#: channels-last's largest weight is 3.4 x fp32 eager's error (0.79 % vs 0.23 %); 5 keeps such a
#: correct backend under its limit where the sensitivity is fp32 eager's own.
PARITY_MULTIPLIER = 5.0


#: The scale test's tolerance beyond the sensitivity: rounding, in any precision, moves a
#: tensor's size along the reference by far less (measured: under 1 % for bf16 at the seed
#: config), a gradient 10 % too large moves it by 10 %.
SCALE_RTOL = 1e-2

#: A tensor whose fp32 sensitivity is above this is not judged: fp32 itself can't reproduce it
#: at this config (a conv bias before BatchNorm, whose gradient is zero in exact arithmetic and
#: whose Adam steps are then of random sign; at small batches, whatever a near-zero gradient's
#: sign decides after a few Adam steps). The report counts and names them.
NOISE_REL = 1e-2

#: Unit roundoff of each precision. Used only where the device has no reference in a declared
#: precision (autocast refused it): the sensitivity is then scaled by the ratio to fp32's.
UNIT_ROUNDOFF = {"fp32": 2.0**-24, "tf32": 2.0**-11, "bf16": 2.0**-8, "fp16": 2.0**-11}

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
    named = _named_parameters(model, trained)
    buffers = list(owner.buffers())
    buffer_names = [name for name, _ in model.named_buffers()]
    if len(buffer_names) != len(buffers):
        buffer_names = [f"buffer{i}" for i in range(len(buffers))]
    step = len(losses)
    first = step == 1
    state = {} if first else {f"loss:{k}": loss.detach().reshape(()) for k, loss in enumerate(losses, 1)}
    for name, p in named:
        state[f"step{step}/grad:{name}"] = p.grad.detach() if p.grad is not None else torch.zeros_like(p)
    if not first:  # after one Adam step a weight is w0 - lr * sign(g): nothing the gradients don't show
        state.update(weights_snapshot(model, trained, step))
    for name, b in zip(buffer_names, buffers):
        state[f"step{step}/buffer:{name}"] = b.detach()
    return state


def weights_snapshot(model: nn.Module, trained: Any, step: int) -> dict[str, torch.Tensor]:
    """The weights after ``step`` steps, by name (no copies): ``step<k>/weight:<name>``, as
    ``snapshot`` keys them. Taken after the step before the parity step, so that the row's own
    last update can be judged (``judged_keys``)."""
    return {f"step{step}/weight:{name}": p.detach() for name, p in _named_parameters(model, trained)}


def _named_parameters(model: nn.Module, trained: Any) -> list[tuple[str, torch.Tensor]]:
    """The parameters ``trained`` trains, named as ``model`` names them (``param<i>`` where a
    compiled or traced module holds them otherwise)."""
    params = trained_parameters(trained, model)
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    if len(names) != len(params):
        names = [f"param{i}" for i in range(len(params))]
    return list(zip(names, params))


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


#: Elements per piece when comparing on the CPU. A whole-tensor float64 difference of the
#: 51 M-parameter linear weight is a fresh 400 MB buffer whose page faults dominated: the
#: default config's comparison took 3.4 s whole and 0.15 s in pieces that stay in cache.
_CHUNK = 1 << 18

#: Per tensor: ||t - ref||^2, <t - ref, d>, ||d||^2, with d the reference's direction (the
#: tensor itself; for a weight, its last update).
Stat = tuple[float, float, float]


def _stat(t: torch.Tensor, ref: torch.Tensor, start: Optional[torch.Tensor], center: bool = False,
          before: Optional[torch.Tensor] = None) -> Stat:
    """``Stat`` in float64, summed in Python floats, one piece at a time on the CPU. Integer
    buffers (batch counts) are compared as numbers. ``center``: the direction is the reference
    less its mean (an output's spread, not its offset). ``before``: what is compared is the
    update ``t - before`` against the reference's ``ref - start`` (no copy of either is made)."""
    t, ref = t.reshape(-1), ref.reshape(-1)
    if center:
        start = torch.full_like(ref, float(ref.double().mean()) if ref.numel() else 0.0)
    start = None if start is None else start.reshape(-1)
    before = None if before is None else before.reshape(-1)
    chunk = _CHUNK if ref.device.type == "cpu" else max(ref.numel(), 1)
    diff_sq = cross = d_sq = 0.0
    for i in range(0, ref.numel(), chunk):
        r = ref[i:i + chunk].double()
        d = r if start is None else r - start[i:i + chunk].to(r.device).double()
        if before is None:
            diff = t[i:i + chunk].to(r.device).double() - r
        else:
            diff = t[i:i + chunk].to(r.device).double() - before[i:i + chunk].to(r.device).double() - d
        diff_sq += float(torch.dot(diff, diff))
        cross += float(torch.dot(diff, d))
        d_sq += float(torch.dot(d, d))
    return diff_sq, cross, d_sq


def rel_error(stat: Stat) -> float:
    """The norm-relative error (the absolute norm where the reference is zero)."""
    diff_sq, _, d_sq = stat
    return math.sqrt(diff_sq / d_sq) if d_sq > 0 else math.sqrt(diff_sq)


def scale_error(stat: Stat) -> float:
    """How far the tensor's size along the reference's direction is off, relatively."""
    diff_sq, cross, d_sq = stat
    return abs(cross) / d_sq if d_sq > 0 else math.sqrt(diff_sq)


def group(key: str) -> str:
    """``loss``, ``grad``, ``weight``, ``update``, ``buffer`` or ``output``."""
    return key.split("/")[-1].split(":", 1)[0]


def _start_key(key: str) -> Optional[str]:
    """A weight's key in the reference's ``init`` (its weights one step earlier), None for the rest."""
    return key if group(key) == "weight" else None


def _weight_key(update: str) -> str:
    """An update key's weight: ``step<N>/update:<name>`` -> ``step<N>/weight:<name>``."""
    return update.replace("/update:", "/weight:", 1)


def _before_key(update: str) -> str:
    """An update key's weight one step earlier: ``step<N>/update:<name>`` -> ``step<N-1>/weight:<name>``."""
    step, name = update.split("/update:", 1)
    return f"step{int(step[4:]) - 1}/weight:{name}"


def judged_keys(ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> list[str]:
    """What is judged against ``ref``: its every tensor, and for every weight after a parity step
    N whose value one step earlier ``start`` holds (``reference.weights_before``) the update step
    N made, ``step<N>/update:<name>``: the row's weights after N less its own after N - 1, against
    the reference's last update (``ref`` less ``start``). A state holds it as its two weights,
    ``step<N>/weight:`` and ``step<N-1>/weight:``.

    The weight check judges where training got to (its error over the reference's last update
    includes every earlier step's drift); this one judges the last update alone. In bf16 the drift
    hides what the update does: measured at batch 16, 14x14, bf16 eager's weights after step 3 were
    0.4-1.4 updates off float64, while Adam with betas (0.8, 0.99) made the last BatchNorm's update
    6 % larger in scale, where bf16 eager perturbed by an ulp moves it by under 0.2 %."""
    return list(ref) + [k.replace("/weight:", "/update:", 1) for k in ref if group(k) == "weight" and k in start]


def _present(key: str, state: dict) -> bool:
    return _weight_key(key) in state and _before_key(key) in state if group(key) == "update" else key in state


def stats(state: dict, ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor],
          only: Any = None) -> dict[str, Stat]:
    """``Stat`` of every judged tensor of ``ref`` that ``state`` holds (``present_keys``), or of
    ``only``; ``start`` holds the reference's weights one step before theirs
    (``reference.weights_before``)."""
    out = {}
    for key in (present_keys(state, ref, start) if only is None else only):
        if group(key) == "update":
            weight = _weight_key(key)
            out[key] = _stat(state[weight], ref[weight], start[weight], before=state[_before_key(key)])
        else:
            out[key] = _stat(state[key], ref[key], start.get(_start_key(key) or ""), center=group(key) == "output")
    return out


def present_keys(state: dict, ref: dict[str, torch.Tensor], start: dict[str, torch.Tensor]) -> list[str]:
    """The judged keys of ``ref`` that ``state`` holds (a one-step run holds step 1's only)."""
    return [k for k in judged_keys(ref, start) if _present(k, state)]


def errors(stats: dict[str, Stat]) -> tuple[dict[str, float], dict[str, float]]:
    """Per tensor, the norm-relative and the scale error."""
    return {k: rel_error(v) for k, v in stats.items()}, {k: scale_error(v) for k, v in stats.items()}


def group_errors(stats: dict[str, Stat]) -> dict[str, Optional[float]]:
    """Per group, the norm-relative error over the group's elements together (None: the mode has
    no tensors of it)."""
    sums: dict[str, list[float]] = {}
    for key, (diff_sq, _, d_sq) in stats.items():
        acc = sums.setdefault(group(key), [0.0, 0.0])
        acc[0] += diff_sq
        acc[1] += d_sq
    return {g: (rel_error((sums[g][0], 0.0, sums[g][1])) if g in sums else None) for g in _GROUPS}


def reference_name(name: str, inference: bool, steps: int, shards: int) -> str:
    name += " forward (eval mode)" if inference else f", {steps} steps"
    if shards > 1:
        name += f" over the same {shards} slices (DDP's averaged gradients, rank 0's buffers)"
    return name


def measured_precision(reference: dict, rel: dict[str, float]) -> Optional[str]:
    """The precision a row computed in, named from its first step's errors: the candidate (plain
    fp32 eager, or a reduced precision the reference computed) whose own errors on the same tensors are
    nearest the row's, by the median over tensors of the log ratio. None where no tensor tells
    (every first-step tensor is exact or unresolvable)."""
    sens, eager = reference["sens"], reference["eager_rel"]
    keys = [k for k in rel if k.startswith("step1/") and 0 < eager.get(k, 0) and sens[k] <= NOISE_REL]
    # fp32's own rounding, not the perturbed runs' (256 ulps would pull a bf16 row toward fp32)
    candidates = {"fp32": eager}
    candidates.update((p, data["rel"]) for p, data in reference["precisions"].items() if "rel" in data)
    tiny = 1e-30
    distance = {}
    for p, errors in candidates.items():
        logs = [math.log(max(rel[k], tiny) / max(errors[k], tiny)) for k in keys if k in errors]
        if logs:
            distance[p] = abs(statistics.median(logs))
    return min(distance, key=distance.__getitem__) if distance else None


def _sensitivities(reference: dict, precision: str) -> tuple[dict[str, float], dict[str, float], list[float], str]:
    """(norm, scale, trajectory drift) sensitivities a row of ``precision`` is held to, and a note
    on where they come from."""
    sens, scale, drift = dict(reference["sens"]), dict(reference["sens_scale"]), list(reference["drift"])
    if precision == "fp32":
        return sens, scale, drift, ""
    data = reference["precisions"].get(precision, {})
    if not data.get("full"):
        ratio = UNIT_ROUNDOFF[precision] / UNIT_ROUNDOFF["fp32"]
        return ({k: v * ratio for k, v in sens.items()}, {k: v * ratio for k, v in scale.items()},
                [d * ratio for d in drift], f" ({precision}: no {precision} reference here, fp32's x {ratio:g})")
    for key, value in data["rel"].items():
        sens[key] = max(sens[key], value)
        scale[key] = max(scale[key], data["scale"][key])
    drift = [max(a, b) for a, b in zip(drift, data["drift"])]
    return sens, scale, drift, f" (raised to eager {precision}'s own error)"


def coverage(keys: list[str], unresolved: list[str]) -> list[StepCoverage]:
    """Per judged step (a key's ``step<k>/`` prefix), its tensors and how many of them were judged."""
    steps: dict[int, list[int]] = {}
    for key in keys:
        if key.startswith("step") and "/" in key:
            counts = steps.setdefault(int(key[4:key.index("/")]), [0, 0])
            counts[1] += 1
            counts[0] += key not in unresolved
    return [StepCoverage(step, judged, total) for step, (judged, total) in sorted(steps.items())]


def _misfit(got: dict[str, torch.Tensor], ref: dict[str, torch.Tensor],
            start: dict[str, torch.Tensor]) -> Optional[tuple[str, Any, tuple]]:
    """The first tensor judging needs that ``got`` lacks or holds in another shape: (its key, its
    shape or "missing", the shape expected); None when every one is there."""
    for key in judged_keys(ref, start):
        needed = (_weight_key(key), _before_key(key)) if group(key) == "update" else (key,)
        shape = tuple(ref[needed[0]].shape)
        for have in needed:
            if have not in got or tuple(got[have].shape) != shape:
                return have, tuple(got[have].shape) if have in got else "missing", shape
    return None


def compare_with_reference(got: dict[str, torch.Tensor], reference: dict, rtol: float, step: int,
                           precision: str = "fp32", losses: Optional[list[float]] = None) -> Parity:
    """Judge a row's snapshots (``snapshot``/``output_snapshot`` after step 1 and ``step``) and,
    when given, every step's ``losses`` (inference: output summaries) against the reference, by
    the module's rules for the row's declared ``precision``."""
    ref = reference["ref"]
    present = {group(k) for k in ref}
    misfit = _misfit(got, ref, reference["init"])
    if misfit is not None:
        key, found, shape = misfit
        return Parity(passed=False, reference=reference["name"], multiplier=PARITY_MULTIPLIER, tolerance=rtol,
                      loss_rel_error=None, grad_rel_error=None, weight_rel_error=None,
                      eager_loss_rel_error=None, eager_grad_rel_error=None, eager_weight_rel_error=None,
                      worst_tensor=key, worst_error=math.nan, worst_limit=math.nan, margin=math.inf, step=step,
                      detail=f"{key} is {found}, expected shape {shape}",
                      buffer_rel_error=math.nan if "buffer" in present else None,
                      output_rel_error=math.nan if "output" in present else None)
    judged = stats(got, ref, reference["init"])
    sens, sens_scale, drift, source = _sensitivities(reference, precision)
    worst: tuple[float, str, float, float, str] = (-1.0, "", 0.0, 0.0, "")
    # Each check is judged where fp32 itself resolves it: a tensor's norm can be chaotic (Adam's
    # sign of a near-zero gradient, a flipped ReLU) while its size along the reference is steady.
    # Measured at batch 16, 14x14: the perturbed fp32 runs put the step-1 gradient of the largest
    # weight 1.35 % off float64 in norm but 7.5e-5 in scale; judging neither let a bf16 gradient
    # 10 % too large pass. A tensor is not judged only where neither check resolves.
    norm_unresolved = {key for key in judged if reference["sens"][key] > NOISE_REL}
    scale_unresolved = {key for key in judged if reference["sens_scale"][key] > NOISE_REL}
    unresolved = [key for key in judged if key in norm_unresolved and key in scale_unresolved]
    # How far this row's first step already was from the reference, in units of its sensitivity
    # (the median over step 1's tensors, at least 1). A correct algorithm change starts further out
    # than the perturbed runs (NHWC convolutions on this CPU: 0.36 % on a step-1 gradient where 16
    # ulps move it 1e-6), and training amplifies both alike: later steps' sensitivities scale by it.
    # A row that matched eager's rounding at step 1 keeps the tight limits; a row wrong at step 1
    # fails there.
    first = [rel_error(judged[k]) / sens[k] for k in judged
             if k.startswith("step1/") and k not in norm_unresolved and sens[k] > 0]
    first_step_factor = max(1.0, statistics.median(first)) if first else 1.0
    for key, stat in judged.items():
        later = 1.0 if key.startswith("step1/") else first_step_factor
        norm_limit = PARITY_MULTIPLIER * sens[key] * later + rtol
        scale_limit = PARITY_MULTIPLIER * sens_scale[key] * later + SCALE_RTOL
        for check, error, most in (("", rel_error(stat), norm_limit), ("scale of ", scale_error(stat), scale_limit)):
            if key in (scale_unresolved if check else norm_unresolved):
                continue
            ratio = error / most if math.isfinite(error) else math.inf
            if ratio > worst[0]:
                worst = (ratio, key, error, most, check)
    checked = 0
    if losses is not None:
        checked = min(len(losses), len(reference["losses"]))
        for k in range(checked):
            base = reference["losses"][k]
            error = abs(losses[k] - base) / max(abs(base), 1e-12) if math.isfinite(losses[k]) else math.inf
            most = PARITY_MULTIPLIER * drift[k] * first_step_factor + rtol
            if error / most > worst[0]:
                worst = (error / most, f"trajectory:{k + 1}", error, most, "")
    ratio, key, error, most, check = worst
    what = "output summary" if "output" in present else "loss"
    detail = None
    if ratio > 1.0 and key.startswith("trajectory:"):
        detail = (f"the {what} of step {key.split(':')[1]} is {error:.3g} off fp32 eager's over the same batches; "
                  f"the limit is {PARITY_MULTIPLIER:g} x the perturbed fp32 run's drift so far x {first_step_factor:.3g} (how far "
                  f"this row's first step was from the reference, in sensitivities) + {rtol:g}"
                  f"{source} = {most:.3g}")
    elif ratio > 1.0:
        kind = "scale error" if check else "relative error"
        detail = (f"{check}{key} after step {step if not key.startswith('step1/') else 1}: {kind} {error:.3g} vs "
                  f"{reference['name']} exceeds {PARITY_MULTIPLIER:g} x its sensitivity{source} + "
                  f"{SCALE_RTOL if check else rtol:g} = {most:.3g}")
    groups = group_errors(judged)
    eager_groups = reference["eager_groups"]
    rel, _ = errors(judged)
    return Parity(
        passed=ratio <= 1.0,
        reference=reference["name"],
        multiplier=PARITY_MULTIPLIER,
        tolerance=rtol,
        loss_rel_error=groups["loss"],
        grad_rel_error=groups["grad"],
        weight_rel_error=groups["weight"],
        buffer_rel_error=groups["buffer"],
        output_rel_error=groups["output"],
        eager_loss_rel_error=eager_groups.get("loss"),
        eager_grad_rel_error=eager_groups.get("grad"),
        eager_weight_rel_error=eager_groups.get("weight"),
        eager_buffer_rel_error=eager_groups.get("buffer"),
        eager_output_rel_error=eager_groups.get("output"),
        worst_tensor=check + key,
        worst_error=error,
        worst_limit=most,
        margin=max(ratio, 0.0),
        step=step,
        tensors=len(judged) - len(unresolved),
        not_judged=unresolved,
        coverage=coverage(list(judged), unresolved),
        trajectory_steps=checked or None,
        precision=measured_precision(reference, rel),
        declared_precision=precision,
        random=bool(reference.get("random")),
        detail=detail,
    )
