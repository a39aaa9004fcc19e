"""What the harness requires of a workload, and the helpers that read its optional members.

A workload is what every backend trains, the same for all of them: a model,
a seeded batch, a loss and its training recipe (``Recipe``: the optimizer, the LR scheduler,
gradient clipping, gradient accumulation). The harness owns everything else: seeding, the
device and dtype, sharding a batch among DDP ranks and the step protocol
(``core/cell/training.py``), which follows the recipe in every cell and in the parity reference.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Protocol

if TYPE_CHECKING:  # torch is imported lazily: `cnncompare --help` should not pay for it
    import torch

#: The value types a workload option may have (its default's type is the option's type).
OPTION_TYPES = (bool, int, float, str)


class Workload(Protocol):
    """A model to train, how to make a batch for it, and its loss.

    Required members:

    ``name: str``
        Unique across all plugins; used by ``--workload`` and shown in
        reports. Letters, digits and ``-_.:+`` only.
    ``sample_unit: str``
        What one sample is, singular ("image", "sequence"): throughput is
        reported in these per second.
    ``options: Mapping[str, bool | int | float | str]``
        Every option the workload takes, with its default. A value given by
        the user must have the default's type.
    ``build_model(options) -> torch.nn.Module``
        The model, on the CPU in float32. The harness seeds torch first
        (so the weights are the same in every cell), then moves the model to
        the cell's device and dtype (float64 for the parity reference) and
        puts it in train mode.
    ``make_batch(options, n, generator, device) -> (inputs, targets)``
        ``n`` samples drawn from ``generator`` (a ``torch.Generator`` on
        ``device``, seeded by the harness), created on ``device``. Under DDP
        the harness asks for the global batch and gives each rank its slice
        along the first dimension. Floating-point inputs and targets are
        converted to the reference's dtype by the harness; integer ones (token
        ids, class ids) are left alone.
    ``loss(output, targets) -> torch.Tensor``
        A scalar loss of the model's output, averaged over the batch.

    Optional members (default in brackets):

    ``description: str`` [``""``]
        One line for ``--list`` and the report.
    ``check_options(options) -> None`` [no check beyond types]
        Raises ``ValueError("<option>: <what is wrong>")`` for a value the
        workload can't take (a zero image size); called with every option
        filled in, before any cell runs.
    ``throughput_unit: str`` [``sample_unit``]
        What throughput counts when a sample holds several of them ("token"
        for a sequence of tokens).
    ``units_per_sample(options) -> int`` [``1``]
        How many ``throughput_unit`` one sample holds (the sequence length).
    ``recipe(options) -> Recipe`` [``Recipe()``: Adam at ``--lr``, nothing else]
        How the workload trains: its optimizer, scheduler, clipping and accumulation.
    ``loop(options) -> Mapping[str, int]`` [``{}``: ``core.config.LoopSpec``'s defaults]
        The training loop its rows' ``loop`` figures project, keyed as ``--loop`` is
        (``epoch_steps``, ``last_batch``, ``eval_every``, ``eval_steps``, ``epochs``);
        ``--loop`` overrides it key by key.
    """

    name: str
    sample_unit: str
    options: Mapping[str, Any]

    def build_model(self, options: Mapping[str, Any]) -> "torch.nn.Module":
        ...

    def make_batch(self, options: Mapping[str, Any], n: int, generator: "torch.Generator",
                   device: "torch.device") -> tuple["torch.Tensor", "torch.Tensor"]:
        ...

    def loss(self, output: "torch.Tensor", targets: "torch.Tensor") -> "torch.Tensor":
        ...


def check_positive(options: Mapping[str, Any], keys: Any) -> None:
    """Raise ``ValueError("<key>: must be positive, ...")`` for the first of ``keys`` below 1 (the
    built-in workloads' options are all sizes and counts)."""
    for key in keys:
        if options[key] < 1:
            raise ValueError(f"{key}: must be positive, got {options[key]}")


def image_batch(n: int, channels: int, size: int, classes: int, generator: "torch.Generator",
                device: "torch.device") -> tuple["torch.Tensor", "torch.Tensor"]:
    """``n`` images of ``channels x size x size`` from N(0, 1) and uniform labels below
    ``classes``, drawn from ``generator`` on ``device`` (images first, then labels)."""
    import torch

    x = torch.randn((n, channels, size, size), generator=generator, device=device)
    y = torch.randint(0, classes, (n,), generator=generator, device=device)
    return x, y


@dataclass(frozen=True)
class Recipe:
    """How a workload trains, followed by every backend's cell and by the float64 reference.

    ``optimizer(params) -> torch.optim.Optimizer``
        Builds the optimizer over the parameters a backend trains (``None``: Adam at ``--lr``).
        A backend that changes the optimizer (``fused=True``, a tensor learning rate) rebuilds
        this one with its change (``backends.base.rebuild_optimizer``).
    ``scheduler(optimizer) -> LR scheduler`` [none]
        Built over the optimizer the backend trains with; stepped after every optimizer step.
    ``clip_grad_norm`` [none]
        ``torch.nn.utils.clip_grad_norm_`` of the trained parameters to this norm, after the
        backward and before the optimizer step.
    ``accumulation_steps`` [1]
        Micro-batches per optimizer step: each of ``--batch-size`` samples, its loss divided by
        this many before its backward. One timed step is one optimizer step, so it trains on
        ``batch_size * accumulation_steps`` samples (throughput counts them all).
    """

    optimizer: Optional[Callable[..., Any]] = None
    scheduler: Optional[Callable[..., Any]] = None
    clip_grad_norm: Optional[float] = None
    accumulation_steps: int = 1

    def split(self, x: Any, y: Any) -> list[tuple[Any, Any]]:
        """A training step's batch as its ``accumulation_steps`` micro-batches (views along the
        first dimension), in the order the step runs them."""
        if self.accumulation_steps == 1:
            return [(x, y)]
        return list(zip(x.chunk(self.accumulation_steps), y.chunk(self.accumulation_steps)))

    def build_optimizer(self, params: Any, lr: float) -> Any:
        """The optimizer over ``params``: the recipe's, else Adam at ``lr``. Raises ``TypeError``
        where the recipe's returns something else than a ``torch.optim.Optimizer``."""
        import torch

        optimizer = self.optimizer(params) if self.optimizer is not None else torch.optim.Adam(params, lr=lr)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"the recipe's optimizer returned {type(optimizer).__name__}; expected a "
                            f"torch.optim.Optimizer")
        return optimizer

    def check(self, owner: str) -> None:
        """Raise ``ValueError`` naming what ``owner``'s recipe gets wrong."""
        for name in ("optimizer", "scheduler"):
            if getattr(self, name) is not None and not callable(getattr(self, name)):
                raise ValueError(f"{owner}: {name} must be a callable, got {type(getattr(self, name)).__name__}")
        clip = self.clip_grad_norm
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or not clip > 0):
            raise ValueError(f"{owner}: clip_grad_norm must be a positive number or None, got {clip!r}")
        steps = self.accumulation_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"{owner}: accumulation_steps must be a positive int, got {steps!r}")


