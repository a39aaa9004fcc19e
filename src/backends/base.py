"""What the harness requires of a backend, and what it may optionally offer.

The required contract is two members, ``name`` and ``compile``. Everything
else is optional: the harness reads it through the helpers below, which
supply the documented default, so a backend with only ``name`` and
``compile`` keeps working as the optional set grows.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

if TYPE_CHECKING:  # torch is imported lazily: `cnncompare --help` should not pay for it
    import torch

#: Default absolute floor for the parity check (see ``parity_tolerance``): the floor of
#: PyTorch's dynamo benchmark harness for training (tol 1e-3, applied as tol / 10). A plain
#: fp32 algorithm change must pass: NHWC convolutions (channels-last) moved a conv weight by
#: 8.7e-5 RMSE after the first Adam step at the seed config, where eager's own error was 5.7e-6
#: (Adam's first update is +-lr whatever the gradient's size, so a near-zero gradient whose
#: sign flips moves its weight by 2e-3).
DEFAULT_PARITY_TOLERANCE = 1e-4


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
        built over its parameters, else over ``model``'s.

    Optional members (default in brackets):

    ``description: str`` [``""``]
        One line for ``--list`` and the report.
    ``unavailable_reason(device) -> str | None`` [always ``None``]
        ``None`` when the backend can run on ``device``; otherwise why not.
        Cells it refuses are reported as ``skipped`` with that reason.
    ``min_warmup: int`` [``0``]
        Warm-up steps the backend needs before its steady state (TorchScript's
        profiling executor needs two). The harness runs
        ``max(--warmup, min_warmup)``.
    ``compile_step(step, example, device) -> callable`` [absent]
        Called after ``compile`` with the whole training step
        ``step(x, y) -> loss`` (forward, the workload's loss, zero_grad,
        backward, Adam);
        returns a replacement with the same signature, e.g. the step compiled
        as one function. Its wall time is added to ``compile_s``.
    ``make_train_step(forward, optimizer, loss_fn) -> callable`` [absent]
        Replaces the harness's train-step protocol, e.g. to add loss scaling.
        The result ``step(x, y)`` must do forward, ``loss_fn``, zero_grad,
        backward and the optimizer step, and return the loss (detached, as a
        tensor: no ``.item()``, which would synchronise inside the timed loop).
    ``make_optimizer(params, lr) -> torch.optim.Optimizer`` [absent]
        Builds the Adam optimizer over ``params`` with learning rate ``lr``
        the backend needs (``fused=True``, or a tensor ``lr`` so a compiled
        step does not recompile). It must stay Adam at ``lr``: the parity check
        compares against plain Adam.
    ``prepare_input(x) -> x`` [identity]
        Converts the input batch once, before ``compile`` and outside any
        timed region (e.g. to ``torch.channels_last``), as a data loader would.
    ``in_all: bool`` [``True``]
        Whether ``--backends all`` includes the backend. Bridges that offer
        many experimental backends set it False; users name them explicitly
        or with a pattern (``--backends all,dynamo:*``).
    ``parity_tolerance: float`` [``1e-4``]
        Absolute RMSE floor of the parity check: a compared tensor passes
        when its RMSE against a float64 eager reference is at most
        3 x fp32 eager's own RMSE + this tolerance. Raise it for reduced
        precision backends, and say why in ``description``.
    """

    name: str

    def compile(self, model: "torch.nn.Module", example: "torch.Tensor", device: "torch.device") -> Callable[..., Any]:
        ...


def description(backend: Any) -> str:
    return str(getattr(backend, "description", "") or "")


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


def parity_tolerance(backend: Any) -> float:
    return float(getattr(backend, "parity_tolerance", DEFAULT_PARITY_TOLERANCE))


def step_compiler(backend: Any) -> Optional[Callable[..., Any]]:
    return getattr(backend, "compile_step", None)


def step_maker(backend: Any) -> Optional[Callable[..., Any]]:
    return getattr(backend, "make_train_step", None)


def optimizer_maker(backend: Any) -> Optional[Callable[..., Any]]:
    return getattr(backend, "make_optimizer", None)


def prepare_input(backend: Any, x: "torch.Tensor") -> "torch.Tensor":
    convert = getattr(backend, "prepare_input", None)
    return convert(x) if convert is not None else x


def in_all(backend: Any) -> bool:
    return bool(getattr(backend, "in_all", True))
