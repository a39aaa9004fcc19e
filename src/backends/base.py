"""What the harness requires of a backend, and what it may optionally offer.

The required contract is two members, ``name`` and ``compile``. Everything
else is optional: the harness reads it through the helpers below, which
supply the documented default, so a backend with only ``name`` and
``compile`` keeps working as the optional set grows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol

if TYPE_CHECKING:  # torch is imported lazily: `cnncompare --help` should not pay for it
    import torch

#: Default relative tolerance of the parity check (see ``parity_rtol``, and docs/parity.md for
#: the measurements behind it): the room a correct fp32 algorithm change needs beyond fp32
#: eager's own error, well under the 10 % gradient error and the skipped update that must fail.
#: The largest such change measured: channels-last's NHWC convolutions on the CPU put the
#: first step's gradient of seed-cnn's largest weight 0.36 % off float64 (fp32 eager's:
#: 3e-7), so 1 % leaves it at about a third of its limit.
DEFAULT_PARITY_RTOL = 1e-2

#: What a backend's matmuls and convolutions compute in (``precision``): the peak its % of peak
#: is held against is probed in the same precision (``core/cell/roofline.py``).
PRECISIONS = ("fp32", "bf16", "fp16")


class NotApplicable(Exception):
    """The backend does not apply to this workload (its message says why); the cell is ``skipped``."""


class Backend(Protocol):
    """A way of turning the workload's model into something faster to train.

    Required members:

    ``name: str``
        Unique across all plugins; used by ``--backends`` and shown in
        reports. Letters, digits and ``-_.:+`` only (no commas or spaces).
    ``compile(model, example, device) -> callable``
        Returns a callable ``f(x) -> output`` (what ``model(x)`` returns,
        fed to the workload's loss) that trains ``model``'s parameters (returning ``model`` itself is the eager
        baseline). ``example`` is an input batch already on ``device`` (a
        ``torch.device``); ``model`` is already on ``device`` and in train
        mode. The harness times this call as ``compile_s``; any lazy work
        (``torch.compile`` compiles on the first call) lands in
        ``first_step_s``. If the result is an ``nn.Module``, the optimizer is
        built over its parameters, else over ``model``'s. ``compile`` may
        run the model on ``example`` (a trace does); the harness then puts
        ``model``'s buffers (BatchNorm's running statistics) back as they
        were, in place, so such runs don't count as training.

    Optional members (default in brackets):

    ``description: str`` [``""``]
        One line for ``--list`` and the report.
    ``use_it: str`` [the description, with where it comes from]
        The code a user writes to get what the row measured, in one line:
        ``torch.optim.Adam(model.parameters(), lr=0.001, fused=True)``,
        ``model = torch.compile(model)``. ``{device}`` in it stands for the
        device's type (``cpu``, ``cuda``). The summary prints the pick's;
        ``cnncompare list backends`` shows every backend's.
    ``unavailable_reason(device) -> str | None`` [always ``None``]
        ``None`` when the backend can run on ``device``; otherwise why not.
        Cells it refuses are reported as ``skipped`` with that reason.
    ``min_warmup: int`` [``0``]
        Warm-up steps the backend needs before its steady state (TorchScript's
        profiling executor needs two). The harness runs
        ``max(--warmup, min_warmup)``.
    ``compile_step(step, example, device) -> callable`` [absent]
        Called after ``compile`` with the whole training step
        ``step(x, y) -> loss`` (per micro-batch forward, the workload's loss and backward, then
        the recipe's clipping and the optimizer step: ``core/cell/training.py``);
        returns a replacement with the same signature, e.g. the step compiled
        as one function. Its wall time is added to ``compile_s``. The recipe's scheduler is
        stepped after it, outside it, as a training loop does.
    ``make_train_step(forward, optimizer, loss_fn, recipe=..., params=...) -> callable`` [absent]
        Replaces the harness's train-step protocol, e.g. to add loss scaling.
        The result ``step(x, y)`` must do what the harness's does (forward, ``loss_fn``,
        zero_grad, backward per micro-batch, clipping ``params`` where ``recipe`` clips, the
        optimizer step) and return the loss (detached, as a tensor: no ``.item()``, which would
        synchronise inside the timed loop). ``recipe`` (``cnncompare.Recipe``) and ``params``
        are passed only when the function takes them; one that doesn't is ``skipped`` for a
        recipe that clips or accumulates (it would skip them).
    ``adapt_optimizer(optimizer) -> torch.optim.Optimizer`` [absent: the workload's own]
        Given the workload's optimizer (its recipe's, built over the trained parameters),
        returns the one the backend trains with: the same class and hyperparameters with the
        backend's change (``fused=True``, a tensor lr so a compiled step does not recompile),
        usually ``rebuild_optimizer(optimizer, fused=True)``, which raises ``NotApplicable``
        where the class takes no such argument. The recipe's scheduler is built over the result.
        Parity compares against the workload's optimizer unchanged.
    ``make_optimizer(params, lr) -> torch.optim.Optimizer`` [absent]
        The older form of ``adapt_optimizer``: builds the Adam at ``lr`` the backend needs. Used
        only where the workload keeps the default recipe (Adam at ``--lr``); on a workload with
        an optimizer of its own the cell is ``skipped`` with the reason.
    ``prepare_input(x) -> x`` [identity]
        Converts the input batch once, before ``compile`` and outside any
        timed region (e.g. to ``torch.channels_last``), as a data loader would.

    A backend that does not apply to the workload it is given (channels-last
    on token ids) raises ``NotApplicable("why")`` from ``prepare_input``,
    ``compile`` or ``compile_step``: the cell is ``skipped`` with that reason.
    ``in_all: bool`` [``True``]
        Whether ``--backends all`` includes the backend. Bridges that offer
        many experimental backends set it False; users name them explicitly
        or with a pattern (``--backends all,dynamo:*``).
    ``parity_rtol: float`` [``1e-2``]
        Relative tolerance of the parity check: each compared tensor (every
        step's loss; every gradient, weight and buffer after the parity step)
        passes when its norm-relative error against float64 eager after the
        same steps is at most 5 x its sensitivity (the largest error of three
        correct fp32 computations) + this, and every later step's loss within
        5 x fp32's own drift + this (docs/parity.md). It is the room a correct
        algorithm change needs; a reduced precision's own error is measured, not
        declared (``precision``). Keep it small enough to catch a skipped update
        and a 10 % gradient error.
    ``modes: tuple[str, ...]`` [``("train", "inference")``]
        The ``--mode`` values the backend applies to; in another its cells
        are ``skipped`` with the reason. A backend whose difference lives in
        the training step (``adapt_optimizer``, ``compile_step``) is
        ``("train",)``; a deploy path (an exported or frozen graph) is
        ``("inference",)``.
    ``inference_context: str`` [``"inference_mode"``]
        In inference the harness runs each forward under
        ``torch.inference_mode()``; ``"no_grad"`` asks for
        ``torch.no_grad()`` instead (for compilers that can't take
        inference tensors). In inference ``compile`` is called with the
        model in ``eval()`` mode under ``torch.no_grad()``, and the train-step
        members above are not used (docs/inference.md).
    ``precision: str`` [``"fp32"``]
        What the step's matmuls and convolutions compute in: ``fp32``,
        ``bf16`` or ``fp16`` (mixed precision under autocast). The row's
        % of peak is held against a peak probed in that precision (fp32 rows
        on CUDA against what their convolutions and matmuls run in, TF32 or
        fp32, by torch's flags), and each parity limit is raised to eager's
        own error under autocast in that precision on the same tensor. The
        report also names the precision the row *measured* as computing in.
    ``own_allocator: bool`` [``False``]
        True where the backend's device memory lives in an allocator of its own (ONNX Runtime's
        arena), which torch's CUDA peaks can't see: on CUDA its memory figures are then marked
        not comparable and no "memory vs eager" is computed for it.
    ``configure(options: dict) -> None`` [absent: the backend takes no options]
        Takes the options given as ``--backend-option NAME:KEY=VALUE`` (values
        parsed as JSON literals where they are one: ``true``, ``3``, ``"x"``;
        else kept as text), before ``compile``, in the parent (where a raised
        ``ValueError`` or ``TypeError`` refuses the command line) and again in
        each cell. The dynamo bridge passes them to ``torch.compile(...,
        options=...)``. The report's configuration records them.
    """

    name: str

    def compile(self, model: "torch.nn.Module", example: "torch.Tensor", device: "torch.device") -> Callable[..., Any]:
        ...


#: ``inference_context`` values, and the grad mode each names.
INFERENCE_CONTEXTS = ("inference_mode", "no_grad")


def modes(backend: Any) -> tuple[str, ...]:
    return tuple(getattr(backend, "modes", ("train", "inference")))


def mode_reason(backend: Any, mode: str) -> Optional[str]:
    """Why ``backend`` doesn't apply in ``mode`` (``--mode``), or None."""
    supported = modes(backend)
    if mode in supported:
        return None
    return f"{getattr(backend, 'name', backend)} runs in {' and '.join(supported) or 'no'} mode only, not {mode}"


def inference_context(backend: Any) -> "Any":
    """The grad mode each inference forward runs under: a fresh context manager."""
    import torch

    value = str(getattr(backend, "inference_context", "inference_mode"))
    if value not in INFERENCE_CONTEXTS:
        raise ValueError(f"backend {getattr(backend, 'name', backend)!r}: inference_context {value!r} is not one of "
                         f"{', '.join(INFERENCE_CONTEXTS)}")
    return torch.inference_mode() if value == "inference_mode" else torch.no_grad()


def configure(backend: Any, options: "Mapping[str, Any]") -> None:
    """Hand ``options`` to the backend's ``configure``; a backend without one takes none."""
    if not options:
        return
    take = getattr(backend, "configure", None)
    if take is None:
        raise ValueError(f"backend {getattr(backend, 'name', backend)!r} takes no options (it has no configure())")
    take(dict(options))


def description(backend: Any) -> str:
    return str(getattr(backend, "description", "") or "")


def default_optimizer(lr: float = 1e-3) -> str:
    """The harness's optimizer for a workload that names none, Adam at ``lr`` (``--lr``), as a
    report's recipe and a ``use_it`` line's ``{optimizer}`` spell it."""
    return f"Adam(lr={lr:g})"


def use_it(backend: Any, device: str = "{device}", plugin: Optional[str] = None,
           optimizer: Optional[str] = None) -> str:
    """The backend's ``use_it`` line with ``{device}`` as ``device``'s type and ``{optimizer}`` as
    the workload's optimizer built over the model's parameters, its closing bracket left to the
    line (``optimizer``: the class and the hyperparameters it sets as the report's recipe names
    it, ``SGD(lr=0.1, momentum=0.9)`` for ``torch.optim.SGD(model.parameters(), lr=0.1,
    momentum=0.9``; by default ``default_optimizer()``);
    without a line, the backend's description and the plugin to read about it (a plugin need not
    declare the line)."""
    line = str(getattr(backend, "use_it", "") or "")
    if line:
        cls, _, args = (optimizer or default_optimizer()).partition("(")
        built = f"torch.optim.{cls}(model.parameters()" + (f", {args[:-1]}" if args[:-1] else "")
        return line.replace("{device}", device.split(":", 1)[0]).replace("{optimizer}", built)
    where = f"plugin {plugin!r}" if plugin else "its plugin"
    about = description(backend)
    return f"(no code line declared; see {where}'s documentation{': ' + about if about else ''})"


def unavailable_reason(backend: Any, device: "torch.device") -> Optional[str]:
    """Why ``backend`` can't run on ``device``, or None; a raising check counts as a reason."""
    check = getattr(backend, "unavailable_reason", None)
    if check is None:
        return None
    try:
        reason = check(device)
    except Exception as exc:  # a broken check must not stop the run
        return f"unavailable_reason() raised {type(exc).__name__}: {exc}"
    return None if reason is None else str(reason)


def min_warmup(backend: Any) -> int:
    return max(0, int(getattr(backend, "min_warmup", 0) or 0))


def parity_rtol(backend: Any) -> float:
    return float(getattr(backend, "parity_rtol", DEFAULT_PARITY_RTOL))


def precision(backend: Any) -> str:
    value = str(getattr(backend, "precision", "fp32"))
    if value not in PRECISIONS:
        raise ValueError(f"backend {getattr(backend, 'name', backend)!r}: precision {value!r} is not one of "
                         f"{', '.join(PRECISIONS)}")
    return value


def step_compiler(backend: Any) -> Optional[Callable[..., Any]]:
    return getattr(backend, "compile_step", None)


def step_maker(backend: Any) -> Optional[Callable[..., Any]]:
    return getattr(backend, "make_train_step", None)


def optimizer_maker(backend: Any) -> Optional[Callable[..., Any]]:
    return getattr(backend, "make_optimizer", None)


def optimizer_adapter(backend: Any) -> Optional[Callable[..., Any]]:
    return getattr(backend, "adapt_optimizer", None)


def rebuild_optimizer(optimizer: "torch.optim.Optimizer", **changes: Any) -> "torch.optim.Optimizer":
    """A new optimizer of ``optimizer``'s class over the same parameter groups, with the same
    hyperparameters except ``changes`` (each a keyword argument of the class: ``fused=True``;
    a callable value maps the group's old value to the new one: ``lr=torch.tensor``). Call it
    before any step (the state is not carried). Raises ``NotApplicable`` where the class takes
    no such argument or refuses the combination."""
    import inspect

    cls = type(optimizer)
    accepted = inspect.signature(cls).parameters
    for key in changes:
        if key not in accepted:
            raise NotApplicable(f"the workload's optimizer, torch.optim.{cls.__name__}, takes no {key}=")

    def changed(group: dict) -> dict:
        return {**group, **{k: (v(group[k]) if callable(v) else v) for k, v in changes.items()}}

    # The groups carry every hyperparameter; the constructor's defaults only fill what they lack.
    # A value (fused=True) is given to the constructor too, which checks it and sets up for it.
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted and k != "params" and k not in changes}
    defaults.update((k, v) for k, v in changes.items() if not callable(v))
    try:
        return cls([changed(g) for g in optimizer.param_groups], **defaults)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise NotApplicable(f"{cls.__qualname__} refuses {', '.join(changes)}: {exc}") from None


def prepare_input(backend: Any, x: "torch.Tensor") -> "torch.Tensor":
    convert = getattr(backend, "prepare_input", None)
    return convert(x) if convert is not None else x


def own_allocator(backend: Any) -> bool:
    return bool(getattr(backend, "own_allocator", False))


def in_all(backend: Any) -> bool:
    return bool(getattr(backend, "in_all", True))