def recipe_of(workload: Any, options: Mapping[str, Any]) -> Recipe:
    """The workload's ``Recipe`` for ``options`` (``Recipe()`` where it declares none), checked."""
    member = getattr(workload, "recipe", None)
    found = Recipe() if member is None else member(options)
    if not isinstance(found, Recipe):
        raise ValueError(f"workload {workload.name!r}: recipe() returned {type(found).__name__}; expected "
                         f"cnncompare.Recipe")
    found.check(f"workload {workload.name!r}")
    return found


def loop_of(workload: Any, options: Mapping[str, Any]) -> dict[str, Any]:
    """The loop keys the workload declares for ``options`` (``{}`` where it declares none)."""
    member = getattr(workload, "loop", None)
    found = {} if member is None else member(options)
    if not isinstance(found, Mapping):
        raise ValueError(f"workload {workload.name!r}: loop() returned {type(found).__name__}; expected a mapping "
                         f"of --loop keys to whole numbers")
    return dict(found)


def describe_optimizer(optimizer: Any) -> str:
    """``SGD(lr=0.1, momentum=0.9)``: the class and every hyperparameter its first group sets
    away from the class's own default (a tensor learning rate as its value)."""
    cls = type(optimizer)
    try:
        defaults = {p.name: p.default for p in inspect.signature(cls).parameters.values()}
    except (TypeError, ValueError):
        defaults = {}
    group = optimizer.param_groups[0] if optimizer.param_groups else {}
    shown = []
    for key, value in group.items():
        if key == "params" or key not in defaults:
            continue
        if hasattr(value, "item") and getattr(value, "numel", lambda: 0)() == 1:
            value = value.item()
        if value != defaults[key]:
            shown.append(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}")
    return f"{cls.__name__}({', '.join(shown)})"


class OptionError(ValueError):
    """A workload option the workload can't take; ``key`` names it."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key
        self.message = message


def description(workload: Any) -> str:
    return str(getattr(workload, "description", "") or "")


def throughput_unit(workload: Any) -> str:
    return str(getattr(workload, "throughput_unit", None) or workload.sample_unit)


def units_per_sample(workload: Any, options: Mapping[str, Any]) -> int:
    count = getattr(workload, "units_per_sample", None)
    return 1 if count is None else int(count(options))


def resolve_options(workload: Any, given: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of ``workload``: its defaults overridden by ``given``, checked.

    Raises ``OptionError`` for an unknown option, a value of another type
    than its default's, or one the workload's ``check_options`` refuses.
    """
    defaults = dict(workload.options)
    for key, value in given.items():
        if key not in defaults:
            known = ", ".join(defaults) or "none"
            raise OptionError(key, f"workload {workload.name!r} has no such option (its options: {known})")
        expected = type(defaults[key])
        if isinstance(value, bool) != (expected is bool) or not isinstance(value, expected):
            if not (expected is float and isinstance(value, int) and not isinstance(value, bool)):
                raise OptionError(key, f"expected {expected.__name__}, got {value!r}")
            value = float(value)
        defaults[key] = value
    check = getattr(workload, "check_options", None)
    if check is not None:
        try:
            check(dict(defaults))
        except OptionError:
            raise
        except ValueError as exc:
            key, _, message = str(exc).partition(": ")
            raise OptionError(key, message or str(exc)) from None
    return defaults


def check_contract(workload: Any) -> None:
    """Raise ``ValueError`` naming what a registered workload lacks."""
    name = getattr(workload, "name", None)
    for member in ("build_model", "make_batch", "loss"):
        if not callable(getattr(workload, member, None)):
            raise ValueError(f"workload {name!r} has no callable {member}")
    if not isinstance(getattr(workload, "sample_unit", None), str) or not workload.sample_unit:
        raise ValueError(f"workload {name!r} has no sample_unit (a non-empty string such as 'image')")
    options = getattr(workload, "options", None)
    if not isinstance(options, Mapping):
        raise ValueError(f"workload {name!r}: options must be a mapping of option names to defaults")
    for key, value in options.items():
        if not isinstance(value, OPTION_TYPES):
            raise ValueError(f"workload {name!r}: option {key!r} has a default of type {type(value).__name__}; "
                             f"allowed: {', '.join(t.__name__ for t in OPTION_TYPES)}")
