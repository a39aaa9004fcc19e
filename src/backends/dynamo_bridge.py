"""A bridge: every backend registered with torch.compile, as ``dynamo:<name>``.

``torch._dynamo.list_backends`` already knows what is installed, built-in or
through third-party ``torch_dynamo_backends`` entry points. These are not in
``--backends all`` (which stays the curated set): name them, or use a
pattern such as ``--backends all,dynamo:*``.
"""
import importlib

import torch

from .. import hookimpl

#: Debugging aids and deliberate failures that torch registers for its own tests.
_EXCLUDED = ("TESTING_ONLY", "minifier", "eager_debug", "eager_noexcept", "crossref", "invoke_subgraph")

#: Backends whose compiler lives in another package; missing it means `skipped`.
_REQUIRES = {
    "tvm": "tvm",
    "openxla": "torch_xla",
    "openxla_eval": "torch_xla",
    "onnxrt": "onnxruntime",
    "tensorrt": "torch_tensorrt",
    "torch_tensorrt": "torch_tensorrt",
    "ipex": "intel_extension_for_pytorch",
}

#: Backends that only work on CUDA devices.
_CUDA_ONLY = {"cudagraphs"}


class DynamoBackend:
    min_warmup = 1
    in_all = False

    def __init__(self, dynamo_name: str):
        self.dynamo_name = dynamo_name
        self.name = f"dynamo:{dynamo_name}"
        self.options: dict = {}
        self.description = f"torch.compile(model, backend={dynamo_name!r})"
        self.use_it = f"model = torch.compile(model, backend={dynamo_name!r})"

    def configure(self, options: dict) -> None:
        """``--backend-option dynamo:NAME:KEY=VALUE``: ``torch.compile``'s ``options``, which it hands
        to the backend (OpenVINO's ``aot_autograd``, ``device``...; torch checks none of them)."""
        self.options = dict(options)
        self.description = f"torch.compile(model, backend={self.dynamo_name!r}, options={self.options!r})"
        self.use_it = f"model = {self.description}"

    def unavailable_reason(self, device):
        module = _REQUIRES.get(self.dynamo_name)
        if module is not None:
            try:
                importlib.import_module(module)
            except Exception as exc:  # ImportError, or a broken install raising anything else
                return f"needs the {module!r} package: {type(exc).__name__}: {exc}"
        if self.dynamo_name in _CUDA_ONLY and device.type != "cuda":
            return f"{self.dynamo_name} works on CUDA devices only"
        return None

    def compile(self, model, example, device):
        return torch.compile(model, backend=self.dynamo_name, options=self.options or None)


def dynamo_backend_names() -> list[str]:
    import torch._dynamo

    return [n for n in torch._dynamo.list_backends(exclude_tags=()) if not any(x in n for x in _EXCLUDED)]


@hookimpl
def cnncompare_register_backends(register):
    for name in dynamo_backend_names():
        register(DynamoBackend(name))
