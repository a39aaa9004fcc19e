"""``seed-cnn``: the default CNN on seeded random images, trained with NLLLoss."""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from .. import hookimpl
from .base import check_positive, image_batch


class SeedCNN(nn.Module):
    """Three Conv2d+BatchNorm2d+ReLU blocks (3->16->32->64, k=3, pad=1), then two linear layers.

    The whole network runs, the linear layers included: they hold almost all of its parameters.
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


class SeedCNNWorkload:
    name = "seed-cnn"
    sample_unit = "image"
    description = "the default CNN: 3 x (conv 3x3 + BatchNorm + ReLU), 2 linear layers, NLLLoss"
    options = {"image_size": 28, "in_channels": 3, "num_classes": 10}

    def check_options(self, options: Mapping[str, Any]) -> None:
        check_positive(options, self.options)

    def build_model(self, options: Mapping[str, Any]) -> nn.Module:
        return SeedCNN(options["image_size"], options["in_channels"], options["num_classes"])

    def make_batch(self, options: Mapping[str, Any], n: int, generator: torch.Generator,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` images of ``in_channels x image_size x image_size`` from N(0, 1), uniform labels."""
        return image_batch(n, options["in_channels"], options["image_size"], options["num_classes"], generator, device)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # The model ends in LogSoftmax: its output is log-probabilities.
        return nn.functional.nll_loss(output, targets)


@hookimpl
def cnncompare_register_workloads(register):
    register(SeedCNNWorkload())
