"""Your own model as a workload: ``--workload path/to/file.py:factory`` or ``package.module:factory``.

The contract (docs/workloads.md has a worked example):

- ``factory(**options)`` builds the model. Its keyword parameters that have a default of type
  bool, int, float or str are the workload's options (``--workload-option KEY=VALUE``); a
  parameter without a default is an error, other parameters are left alone.
- It returns ``(model, make_batch)``, ``(model, make_batch, loss)`` or a ``ModelSpec``:
  ``model`` an ``nn.Module``; ``make_batch(n, generator, device) -> (inputs, targets)`` draws
  ``n`` samples from ``generator`` on ``device``; ``loss(output, targets)`` a scalar, by
  default cross-entropy for integer targets and mean squared error otherwise.

The harness seeds torch before every call, so every cell's weights are the same. The file is
code: it runs with your rights, in this process (to check it before any cell) and in every
cell's process.
"""
from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import os
import sys
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from .base import OPTION_TYPES, Recipe


class WorkloadError(Exception):
    """A workload that can't be loaded or built; the message is one line for the user."""


@dataclass
class ModelSpec:
    """What a factory returns when a tuple is not enough (to name the sample unit, or to train
    with a recipe of its own).

    ``make_batch(n, generator, device) -> (inputs, targets)``; ``loss`` None means cross-entropy
    for integer targets, else mean squared error. ``throughput_unit`` and ``units_per_sample``
    count something finer than a sample (tokens of a sequence); by default, samples.

    The training recipe (``workloads.base.Recipe`` says how each is followed): ``optimizer``
    (parameters -> optimizer; None: Adam at ``--lr``), ``scheduler`` (optimizer -> LR scheduler,
    stepped after every optimizer step; None: none), ``clip_grad_norm`` (None: no clipping) and
    ``accumulation_steps`` (micro-batches per optimizer step).

    ``loop``: the training loop the report projects, keyed as ``--loop`` is (``epoch_steps``,
    ``last_batch``, ``eval_every``, ``eval_steps``, ``epochs``; ``core.config.LoopSpec``);
    ``--loop`` overrides it key by key."""

    model: Any
    make_batch: Callable[..., Any]
    loss: Optional[Callable[..., Any]] = None
    sample_unit: str = "sample"
    throughput_unit: Optional[str] = None
    units_per_sample: int = 1
    optimizer: Optional[Callable[..., Any]] = None
    scheduler: Optional[Callable[..., Any]] = None
    clip_grad_norm: Optional[float] = None
    accumulation_steps: int = 1
    loop: Optional[Mapping[str, Any]] = None

    @property
    def recipe(self) -> Recipe:
        return Recipe(self.optimizer, self.scheduler, self.clip_grad_norm, self.accumulation_steps)


def default_loss(output: Any, targets: Any) -> Any:
    """Cross-entropy for integer targets (class ids, per position for sequences), else MSE."""
    from torch.nn import functional

    if not targets.is_floating_point():
        if output.dim() > 2:  # (N, L, C) logits against (N, L) ids
            return functional.cross_entropy(output.flatten(0, -2), targets.flatten())
        return functional.cross_entropy(output, targets)
    return functional.mse_loss(output, targets)


