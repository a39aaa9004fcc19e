"""Workloads: what a backend trains.

Each built-in module here (``seed_cnn``, ``resnet``, ``transformer``) is a pluggy plugin
registering workloads through ``cnncompare_register_workloads``, exactly as a third-party
plugin would; they are listed in ``cnncompare.plugins.BUILTIN_PLUGINS``. A new built-in
workload goes in a module here. The contract is ``workloads/base.py``; ``find`` also resolves
the names no plugin registers: ``torchvision:<model>`` and ``timm:<model>`` (``library.py``)
and a user's ``file.py:factory`` or ``module:factory`` (``factory.py``).
"""
from __future__ import annotations

from typing import Any, Mapping

from .factory import ModelSpec, WorkloadError


def find(name: str, registered: Mapping[str, Any]) -> tuple[Any, str]:
    """The workload ``--workload name`` means and where it comes from (a plugin's name, the
    library, or the user's file). Raises ``WorkloadError`` (one line) when it can't be had."""
    if name in registered:
        return registered[name], ""
    prefix, sep, _ = name.partition(":")
    if sep and prefix in ("torchvision", "timm"):
        from .library import LibraryWorkload

        return LibraryWorkload(name), prefix
    if sep:
        from .factory import FactoryWorkload

        workload = FactoryWorkload(name)
        return workload, f"user code {workload.path or workload.module}"
    raise WorkloadError(f"unknown workload {name!r}; known: {', '.join(registered)}, torchvision:<model>, "
                        f"timm:<model>, FILE.py:FUNCTION, MODULE:FUNCTION")


__all__ = ["ModelSpec", "WorkloadError", "find"]
