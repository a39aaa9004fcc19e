import os
import sys
import uuid
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
# The test backends must import in the measurement child too; it receives sys.path from the parent.
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

from _tiny import TINY  # noqa: E402
from cnncompare.core.config import RunConfig  # noqa: E402

#: Inherited by every process this test session starts, so leftover children can be told
#: apart from those of another test run on the same machine.
os.environ.setdefault("CNNCOMPARE_TEST_RUN", uuid.uuid4().hex)


@pytest.fixture
def tiny_config():
    def make(**overrides):
        return RunConfig(**{**TINY, **overrides})

    return make


@pytest.fixture(autouse=True)
def _only_builtin_plugins(monkeypatch, request):
    """The core suite is hermetic: installed third-party plugins (cnncompare-amp in CI) stay out,
    in this process and in the children it starts. Tests about plugin loading set it themselves."""
    monkeypatch.setenv("CNNCOMPARE_PLUGINS", "")

