"""TorchScript: torch.jit.trace and torch.jit.script of the model.

Deprecated since about torch 2.10 (every call warns); kept because users
still ask whether it speeds training up. The deprecation warnings and any
TracerWarning land in the report's notes, captured by the harness.
"""
import torch

from .. import hookimpl


class JitTrace:
    name = "jit-trace"
    description = "torch.jit.trace of the model (records one path through Python control flow)"
    use_it = 'model = torch.jit.trace(model, example_batch)'
    # The profiling executor specialises on the first runs; two are needed
    # before the optimised graph is in use.
    min_warmup = 2

    def compile(self, model, example, device):
        return torch.jit.trace(model, example)


class JitScript:
    name = "jit-script"
    description = "torch.jit.script of the model (compiles Python source to TorchScript)"
    use_it = 'model = torch.jit.script(model)'
    min_warmup = 2

    def compile(self, model, example, device):
        return torch.jit.script(model)


@hookimpl
def cnncompare_register_backends(register):
    register(JitTrace())
    register(JitScript())
