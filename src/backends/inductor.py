"""torch.compile of the model with its default backend (inductor)."""
import torch

import cnncompare


class Compile:
    name = "compile"
    description = "torch.compile(model), default inductor backend; compiles lazily on the first step"

    def compile(self, model, example, device):
        return torch.compile(model)


@cnncompare.hookimpl
def cnncompare_register_backends(register):
    register(Compile())
