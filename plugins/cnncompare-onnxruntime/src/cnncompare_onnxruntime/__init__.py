"""An ONNX Runtime backend for cnncompare, through the public plugin contract only.

``onnxruntime`` (``--mode inference`` only): the eval-mode model exported with
``torch.onnx.export`` (torch's dynamo-based exporter; it needs onnxscript), then run by an
ONNX Runtime ``InferenceSession`` with every graph optimisation on, on the CPU execution
provider, or CUDA's where the device is CUDA and that provider loads. Compile time is the
export plus the session's creation (ONNX Runtime optimises the graph there).

Fairness: the session gets as many intra-op threads as torch has in the cell
(``torch.get_num_threads()``, which the harness sets from ``--threads``) and one inter-op
thread, as torch runs one op at a time. Inputs and outputs cross as numpy arrays; on the CPU
``Tensor.numpy()`` and ``torch.from_numpy`` share memory, so nothing is copied. On CUDA the
batch is copied to the host and the output back to the device every step, and those copies are
in the row's time: what a caller handing torch tensors to ONNX Runtime without IO binding pays.
"""
from __future__ import annotations

import os
import tempfile

import torch

import cnncompare

__version__ = "0.1.0"


def _provider(device: torch.device) -> str:
    return "CUDAExecutionProvider" if device.type == "cuda" else "CPUExecutionProvider"


class OnnxRuntime:
    name = "onnxruntime"
    own_allocator = True  # its arena, not torch's: CUDA peaks can't see it
    description = ("torch.onnx.export (dynamo exporter), run by an ONNX Runtime InferenceSession (all graph "
                   "optimisations; CPU provider, CUDA's on CUDA devices with host copies counted)")
    use_it = ('torch.onnx.export(model.eval(), (example_batch,), "model.onnx", dynamo=True); '
              'session = onnxruntime.InferenceSession("model.onnx"); session.run(None, {session.get_inputs()[0].name: x.numpy()})')
    modes = ("inference",)

    def unavailable_reason(self, device):
        if device.type not in ("cpu", "cuda"):
            return f"ONNX Runtime is wired up for cpu and cuda here, not {device.type}"
        try:
            import onnxruntime
        except Exception as exc:  # ImportError, or a broken install raising anything else
            return f"needs the 'onnxruntime' package: {type(exc).__name__}: {exc}"
        if _provider(device) not in onnxruntime.get_available_providers():
            return (f"this onnxruntime has no {_provider(device)} (it has "
                    f"{', '.join(onnxruntime.get_available_providers())}); install onnxruntime-gpu for CUDA")
        return None

    def compile(self, model, example, device):
        import onnxruntime

        # Inside the cell's compile cache when the harness set one: removed with the cell.
        base = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        if base:
            os.makedirs(base, exist_ok=True)
        path = os.path.join(tempfile.mkdtemp(prefix="cnncompare-onnx-", dir=base or None), "model.onnx")
        torch.onnx.export(model, (example,), path, dynamo=True)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        options.inter_op_num_threads = 1
        options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
        session = onnxruntime.InferenceSession(path, options, providers=[_provider(device)])
        if session.get_providers()[0] != _provider(device):  # ONNX Runtime falls back silently
            raise RuntimeError(f"ONNX Runtime did not load {_provider(device)} (it runs on "
                               f"{', '.join(session.get_providers())})")
        input_name = session.get_inputs()[0].name

        def forward(x):
            outputs = session.run(None, {input_name: x.detach().cpu().contiguous().numpy()})
            tensors = [torch.from_numpy(o).to(device) for o in outputs]
            return tensors[0] if len(tensors) == 1 else tuple(tensors)

        return forward


@cnncompare.hookimpl
def cnncompare_register_backends(register):
    register(OnnxRuntime())
