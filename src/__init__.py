"""cnncompare: compare PyTorch compilation backends on one training step.

Plugin authors need these names from here:

- ``cnncompare.hookimpl``: the marker for hook implementations.
- ``cnncompare.Backend``: the protocol a backend object follows (``name`` and
  ``compile`` are required; every other member is optional, see
  ``cnncompare.backends.base``).
- ``cnncompare.Workload``: the protocol a workload object follows (see
  ``cnncompare.workloads.base``).
- ``cnncompare.ModelSpec``: what a user's model factory may return
  (``--workload file.py:factory``, see ``cnncompare.workloads.factory``).
- ``cnncompare.Recipe``: a workload's training recipe (optimizer, scheduler, clipping,
  accumulation), what a plugin workload's optional ``recipe(options)`` returns.

The package's map: ``cli`` (the command line) -> ``core/run`` (the parent:
plan, launch, supervise) -> ``core/cell`` (inside each cell's child:
measure) -> ``core/records`` (what crosses back) -> ``core/stats`` ->
``core/report``. Backends live in ``backends/``, workloads in
``workloads/``, the plugin contract in ``hookspecs`` and ``plugins``.
"""
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

import pluggy

#: One name for the markers, the plugin manager and the entry-point group.
PROJECT_NAME = "cnncompare"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

try:
    __version__ = _version(PROJECT_NAME)
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0+unknown"

from .backends.base import Backend  # noqa: E402  (needs PROJECT_NAME first)
from .workloads.base import Recipe, Workload  # noqa: E402
from .workloads.factory import ModelSpec  # noqa: E402

__all__ = ["Backend", "ModelSpec", "PROJECT_NAME", "Recipe", "Workload", "__version__", "hookimpl"]
