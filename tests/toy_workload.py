"""A second, trivial workload registered through the hook (importable, so the child can unpickle it)."""
import torch
from torch import nn

import cnncompare


class ToyMLP:
    name = "toy-mlp"
    sample_unit = "vector"
    description = "two linear layers on random vectors, cross-entropy"
    options = {"features": 16, "classes": 4, "hidden": 32}

    def check_options(self, options):
        for key, value in options.items():
            if value < 1:
                raise ValueError(f"{key}: must be positive, got {value}")

    def build_model(self, options):
        return nn.Sequential(nn.Linear(options["features"], options["hidden"]), nn.ReLU(),
                             nn.Linear(options["hidden"], options["classes"]))

    def make_batch(self, options, n, generator, device):
        x = torch.randn((n, options["features"]), generator=generator, device=device)
        y = torch.randint(0, options["classes"], (n,), generator=generator, device=device)
        return x, y

    def loss(self, output, targets):
        return nn.functional.cross_entropy(output, targets)


class NoLoss:
    """Lacks ``loss``: its plugin must be reported broken, naming what is missing."""

    name = "no-loss"
    sample_unit = "thing"
    options = {}

    def build_model(self, options):
        return nn.Linear(2, 2)

    def make_batch(self, options, n, generator, device):
        return torch.zeros(n, 2), torch.zeros(n, dtype=torch.long)


@cnncompare.hookimpl
def cnncompare_register_workloads(register):
    register(ToyMLP())
