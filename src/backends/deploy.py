"""Inference-only deploy paths: what people ship a trained model as (``--mode inference``).

Each turns the eval-mode model into a frozen or exported artefact; none can train, so each
declares ``modes = ("inference",)`` and is ``skipped`` in a training run. The harness calls
``compile`` with the model in eval mode under ``torch.no_grad()`` (docs/inference.md).
"""
import os
import tempfile

import torch

from .. import hookimpl


def artefact_dir(prefix: str) -> str:
    """A directory for a compiled artefact, inside the cell's compile cache where the harness set
    one (removed with the cell's directory, even if the cell is killed), else a temp directory."""
    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if base:
        os.makedirs(base, exist_ok=True)
    return tempfile.mkdtemp(prefix=prefix, dir=base or None)


class JitFreeze:
    name = "jit-freeze"
    description = ("torch.jit.trace, torch.jit.freeze (weights and attributes inlined as constants) and "
                   "torch.jit.optimize_for_inference (conv+BatchNorm folding, oneDNN layouts on the CPU)")
    use_it = 'model = torch.jit.optimize_for_inference(torch.jit.freeze(torch.jit.trace(model.eval(), example_batch)))'
    modes = ("inference",)
    # The profiling executor specialises on the first runs, as for jit-trace.
    min_warmup = 2

    def compile(self, model, example, device):
        traced = torch.jit.trace(model, example)
        return torch.jit.optimize_for_inference(torch.jit.freeze(traced))


class CompileFreezing:
    name = "compile-freezing"
    description = ("torch.compile(model, options={'freezing': True}): inductor treats the weights as "
                   "constants (folds BatchNorm into the convolutions, pre-packs weights); compiles lazily")
    use_it = 'model = torch.compile(model.eval(), options={"freezing": True})'
    modes = ("inference",)

    def compile(self, model, example, device):
        return torch.compile(model, options={"freezing": True})


class ExportAotInductor:
    name = "export-aot-inductor"
    description = ("torch.export.export, then AOTInductor compiles it to a shared library packaged as .pt2, "
                   "loaded with aoti_load_package and run (no Python model at serving time)")
    use_it = ('torch._inductor.aoti_compile_and_package(torch.export.export(model.eval(), (example_batch,)), '
              'package_path="model.pt2"); model = torch._inductor.aoti_load_package("model.pt2")')
    modes = ("inference",)

    def compile(self, model, example, device):
        import torch._inductor

        program = torch.export.export(model, (example,))
        path = os.path.join(artefact_dir("cnncompare-aoti-"), "model.pt2")
        torch._inductor.aoti_compile_and_package(program, package_path=path)
        return torch._inductor.aoti_load_package(path)


@hookimpl
def cnncompare_register_backends(register):
    for cls in (JitFreeze, CompileFreezing, ExportAotInductor):
        register(cls())
