import sys
from pathlib import Path

# Run from a checkout without installing: the package's src/ is importable here and,
# through the sys.path the harness hands its children, in the measurement processes too.
SRC = str(Path(__file__).resolve().parents[1] / "src")
try:
    import cnncompare_onnxruntime  # noqa: F401
except ImportError:
    sys.path.insert(0, SRC)
