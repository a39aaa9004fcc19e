"""User-written workload factories (``--workload tests/user_models/factories.py:NAME``), good and bad."""
import torch
from torch import nn

import cnncompare


def tiny_regression(features: int = 6, outputs: int = 2, sequence: bool = False):
    """A linear regression on random vectors: float targets, so the default loss is MSE."""
    model = nn.Sequential(nn.Linear(features, 8), nn.Tanh(), nn.Linear(8, outputs))

    def make_batch(n, generator, device):
        x = torch.randn(n, features, generator=generator, device=device)
        return x, torch.randn(n, outputs, generator=generator, device=device)

    return cnncompare.ModelSpec(model, make_batch, sample_unit="row")


def raises(width: int = 4):
    raise ValueError("no weights for width 4")


def returns_a_number():
    return 3


def not_a_module():
    return "model", lambda n, g, d: None


def needs_an_argument(width):
    return nn.Linear(width, width), None


def float32_only():
    """A model that casts its input to float32: it can't run in float64 for the parity reference."""

    class Casts(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(4, 3)

        def forward(self, x):
            return self.linear(x.float())

    def make_batch(n, generator, device):
        return torch.randn(n, 4, generator=generator, device=device), torch.randint(0, 3, (n,), generator=generator,
                                                                                    device=device)

    return Casts(), make_batch


def bad_batch():
    return nn.Linear(2, 2), lambda n, generator, device: 1 / 0


def with_dropout(features: int = 16, classes: int = 4):
    """A classifier with dropout: its step draws random numbers."""
    model = nn.Sequential(nn.Linear(features, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, classes))

    def make_batch(n, generator, device):
        return (torch.randn(n, features, generator=generator, device=device),
                torch.randint(0, classes, (n,), generator=generator, device=device))

    return cnncompare.ModelSpec(model, make_batch, sample_unit="row")
