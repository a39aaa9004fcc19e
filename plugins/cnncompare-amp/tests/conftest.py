import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

# The session's parity-reference cache: never the user's (the core suite's conftest sets the
# same where both run in one session).
if "CNNCOMPARE_CACHE_DIR" not in os.environ:
    os.environ["CNNCOMPARE_CACHE_DIR"] = tempfile.mkdtemp(prefix="cnncompare-test-cache-")
    atexit.register(shutil.rmtree, os.environ["CNNCOMPARE_CACHE_DIR"], True)

# Run from a checkout without installing: the package's src/ is importable here and,
# through the sys.path the harness hands its children, in the measurement processes too.
SRC = str(Path(__file__).resolve().parents[1] / "src")
try:
    import cnncompare_amp  # noqa: F401
except ImportError:
    sys.path.insert(0, SRC)
