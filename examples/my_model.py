"""A worked example of your own model as a cnncompare workload (docs/workloads.md).

    cnncompare --workload examples/my_model.py:build
    cnncompare --workload examples/my_model.py:build --workload-option hidden=512

``build``'s keyword parameters are the workload's options; it returns the model and how to
make a seeded batch (a loss is optional: cross-entropy for integer targets, else MSE).
"""
import torch
from torch import nn


def build(features: int = 64, hidden: int = 256, classes: int = 10):
    """A two-layer MLP with LayerNorm on random feature vectors."""
    model = nn.Sequential(
        nn.Linear(features, hidden), nn.LayerNorm(hidden), nn.ReLU(),
        nn.Linear(hidden, classes),
    )

    def make_batch(n, generator, device):
        # Draw everything from `generator` on `device`: every cell then gets the same batch.
        x = torch.randn(n, features, generator=generator, device=device)
        y = torch.randint(0, classes, (n,), generator=generator, device=device)
        return x, y

    return model, make_batch
