"""A user's workload with a training recipe of its own, for the recipe tests: SGD with
momentum, an LR schedule that halves the rate every step (so a step that ignores it is 2x, 4x
off by the parity step), gradient clipping that is active from the first step (the gradients'
norm is well above 0.05) and, optionally, micro-batches. Its two residual blocks are what
compile-regional compiles."""
import torch
from torch import nn

import cnncompare


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.linear(self.norm(x)))


def build(features: int = 16, hidden: int = 32, classes: int = 4, clip: float = 0.05, accumulation: int = 1):
    model = nn.Sequential(nn.Linear(features, hidden), Block(hidden), Block(hidden), nn.Linear(hidden, classes))

    def make_batch(n, generator, device):
        x = torch.randn(n, features, generator=generator, device=device)
        y = torch.randint(0, classes, (n,), generator=generator, device=device)
        return x, y

    return cnncompare.ModelSpec(
        model, make_batch,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5, momentum=0.9),
        scheduler=lambda optimizer: torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5),
        clip_grad_norm=clip if clip > 0 else None,
        accumulation_steps=accumulation,
    )
