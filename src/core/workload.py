"""The workload: the seed study's CNN, a seeded synthetic batch, the train step.

Everything a backend is measured on is defined here and only here, so every
backend trains exactly the same thing.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from cnncompare.core.config import RunConfig


class SeedCNN(nn.Module):
    """Three Conv2d+BatchNorm2d+ReLU blocks (3->16->32->64, k=3, pad=1), then two linear layers.

    Unlike the seed memo (whose ``forward`` returned before the linear
    layers), the whole network runs.
    """

    def __init__(self, image_size: int = 28, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        widths = [in_channels, 16, 32, 64]
        blocks: list[nn.Module] = []
        for c_in, c_out in zip(widths, widths[1:]):
            blocks += [nn.Conv2d(c_in, c_out, kernel_size=3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]
        self.features = nn.Sequential(*blocks)
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * image_size * image_size, 1024),
            nn.ReLU(),
            nn.Linear(1024, num_classes),
            nn.LogSoftmax(dim=1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def build_model(config: RunConfig, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model with seeded weights, on ``device``, in train mode.

    Weights are initialised on the CPU from ``config.seed`` so every backend
    and device starts from the same numbers.
    """
    torch.manual_seed(config.seed)
    model = SeedCNN(config.image_size, config.in_channels, config.num_classes)
    return model.to(device=device, dtype=dtype).train()


def make_batch(config: RunConfig, device: torch.device, shard: int = 0, shards: int = 1
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed, seeded batch (inputs, labels 0..num_classes-1), generated on ``device``.

    Under DDP the global batch is ``shards * batch_size`` images and rank
    ``shard`` trains on its slice (weak scaling: ``batch_size`` per rank).
    With one shard the batch is the single-process one, number for number.
    """
    gen = torch.Generator(device=device).manual_seed(config.seed)
    n = config.batch_size * shards
    x = torch.randn((n, config.in_channels, config.image_size, config.image_size), generator=gen, device=device)
    y = torch.randint(0, config.num_classes, (n,), generator=gen, device=device)
    part = slice(shard * config.batch_size, (shard + 1) * config.batch_size)
    return x[part].contiguous(), y[part].contiguous()


def make_optimizer(params, config: RunConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=config.lr)


def trained_parameters(compiled: Callable, model: nn.Module) -> list[nn.Parameter]:
    """The parameters the compiled callable trains (its own if it is a Module)."""
    owner = compiled if isinstance(compiled, nn.Module) else model
    return [p for p in owner.parameters() if p.requires_grad]


def make_train_step(forward: Callable, optimizer: torch.optim.Optimizer, loss_fn: nn.Module) -> Callable:
    """The protocol: forward, NLLLoss, zero_grad, backward, Adam step; returns the loss.

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
