"""Library models by name: ``--workload torchvision:<name>`` and ``--workload timm:<name>``.

Randomly initialised (nothing is downloaded), trained on seeded random images with
cross-entropy. The image size defaults to the model's own: timm's pretrained config's
``input_size``, torchvision's weights' crop size where the model has weights, else 224.
"""
from __future__ import annotations

import importlib
from typing import Any, Mapping

from .base import check_positive, image_batch
from .factory import WorkloadError

LIBRARIES = ("torchvision", "timm")


def _import(library: str) -> Any:
    try:
        return importlib.import_module("torchvision.models" if library == "torchvision" else "timm")
    except ImportError as exc:
        import torch

        raise WorkloadError(f"needs the {library} package, which does not import here ({exc}); install the "
                            f"release that matches torch {torch.__version__}") from None


class LibraryWorkload:
    sample_unit = "image"

    def __init__(self, spec: str):
        self.name = spec
        self.library, _, self.model_name = spec.partition(":")
        models = _import(self.library)
        known = models.list_models() if self.library == "torchvision" else models.list_models()
        if self.model_name not in known:
            raise WorkloadError(f"{self.library} has no model {self.model_name!r} ({self.library}'s list_models() "
                                f"names its {len(known)})")
        self.options = {"image_size": self._default_size(models), "num_classes": 1000}
        self.description = f"{self.model_name} from {self.library}, randomly initialised, cross-entropy"

    def _default_size(self, models: Any) -> int:
        try:
            if self.library == "timm":
                return int(models.get_pretrained_cfg(self.model_name).input_size[-1])
            return int(models.get_model_weights(self.model_name).DEFAULT.transforms().crop_size[0])
        except Exception:  # no pretrained config or weights: the ImageNet size most models take
            return 224

    def check_options(self, options: Mapping[str, Any]) -> None:
        check_positive(options, self.options)

    def build_model(self, options: Mapping[str, Any]) -> Any:
        models = _import(self.library)
        if self.library == "torchvision":
            return models.get_model(self.model_name, weights=None, num_classes=options["num_classes"])
        extra = {}
        if options["image_size"] != self.options["image_size"]:
            extra["img_size"] = options["image_size"]  # models with a fixed input size (ViTs) take it
        return models.create_model(self.model_name, pretrained=False, num_classes=options["num_classes"], **extra)

    def make_batch(self, options: Mapping[str, Any], n: int, generator: Any, device: Any) -> Any:
        return image_batch(n, 3, options["image_size"], options["num_classes"], generator, device)

    def loss(self, output: Any, targets: Any) -> Any:
        from torch.nn import functional

        if isinstance(output, tuple):  # train-mode auxiliary heads (inception, googlenet): the main logits
            output = output[0]
        return functional.cross_entropy(output, targets)
