"""What the harness requires of a workload, and the helpers that read its optional members.

A workload is what every backend trains, the same for all of them: a model,
a seeded batch and a loss. The harness owns everything else: seeding, the
device and dtype, sharding a batch among DDP ranks, the optimizer and the
step protocol (``core/cell/training.py``).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Protocol

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
        along the first dimension. Floating-point inputs are converted to
        the reference's dtype by the harness; integer inputs (token ids) are
        left alone.
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
