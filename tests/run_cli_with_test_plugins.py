"""`python run_cli_with_test_plugins.py ARGS`: the real CLI with tests/fault_backends and toy_workload registered.

Used by tests that need the CLI as its own process (signals, exit codes).
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import cnncompare.plugins as plugins  # noqa: E402
import fault_backends  # noqa: E402
import toy_workload  # noqa: E402

_load = plugins.load_registry


def load_registry(extra_plugins=(), entry_points=True):
    return _load(extra_plugins=[fault_backends, toy_workload, *extra_plugins], entry_points=entry_points)


plugins.load_registry = load_registry

from cnncompare.cli import main  # noqa: E402

sys.exit(main())
