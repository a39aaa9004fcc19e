"""The step protocol every backend is measured on: the workload's seeded model and batches on a
device, its recipe's optimizer and scheduler, and one training step (per micro-batch: forward,
loss, backward; then gradient clipping, the optimizer step and the scheduler step, as the
workload's ``Recipe`` says); in inference (``--mode inference``) one forward of the eval-mode
model (docs/inference.md).

Everything a backend trains is made here and only here, so every backend
trains exactly the same thing: the same model, and the same sequence of batches, a new one
every step (``Job.batch``, ``pool_size``), as a real training loop feeds it. A backend that
replays its example, or a CUDA graph that never copies the new input in, is then wrong, and
no step trains on a batch the model has already fitted (one batch fed forever collapses the
loss and turns the gradients denormal, which slows a CPU step 2-3x).
"""
from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import nn

from ...workloads.base import Recipe, recipe_of, resolve_options
from ...workloads.factory import WorkloadError
from ..config import RunConfig

#: The compile example's batch index: a batch of its own, never one a step trains on.
EXAMPLE = -1
#: Distinct batches a run cycles through (step k trains on batch ``(k - 1) % pool``), at most
#: this many and at most ``POOL_BYTES`` of them resident: a data loader holds one or two, so
#: the pool must not weigh on the memory figures of large inputs, yet at least two distinct
#: batches always alternate.
POOL_MAX = 8
POOL_BYTES = 64 * 2**20


