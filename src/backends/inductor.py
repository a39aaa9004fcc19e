"""torch.compile backends: the default, its modes, aot_eager, channels-last, the whole step, and the
knobs that trade compile cost against recompiles (dynamic shapes, a dynamic batch dimension, only
the repeated blocks)."""
from collections import Counter
from typing import Any, Optional

import torch
from torch import nn

from .. import hookimpl
from .base import NotApplicable, rebuild_optimizer
from .eager import ChannelsLastInput, to_channels_last


class Compile:
    name = "compile"
    description = "torch.compile(model), default inductor backend; compiles lazily on the first step"
    mode: Optional[str] = None
    #: ``torch.compile``'s ``dynamic`` (None: its default, dynamic only after a size changes).
    dynamic: Optional[bool] = None
    #: Modes that record CUDA graphs: meaningless off CUDA, and they need warm-up to record.
    uses_cudagraphs = False

    def __init__(self):
        if self.uses_cudagraphs:
            # reduce-overhead records its graphs on the second call and replays from the third.
            self.min_warmup = 3

    def _arguments(self) -> dict:
        return {k: v for k, v in (("mode", self.mode), ("dynamic", self.dynamic)) if v is not None}

    @property
    def use_it(self) -> str:
        given = "".join(f", {k}={v!r}" if k == "dynamic" else f', {k}="{v}"' for k, v in self._arguments().items())
        return f"model = torch.compile(model{given})"

    def unavailable_reason(self, device):
        if self.uses_cudagraphs and device.type != "cuda":
            return f"mode={self.mode!r} records CUDA graphs, which need a CUDA device"
        return None

    def compile(self, model, example, device):
        return torch.compile(model, **self._arguments())


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
    """The whole training step (forward, loss, backward, the recipe's clipping and optimizer step)
    as one torch.compile'd function: what torch.jit.script can't do: it compiles no optimizer."""

    name = "compile-step"
    description = "the whole train step (forward, loss, backward, clipping, the optimizer) in one torch.compile, tensor lr"
    use_it = ("optimizer = {optimizer})  # with lr=torch.tensor(lr); "
              "train_step = torch.compile(train_step)  # forward, loss, backward, optimizer.step()")
    modes = ("train",)  # its difference is the compiled step
    min_warmup = 1

    def compile(self, model, example, device):
        return model

    def adapt_optimizer(self, optimizer):
        # Built once, outside the compiled function (built inside, it would recompile every
        # step); a tensor lr is an input of the graph rather than a constant baked into it,
        # so changing it (a scheduler) does not recompile (pytorch/pytorch#121857).
        return rebuild_optimizer(optimizer, lr=torch.tensor)

    def compile_step(self, step, example, device):
        # fullgraph stays off: loss.backward() inside a fullgraph=True region fails
        # (pytorch/pytorch#120814); dynamo splits around it instead.
        return torch.compile(step)


class CompileDynamic(Compile):
    name = "compile-dynamic"
    description = "torch.compile(model, dynamic=True): every size symbolic from the first compile, no recompile when one changes"
    dynamic = True


class _BatchDynamic(nn.Module):
    """The compiled model, called with each input's first dimension marked dynamic."""

    def __init__(self, compiled: Any):
        super().__init__()
        self.compiled = compiled  # its parameters are the model's: the optimizer trains those

    def forward(self, x):
        torch._dynamo.mark_dynamic(x, 0)
        return self.compiled(x)


class CompileMarkDynamic:
    name = "compile-mark-dynamic"
    description = ("torch.compile(model) with each batch's first dimension marked dynamic: one graph for every "
                   "batch size, the other sizes static")
    use_it = "model = torch.compile(model); torch._dynamo.mark_dynamic(x, 0) on each batch before model(x)"

    def compile(self, model, example, device):
        return _BatchDynamic(torch.compile(model))


def repeated_blocks(model: nn.Module, class_name: Optional[str] = None) -> list[nn.Module]:
    """The model's repeated blocks: the instances (outermost ones) of the module class that occurs
    at least twice, has children of its own and holds the most parameters in all (``class_name``:
    that class instead). Containers (Sequential, ModuleList, ModuleDict) are not blocks unless
    named. Empty where there are none."""
    containers = (nn.Sequential, nn.ModuleList, nn.ModuleDict)
    found = [m for m in model.modules() if m is not model and next(m.children(), None) is not None]
    if class_name is not None:
        found = [m for m in found if type(m).__name__ == class_name]
    else:
        counts = Counter(type(m) for m in found if not isinstance(m, containers))
        weights = {cls: sum(p.numel() for m in found if type(m) is cls for p in m.parameters())
                   for cls, n in counts.items() if n >= 2}
        if not weights:
            return []
        best = max(weights, key=lambda cls: (weights[cls], counts[cls]))
        found = [m for m in found if type(m) is best]
    inner = {id(sub) for m in found for sub in m.modules() if sub is not m}
    return [m for m in found if id(m) not in inner]


class CompileRegional:
    """Regional compilation: each repeated block's forward compiled in place, the rest eager. Dynamo
    treats the blocks' parameters as inputs, so identical blocks can share one compiled graph: the
    compile costs about one block's, where the whole model's grows with depth.

    Why not ``block.compile()``, torch's own recipe: under torch 2.13 on the CPU it compiled
    nothing (dynamo skips the frame of ``Module._call_impl`` it wraps; the first step took
    milliseconds and dynamo saw no frame), where compiling the bound ``forward`` compiles."""

    name = "compile-regional"
    description = ("the model's repeated blocks compiled (each block's forward), the rest eager: identical blocks "
                   "share the compiled code")
    use_it = ("for block in model.layers: block.forward = torch.compile(block.forward)  "
              "# each repeated block; the rest stays eager")

    def __init__(self):
        self.blocks: Optional[str] = None

    def configure(self, options: dict) -> None:
        """``--backend-option compile-regional:blocks=CLASS``: compile the instances of the module class
        named CLASS (its ``__name__``) instead of the repeated blocks found."""
        unknown = set(options) - {"blocks"}
        if unknown:
            raise ValueError(f"compile-regional takes blocks=CLASS, not {', '.join(sorted(unknown))}")
        if "blocks" in options and not (isinstance(options["blocks"], str) and options["blocks"].isidentifier()):
            raise ValueError(f"compile-regional: blocks must be a module class's name, got {options['blocks']!r}")
        self.blocks = options.get("blocks")

    def compile(self, model, example, device):
        blocks = repeated_blocks(model, self.blocks)
        if not blocks:
            raise NotApplicable(f"the model has no module named {self.blocks!r}" if self.blocks else
                                "the model has no repeated blocks (no module class with children of its own occurs "
                                "twice); name one with --backend-option compile-regional:blocks=CLASS")
        for block in blocks:
            block.forward = torch.compile(block.forward)
        return model


@hookimpl
def cnncompare_register_backends(register):
    for cls in (Compile, CompileStep, CompileReduceOverhead, CompileMaxAutotune, CompileMaxAutotuneNoCudagraphs,
                AotEager, CompileChannelsLast, CompileDynamic, CompileMarkDynamic, CompileRegional):
        register(cls())
