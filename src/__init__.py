"""cnncompare: compare PyTorch compilation backends on one training step.

Plugin authors need two names from here:

- ``cnncompare.hookimpl``: the marker for hook implementations.
- ``cnncompare.Backend``: the protocol a backend object follows (``name`` and
  ``compile`` are required; every other member is optional, see
  ``cnncompare.backends.base``).
"""
from importlib.metadata import PackageNotFoundError, version as _version

import pluggy

#: One name for the markers, the plugin manager and the entry-point group.
PROJECT_NAME = "cnncompare"

hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

try:
    __version__ = _version(PROJECT_NAME)
except PackageNotFoundError:  # running from a checkout that was never installed
    __version__ = "0.0.0+unknown"

from cnncompare.backends.base import Backend  # noqa: E402  (needs PROJECT_NAME first)

__all__ = ["Backend", "PROJECT_NAME", "__version__", "hookimpl"]