def pool_size(batch_bytes: int) -> int:
    """How many distinct batches a run cycles through, for batches of ``batch_bytes``."""
    return max(2, min(POOL_MAX, POOL_BYTES // max(batch_bytes, 1)))


def batch_bytes(batch: Any) -> int:
    x, y = batch
    return x.numel() * x.element_size() + y.numel() * y.element_size()


def step_seed(seed: int, step: int) -> int:
    """The RNG seed set before step ``step`` of a workload that draws random numbers (dropout), in
    every backend's cell and in the reference alike."""
    return seed * 1_000_003 + step


@dataclass(frozen=True)
class Job:
    """A workload bound to a run's options, seed and batch size.

    ``options`` are the config's workload options with the workload's
    defaults filled in (a config built in code may name only some)."""

    workload: Any
    config: RunConfig
    options: dict = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "options", resolve_options(self.workload, self.config.workload.options))

    @functools.cached_property
    def recipe(self) -> Recipe:
        """The workload's recipe, read when first needed: a user's factory returns it with its
        model, so read after ``build_model`` it costs no second model (read before, in a cell, it
        would build one ahead of the memory baseline)."""
        with self._naming("recipe"):
            return recipe_of(self.workload, self.options)

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        """The recipe's optimizer over ``params`` (Adam at the config's ``lr`` by default)."""
        with self._naming("the recipe's optimizer"):
            return self.recipe.build_optimizer(params, self.config.lr)

    def make_scheduler(self, optimizer: torch.optim.Optimizer) -> Any:
        """The recipe's LR scheduler over ``optimizer``, or None."""
        if self.recipe.scheduler is None:
            return None
        with self._naming("the recipe's scheduler"):
            return self.recipe.scheduler(optimizer)

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step: the recipe's accumulation in training; one forward in inference."""
        return 1 if self.inference else self.recipe.accumulation_steps

    @property
    def inference(self) -> bool:
        return self.config.mode == "inference"

    def build_model(self, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
        """The model with seeded weights, on ``device``, in train mode (eval mode in inference).

        Weights are initialised on the CPU from the seed, so every backend and
        device starts from the same numbers. In inference, normalisation layers that were never
        trained get seeded statistics and affine parameters (``seed_normalization``).
        """
        torch.manual_seed(self.config.seed)
        with self._naming("build_model"):
            model = self.workload.build_model(self.options)
        if self.inference:
            seed_normalization(model, self.config.seed)
        return model.to(device=device, dtype=dtype).train(not self.inference)

    def batch(self, index: int, device: torch.device, shard: int = 0, shards: int = 1,
              dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch ``index`` of the run's seeded sequence (``EXAMPLE`` for the compile example),
        generated on ``device``.

        One step's batch holds the recipe's ``accumulation_steps`` micro-batches of ``batch_size``
        samples each (the step splits it, ``Recipe.split``). Under DDP the global batch is
        ``shards`` times that and rank ``shard`` trains on its slice (weak scaling).
        With one shard the batch is the single-process one, number for number.
        Floating-point inputs and targets are cast to ``dtype`` (regression targets against a
        float64 output: torch 2.6's MSE backward refuses a float32 target there).
        """
        gen = torch.Generator(device=device).manual_seed(self.config.seed * 7919 + index + 1)
        n = self.config.batch_size * self.micro_batches
        with self._naming("make_batch"):
            x, y = self.workload.make_batch(self.options, n * shards, gen, device)
        part = slice(shard * n, (shard + 1) * n)
        x, y = x[part].contiguous(), y[part].contiguous()
        return (x.to(dtype) if x.is_floating_point() else x), (y.to(dtype) if y.is_floating_point() else y)

    def forward_input(self, index: int, device: torch.device, shard: int = 0, shards: int = 1) -> torch.Tensor:
        """The inputs of batch ``index``'s first micro-batch: what one forward sees (the compile
        example, a probe's forward), not the whole step's micro-batches at once."""
        return self.batch(index, device, shard, shards)[0].chunk(self.micro_batches)[0]

    def batches(self, device: torch.device, shard: int = 0, shards: int = 1,
                dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The pool of distinct batches every step draws from, made at once (before any timed
        region): step k trains on ``batches[(k - 1) % len(batches)]``."""
        first = self.batch(0, device, shard, shards, dtype)
        return [first] + [self.batch(i, device, shard, shards, dtype)
                          for i in range(1, pool_size(batch_bytes(first)))]

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.workload.loss(output, targets)

    @contextlib.contextmanager
    def _naming(self, member: str) -> Iterator[None]:
        """A workload's own failure, as one line naming the workload (not the backend's compile)."""
        try:
            yield
        except WorkloadError as exc:
            raise WorkloadError(f"workload {self.workload.name!r}: {exc}") from exc
        except Exception as exc:
            raise WorkloadError(f"workload {self.workload.name!r}: {member} raised {type(exc).__name__}: {exc}") \
                from exc


#: Seeded statistics of a never-trained normalisation layer in inference: running means
#: N(0, MEAN_STD), variances uniform in VAR_RANGE, scales uniform in WEIGHT_RANGE, shifts
#: N(0, BIAS_STD). Fresh ones (mean 0, variance 1, scale 1, shift 0) make eval-mode BatchNorm
#: the identity, so a deploy path that folds it with the wrong eps, scale or sign would compute
#: the same numbers; these move every channel's output by tens of percent.
MEAN_STD, VAR_RANGE, WEIGHT_RANGE, BIAS_STD = 0.2, (0.5, 2.0), (0.5, 1.5), 0.2


def seed_normalization(model: nn.Module, seed: int) -> None:
    """Give every BatchNorm whose running statistics are still the fresh ones (a model that was
    never trained) seeded, non-trivial statistics and affine parameters; a trained model's are
    left as they are."""
    gen = torch.Generator().manual_seed(seed + 17)
    with torch.no_grad():
        for module in model.modules():
            if not isinstance(module, nn.modules.batchnorm._BatchNorm) or module.running_mean is None:
                continue
            mean, var = module.running_mean, module.running_var
            assert var is not None
            if bool(mean.any()) or not bool((var == 1).all()):
                continue
            mean.copy_(torch.randn(mean.shape, generator=gen) * MEAN_STD)
            var.copy_(torch.empty(var.shape).uniform_(*VAR_RANGE, generator=gen))
            if module.affine:
                module.weight.copy_(torch.empty(module.weight.shape).uniform_(*WEIGHT_RANGE, generator=gen))
                module.bias.copy_(torch.randn(module.bias.shape, generator=gen) * BIAS_STD)


def trained_parameters(compiled: Callable, model: nn.Module) -> list[nn.Parameter]:
    """The parameters the compiled callable trains (its own if it is a Module)."""
    owner = compiled if isinstance(compiled, nn.Module) else model
    return [p for p in owner.parameters() if p.requires_grad]


def make_train_step(forward: Callable, optimizer: torch.optim.Optimizer, loss_fn: Callable,
                    recipe: Recipe = Recipe(), params: Sequence[nn.Parameter] = ()) -> Callable:
    """The protocol: per micro-batch forward, the workload's loss (divided by the micro-batch
    count), backward (zero_grad before the first; under DDP, ``forward.no_sync()`` but for the last); then ``clip_grad_norm_`` of ``params`` where
    the recipe clips, and the optimizer step. Returns the step's loss (the micro-batches' sum).

    The loss is returned as a tensor: reading it (``.item()``) would
    synchronise the device inside the timed region. The scheduler is not stepped here
    (``with_scheduler``): a backend that compiles this step compiles what the user would.
    """
    count, clip = recipe.accumulation_steps, recipe.clip_grad_norm
    # Under DDP the micro-batches but the last skip the gradient all-reduce, as a DDP user
    # accumulates (the last backward reduces the accumulated sum: the same average).
    no_sync = getattr(forward, "no_sync", None) if count > 1 else None

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        total: Any = 0
        for i, (xi, yi) in enumerate(recipe.split(x, y)):
            with no_sync() if no_sync is not None and i < count - 1 else contextlib.nullcontext():
                loss = loss_fn(forward(xi), yi)
                if count > 1:
                    loss = loss / count
                if i == 0:
                    optimizer.zero_grad()
                loss.backward()
            total = loss.detach() + total if i else loss.detach()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()
        return total

    return train_step


def with_scheduler(step: Callable, scheduler: Any) -> Callable:
    """``step`` followed by ``scheduler.step()``, as a training loop steps it after every
    optimizer step; ``step`` itself where there is no scheduler."""
    if scheduler is None:
        return step

    def scheduled(x: torch.Tensor, y: torch.Tensor) -> Any:
        loss = step(x, y)
        scheduler.step()
        return loss

    return scheduled


def make_inference_step(forward: Callable, grad_mode: Callable[[], Any]) -> Callable:
    """Inference's step: one forward under ``grad_mode()`` (``torch.inference_mode`` unless the
    backend asks for ``no_grad``); returns the output. ``y`` is unused: no loss is computed."""

    def infer(x: torch.Tensor, y: torch.Tensor) -> Any:
        with grad_mode():
            return forward(x)

    return infer


def output_tensors(output: Any) -> list[torch.Tensor]:
    """The floating-point tensors of a forward's output (a tensor, or a tuple, list or dict of
    them), in a fixed order: what inference's parity compares."""
    from torch.utils import _pytree

    return [t for t in _pytree.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def summary(output: Any) -> torch.Tensor:
    """An inference step's one number (its output's largest magnitude, as a 0-d float tensor: NaN
    or inf when any element is), which the trajectory check follows step by step."""
    leaves = output_tensors(output)
    if not leaves:
        raise TypeError(f"the model's forward returned no floating-point tensor ({type(output).__name__})")
    return torch.stack([t.detach().abs().amax().float() for t in leaves]).amax()


class OutputLog(list):
    """Inference's stand-in for the list of losses: per step, the output's largest magnitude as a
    0-d float tensor (NaN or inf when any element is, so the same finiteness check applies), and
    the last output whole in ``last`` (parity snapshots it before the next step can overwrite
    it, as a CUDA-graph replay does). Appended outside the timed region."""

    last: Any = None

    def append(self, output: Any) -> None:
        self.last = output
        super().append(summary(output))
