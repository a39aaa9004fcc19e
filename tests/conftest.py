import atexit
import os
import shutil
import sys
import tempfile
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
#: apart from those of another test run on the same machine, and (under pytest-xdist, where the
#: workers inherit the controller's) from another worker's, which runs its own fork server.
os.environ.setdefault("CNNCOMPARE_TEST_RUN", uuid.uuid4().hex)
if (worker := os.environ.get("PYTEST_XDIST_WORKER")) and not os.environ["CNNCOMPARE_TEST_RUN"].endswith(worker):
    os.environ["CNNCOMPARE_TEST_RUN"] += f"-{worker}"
#: The suite's compile cache (``_shared_compile_cache``), made once and shared by every worker:
#: inductor's caches are written atomically, for concurrent compiles.
if "CNNCOMPARE_TEST_COMPILE_CACHE" not in os.environ:
    os.environ["CNNCOMPARE_TEST_COMPILE_CACHE"] = tempfile.mkdtemp(prefix="cnncompare-test-compile-cache-")
    atexit.register(shutil.rmtree, os.environ["CNNCOMPARE_TEST_COMPILE_CACHE"], True)
#: The session's parity-reference cache: never the user's, shared by the session's tests (a test
#: about the cache takes one of its own), removed when the session ends.
if "CNNCOMPARE_CACHE_DIR" not in os.environ:
    os.environ["CNNCOMPARE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cnncompare-test-cache-")
    atexit.register(shutil.rmtree, os.environ["CNNCOMPARE_CACHE_DIR"], True)


#: The suite's shared compile cache (``_shared_compile_cache``); None: each cell's own (``cold_compiles``).
SHARED_COMPILE_CACHE: dict[str, str] = {}


@pytest.fixture(autouse=True, scope="session")
def _shared_compile_cache():
    """Every cell compiles in a cache directory of its own, cold, as a user's first run does. Here
    the suite's cold cells share one instead: a graph an earlier cell compiled (inductor's FX
    graphs, AOT autograd's, the C++ kernels gcc built) is loaded, not built again, and a tiny
    cell's compile drops from ~11 s to a few on 2 cores. No test asserts a compile time; a test
    about what a cold compile does takes ``cold_compiles``. ``--compile-cache warm`` cells keep
    the harness's own directories."""
    from cnncompare.core.run import launch

    SHARED_COMPILE_CACHE["dir"] = os.environ["CNNCOMPARE_TEST_COMPILE_CACHE"]
    own = launch.child_env

    def child_env(cache_dir, config):
        env = own(cache_dir, config)
        if config.compile_cache == "cold" and "dir" in SHARED_COMPILE_CACHE:
            env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(SHARED_COMPILE_CACHE["dir"], "inductor")
        return env

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(launch, "child_env", child_env)
        yield


@pytest.fixture
def cold_compiles(monkeypatch):
    """This test's cells compile cold, each in its own cache directory, as a user's first run does."""
    monkeypatch.delitem(SHARED_COMPILE_CACHE, "dir")


@pytest.fixture
def fresh_reference_cache(monkeypatch, tmp_path):
    """An empty parity-reference cache of the test's own, and no reference this process made
    earlier: the run computes its reference. Its entries' directory."""
    from cnncompare.core.run import cell, reference_cache

    monkeypatch.setenv(reference_cache.ENV_DIR, str(tmp_path / "cache"))
    monkeypatch.setattr(cell, "_REFERENCES", {})
    return tmp_path / "cache" / "reference"


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

