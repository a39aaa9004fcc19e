"""``resnet``: a ResNet-18-shaped network in plain ``torch.nn`` on seeded random images.

The torchvision ResNet-18's structure (four stages of two basic blocks, BatchNorm after every
convolution, identity skips and 1x1 projection skips where the shape changes, global average
pooling, one linear layer) with a CIFAR-style stem (one 3x3 convolution, no max-pool) so small
images keep their resolution. ``width`` is the first stage's channels (torchvision's is 64):
16 by default keeps a full ``--backends all`` matrix within minutes on a 2-core CPU.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from .. import hookimpl
from .base import check_positive, image_batch


class BasicBlock(nn.Module):
    """Two 3x3 conv + BatchNorm, ReLU between and after the skip (He et al. 2016, figure 2)."""

    def __init__(self, c_in: int, c_out: int, stride: int):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.skip: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.skip = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.skip(x))


class ResNet18(nn.Module):
    def __init__(self, width: int = 16, in_channels: int = 3, num_classes: int = 10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, width, 3, padding=1, bias=False), nn.BatchNorm2d(width),
                                  nn.ReLU())
        stages: list[nn.Module] = []
        c_in = width
        for i, c_out in enumerate(width * m for m in (1, 2, 4, 8)):
            stride = 1 if i == 0 else 2
            stages += [BasicBlock(c_in, c_out, stride), BasicBlock(c_out, c_out, 1)]
            c_in = c_out
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c_in, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


class ResNetWorkload:
    name = "resnet"
    sample_unit = "image"
    description = ("ResNet-18 shape in plain torch.nn (4 stages x 2 basic blocks, BatchNorm, skips; 3x3 stem), "
                   "cross-entropy")
    options = {"image_size": 32, "width": 16, "in_channels": 3, "num_classes": 10}

    def check_options(self, options: Mapping[str, Any]) -> None:
        check_positive(options, self.options)
        if options["image_size"] < 8:
            # Three stride-2 stages: below 8 pixels the last stage sees a 1x1 (or empty) map.
            raise ValueError(f"image_size: must be at least 8 (three stride-2 stages), got {options['image_size']}")

    def build_model(self, options: Mapping[str, Any]) -> nn.Module:
        return ResNet18(options["width"], options["in_channels"], options["num_classes"])

    def make_batch(self, options: Mapping[str, Any], n: int, generator: torch.Generator,
                   device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        return image_batch(n, options["in_channels"], options["image_size"], options["num_classes"], generator, device)

    def loss(self, output: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(output, targets)


@hookimpl
def cnncompare_register_workloads(register):
    register(ResNetWorkload())
