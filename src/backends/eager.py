"""Eager backends: the baseline, and what eager can win without compiling."""
import torch

from .. import hookimpl
from .base import NotApplicable, rebuild_optimizer


def to_channels_last(model):
    """Convert 4-d parameters in place (Module.to keeps the same Parameter objects)."""
    return model.to(memory_format=torch.channels_last)


class ChannelsLastInput:
    """Mixin: the batch in torch.channels_last, converted once outside timing, as a loader would."""

    def prepare_input(self, x):
        if x.dim() != 4:
            raise NotApplicable(f"channels_last is a layout of 4-d image batches (N, C, H, W); this workload's "
                                f"input is {x.dim()}-d {tuple(x.shape)}")
        return x.contiguous(memory_format=torch.channels_last)


class Eager:
    name = "eager"
    description = "nn.Module as written, no compilation (the baseline every speedup is against)"
    use_it = 'model  # as written: nothing to change'

    def compile(self, model, example, device):
        return model


class EagerControl(Eager):
    """The A/A control: eager again, in a cell of its own like any backend. Its speedup over eager
    is what "no difference" looks like on this machine in this run (the noise floor); the verdict
    picks no backend that doesn't clear it. The command line adds it beside eager (``--no-control``
    leaves it out), so it is not in ``all``."""

    name = "eager-control"
    description = "eager again, measured like any backend: its speedup over eager is this run's noise floor"
    in_all = False


class EagerFused:
    name = "eager-fused"
    description = "eager with the workload's optimizer fused (Adam(fused=True) by default): one kernel for the update"
    use_it = "optimizer = {optimizer}, fused=True)"
    modes = ("train",)  # its difference is the optimizer

    def compile(self, model, example, device):
        return model

    def adapt_optimizer(self, optimizer):
        return rebuild_optimizer(optimizer, fused=True)


class ChannelsLast(ChannelsLastInput):
    name = "channels-last"
    description = "eager with the model and input in torch.channels_last (NHWC convolutions)"
    use_it = 'model = model.to(memory_format=torch.channels_last); x = x.contiguous(memory_format=torch.channels_last)'

    def compile(self, model, example, device):
        return to_channels_last(model)


@hookimpl
def cnncompare_register_backends(register):
    for cls in (Eager, EagerControl, EagerFused, ChannelsLast):
        register(cls())
