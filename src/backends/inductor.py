"""torch.compile backends: the default, its modes, aot_eager, channels-last, and the whole step."""
from typing import Optional

import torch

from .. import hookimpl
from .eager import ChannelsLastInput, to_channels_last


class Compile:
    name = "compile"
    description = "torch.compile(model), default inductor backend; compiles lazily on the first step"
    mode: Optional[str] = None
    #: Modes that record CUDA graphs: meaningless off CUDA, and they need warm-up to record.
    uses_cudagraphs = False

    def __init__(self):
        if self.uses_cudagraphs:
            # reduce-overhead records its graphs on the second call and replays from the third.
            self.min_warmup = 3

    @property
    def use_it(self) -> str:
        return "model = torch.compile(model)" if self.mode is None else f'model = torch.compile(model, mode="{self.mode}")'

    def unavailable_reason(self, device):
        if self.uses_cudagraphs and device.type != "cuda":
            return f"mode={self.mode!r} records CUDA graphs, which need a CUDA device"
        return None

    def compile(self, model, example, device):
        return torch.compile(model) if self.mode is None else torch.compile(model, mode=self.mode)


class CompileReduceOverhead(Compile):
    name = "compile-reduce-overhead"
    description = "torch.compile(model, mode='reduce-overhead'): inductor + CUDA graphs"
    mode = "reduce-overhead"
    uses_cudagraphs = True


class CompileMaxAutotune(Compile):
    name = "compile-max-autotune"
    description = "torch.compile(model, mode='max-autotune'): autotuned kernels + CUDA graphs"
    mode = "max-autotune"
    uses_cudagraphs = True


class CompileMaxAutotuneNoCudagraphs(Compile):
    name = "compile-max-autotune-no-cudagraphs"
    description = "torch.compile(model, mode='max-autotune-no-cudagraphs'): autotuned kernels, no CUDA graphs"
    mode = "max-autotune-no-cudagraphs"


class AotEager:
    name = "aot-eager"
    description = "torch.compile(model, backend='aot_eager'): dynamo + AOTAutograd tracing, eager kernels (what tracing costs without inductor)"
    use_it = 'model = torch.compile(model, backend="aot_eager")'

    def compile(self, model, example, device):
        return torch.compile(model, backend="aot_eager")


class CompileChannelsLast(ChannelsLastInput):
    name = "compile-channels-last"
    description = "torch.compile(model) with the model and input in torch.channels_last"
    use_it = 'model = torch.compile(model.to(memory_format=torch.channels_last)); x = x.contiguous(memory_format=torch.channels_last)'

    def compile(self, model, example, device):
        return torch.compile(to_channels_last(model))


class CompileStep:
    """The whole training step (forward, loss, backward, Adam) as one torch.compile'd function:
    what torch.jit.script can't do: it compiles no optimizer."""

    name = "compile-step"
    description = "the whole train step (forward, loss, backward, Adam) in one torch.compile, tensor lr"
    use_it = ("optimizer = torch.optim.Adam(model.parameters(), lr=torch.tensor(1e-3)); "
              "train_step = torch.compile(train_step)  # forward, loss, backward, optimizer.step()")
    modes = ("train",)  # its difference is the compiled step
    min_warmup = 1

    def compile(self, model, example, device):
        return model

    def make_optimizer(self, params, lr):
        # Built once, outside the compiled function (built inside, it would recompile every
        # step); a tensor lr is an input of the graph rather than a constant baked into it,
        # so changing it (a scheduler) does not recompile (pytorch/pytorch#121857).
        return torch.optim.Adam(params, lr=torch.tensor(lr))

    def compile_step(self, step, example, device):
        # fullgraph stays off: loss.backward() inside a fullgraph=True region fails
        # (pytorch/pytorch#120814); dynamo splits around it instead.
        return torch.compile(step)


@hookimpl
def cnncompare_register_backends(register):
    for cls in (Compile, CompileStep, CompileReduceOverhead, CompileMaxAutotune, CompileMaxAutotuneNoCudagraphs,
                AotEager, CompileChannelsLast):
        register(cls())
