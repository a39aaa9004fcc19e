"""The step protocol every backend is measured on: the workload's seeded model and batch on a
device, the optimizer, and one training step (forward, loss, zero_grad, backward, Adam); in
inference (``--mode inference``) one forward of the eval-mode model (docs/inference.md).

Everything a backend trains is made here and only here, so every backend
trains exactly the same thing.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch
from torch import nn

from ...workloads.base import resolve_options
from ...workloads.factory import WorkloadError
from ..config import RunConfig


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

    @property
    def inference(self) -> bool:
        return self.config.mode == "inference"

    def build_model(self, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
        """The model with seeded weights, on ``device``, in train mode (eval mode in inference).

        Weights are initialised on the CPU from the seed, so every backend and
        device starts from the same numbers.
        """
        torch.manual_seed(self.config.seed)
        with self._naming("build_model"):
            model = self.workload.build_model(self.options)
        return model.to(device=device, dtype=dtype).train(not self.inference)

    def make_batch(self, device: torch.device, shard: int = 0, shards: int = 1,
                   dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed, seeded batch, generated on ``device``.

        Under DDP the global batch is ``shards * batch_size`` samples and rank
        ``shard`` trains on its slice (weak scaling: ``batch_size`` per rank).
        With one shard the batch is the single-process one, number for number.
        Floating-point inputs are cast to ``dtype``.
        """
        gen = torch.Generator(device=device).manual_seed(self.config.seed)
        n = self.config.batch_size
        with self._naming("make_batch"):
            x, y = self.workload.make_batch(self.options, n * shards, gen, device)
        part = slice(shard * n, (shard + 1) * n)
        x = x[part].contiguous()
        return (x.to(dtype) if x.is_floating_point() else x), y[part].contiguous()

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


def make_optimizer(params, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=lr)


def trained_parameters(compiled: Callable, model: nn.Module) -> list[nn.Parameter]:
    """The parameters the compiled callable trains (its own if it is a Module)."""
    owner = compiled if isinstance(compiled, nn.Module) else model
    return [p for p in owner.parameters() if p.requires_grad]


def make_train_step(forward: Callable, optimizer: torch.optim.Optimizer, loss_fn: Callable) -> Callable:
    """The protocol: forward, the workload's loss, zero_grad, backward, Adam step; returns the loss.

    The loss is returned as a tensor: reading it (``.item()``) would
    synchronise the device inside the timed region.
    """

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(forward(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss.detach()

    return train_step


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


class OutputLog(list):
    """Inference's stand-in for the list of losses: per step, the output's largest magnitude as a
    0-d float tensor (NaN or inf when any element is, so the same finiteness check applies), and
    the last output whole in ``last`` (parity snapshots it before the next step can overwrite
    it, as a CUDA-graph replay does). Appended outside the timed region."""

    last: Any = None

    def append(self, output: Any) -> None:
        self.last = output
        leaves = output_tensors(output)
        if not leaves:
            raise TypeError(f"the model's forward returned no floating-point tensor ({type(output).__name__})")
        super().append(torch.stack([t.detach().abs().amax().float() for t in leaves]).amax())
