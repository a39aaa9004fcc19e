"""A worked example of your own training recipe as a cnncompare workload (docs/workloads.md).

    cnncompare --workload examples/my_training.py:build --devices cpu

Every backend then trains this model as you would: SGD with momentum and Nesterov, a OneCycleLR
schedule stepped after every optimizer step, gradients clipped to norm 1, and the float64
parity reference follows the same recipe. ``total_steps`` is the schedule's length: a cell of a
small model runs up to about a thousand steps in a round (OneCycleLR refuses to step past its
end), as many as a first epoch of a real run would.

``loop`` is the loop the report projects for each backend: 50,000 samples in batches of 128 make
epochs of 391 steps whose last batch holds 80 (a DataLoader with ``drop_last=False``), an
evaluation of 20 batches every 100 steps, 10 epochs. A compiler that recompiles on the smaller
batch, or on switching to evaluation and back, pays for it there (``--loop KEY=VALUE`` changes a
key; at another ``--batch-size`` give ``--loop last_batch=N`` too).
"""
import torch
from torch import nn

import cnncompare


class Block(nn.Module):
    """A residual MLP block; the model repeats it (what ``compile-regional`` compiles once)."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return x + torch.relu(self.linear(self.norm(x)))


def build(features: int = 64, hidden: int = 256, depth: int = 3, classes: int = 10, lr: float = 0.1,
          clip: float = 1.0, total_steps: int = 10_000):
    """A residual MLP trained with SGD(momentum), OneCycleLR and gradient clipping."""
    model = nn.Sequential(
        nn.Linear(features, hidden),
        *(Block(hidden) for _ in range(depth)),
        nn.Linear(hidden, classes),
    )

    def make_batch(n, generator, device):
        # Draw everything from `generator` on `device`: every cell then gets the same batch.
        x = torch.randn(n, features, generator=generator, device=device)
        y = torch.randint(0, classes, (n,), generator=generator, device=device)
        return x, y

    return cnncompare.ModelSpec(
        model, make_batch,
        optimizer=lambda params: torch.optim.SGD(params, lr=lr, momentum=0.9, nesterov=True),
        scheduler=lambda optimizer: torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr,
                                                                        total_steps=total_steps),
        clip_grad_norm=clip,
        loop={"epoch_steps": 391, "last_batch": 80, "eval_every": 100, "eval_steps": 20, "epochs": 10},
    )