class FactoryWorkload:
    """A workload built by a user's factory function, found by ``spec`` (``file.py:name`` or
    ``module:name``). Pickled for a cell's child as its spec and location only: the child
    imports the file again."""

    def __init__(self, spec: str, cwd: Optional[str] = None):
        self.name = spec
        where, sep, self.attr = spec.rpartition(":")
        if not sep or not where or not self.attr.isidentifier():
            raise WorkloadError(f"expected FILE.py:FUNCTION or MODULE:FUNCTION, got {spec!r}")
        self.cwd = os.path.abspath(cwd or os.getcwd())
        self.path = os.path.join(self.cwd, where) if where.endswith(".py") else None
        self.module = None if self.path else where
        self._factory: Optional[Callable[..., Any]] = None
        self._built: dict[tuple, ModelSpec] = {}
        factory = self.factory()
        self.options = _options_of(factory, spec)
        probe = self.spec_for(self.options)
        self.sample_unit = probe.sample_unit
        self.throughput_unit = probe.throughput_unit or probe.sample_unit
        self.description = (inspect.getdoc(factory) or "").split("\n", 1)[0] or f"{self.attr}() from {where}"

    def __getstate__(self) -> dict:
        return {k: v for k, v in vars(self).items() if k not in ("_factory", "_built")}

    def __setstate__(self, state: dict) -> None:
        vars(self).update(state, _factory=None, _built={})

    def factory(self) -> Callable[..., Any]:
        if self._factory is None:
            self._factory = _load(self)
        return self._factory

    def spec_for(self, options: Mapping[str, Any]) -> ModelSpec:
        """The factory's result for ``options``, checked; built once per set of options (the
        harness seeds torch before each ``build_model``, which builds afresh)."""
        key = tuple(sorted(options.items()))
        if key not in self._built:
            self._built[key] = self._call(options)
        return self._built[key]

    def _call(self, options: Mapping[str, Any]) -> ModelSpec:
        try:
            result = self.factory()(**options)
        except Exception as exc:
            raise WorkloadError(f"{self.attr}() raised {type(exc).__name__}: {exc}") from exc
        return _as_spec(result, self.attr)

    # The Workload protocol.
    def units_per_sample(self, options: Mapping[str, Any]) -> int:
        return self.spec_for(options).units_per_sample

    def build_model(self, options: Mapping[str, Any]) -> Any:
        built = self._call(options)  # a fresh model from the harness's seed
        self._built[tuple(sorted(options.items()))] = built
        return built.model

    def recipe(self, options: Mapping[str, Any]) -> Recipe:
        return self.spec_for(options).recipe

    def loop(self, options: Mapping[str, Any]) -> Mapping[str, Any]:
        return self.spec_for(options).loop or {}

    def make_batch(self, options: Mapping[str, Any], n: int, generator: Any, device: Any) -> Any:
        batch = self.spec_for(options).make_batch(n, generator, device)
        if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
            raise WorkloadError(f"make_batch returned {type(batch).__name__}; expected (inputs, targets)")
        return tuple(batch)

    def loss(self, output: Any, targets: Any) -> Any:
        # The loss does not depend on the options; any built spec's will do.
        spec = next(iter(self._built.values()), None)
        custom = spec.loss if spec is not None else None
        return (custom or default_loss)(output, targets)


def _load(workload: FactoryWorkload) -> Callable[..., Any]:
    where = workload.path or workload.module
    if workload.path is not None:
        if not os.path.isfile(workload.path):
            raise WorkloadError(f"no such file: {workload.path}")
        # A name of its own per path: two files called model.py must not share a module.
        digest = hashlib.sha1(workload.path.encode()).hexdigest()[:8]
        name = f"cnncompare_user_{os.path.splitext(os.path.basename(workload.path))[0]}_{digest}"
        spec = importlib.util.spec_from_file_location(name, workload.path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # so classes defined in it pickle and dataclasses resolve
        runner = lambda: spec.loader.exec_module(module)  # noqa: E731
    else:
        # As `python -m` would: modules beside where the command was run import.
        if workload.cwd not in sys.path:
            sys.path.insert(0, workload.cwd)
        runner = None
    try:
        if runner is not None:
            runner()
        else:
            module = importlib.import_module(str(workload.module))
    except WorkloadError:
        raise
    except BaseException as exc:  # SystemExit from a script's main guard-less exit included
        if isinstance(exc, KeyboardInterrupt):
            raise
        raise WorkloadError(f"importing {where} raised {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, workload.attr, None)
    if not callable(factory):
        raise WorkloadError(f"{where} has no function {workload.attr!r}")
    return factory


def _options_of(factory: Callable[..., Any], spec: str) -> dict[str, Any]:
    options = {}
    for p in inspect.signature(factory).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.default is p.empty:
            raise WorkloadError(f"parameter {p.name!r} of {spec} has no default; every parameter needs one "
                                f"(its options are its keyword parameters)")
        if isinstance(p.default, OPTION_TYPES):
            options[p.name] = p.default
    return options


def _as_spec(result: Any, attr: str) -> ModelSpec:
    from torch import nn

    if isinstance(result, tuple) and len(result) in (2, 3):
        result = ModelSpec(*result)
    if not isinstance(result, ModelSpec):
        raise WorkloadError(f"{attr}() returned {type(result).__name__}; expected (model, make_batch), "
                            f"(model, make_batch, loss) or cnncompare.ModelSpec")
    if not isinstance(result.model, nn.Module):
        raise WorkloadError(f"{attr}() returned a model of type {type(result.model).__name__}; expected a "
                            f"torch.nn.Module")
    if not callable(result.make_batch):
        raise WorkloadError(f"{attr}()'s make_batch is not callable")
    if result.loss is not None and not callable(result.loss):
        raise WorkloadError(f"{attr}()'s loss is not callable")
    if not isinstance(result.units_per_sample, int) or result.units_per_sample < 1:
        raise WorkloadError(f"{attr}()'s units_per_sample must be a positive int, got {result.units_per_sample!r}")
    try:
        result.recipe.check(f"{attr}()")
    except ValueError as exc:
        raise WorkloadError(str(exc)) from None
    return result
