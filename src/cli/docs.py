"""``cnncompare docs [TOPIC]``: the manual, readable wherever the package is installed.

The topics are the repository's docs/*.md. A wheel installs them under
``<prefix>/share/cnncompare/docs`` (pyproject's data-files); an editable install reads them from
the checkout beside the package. Runtime help names topics (``cnncompare docs workloads``),
never a path or a URL.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

from .parser import EXIT_OK, UsageError


def docs_dir() -> Optional[Path]:
    """Where the manual is: the installed copy, else the source checkout's; None if neither."""
    for candidate in (Path(sys.prefix) / "share" / "cnncompare" / "docs",
                      Path(__file__).resolve().parents[2] / "docs"):
        if candidate.is_dir() and any(candidate.glob("*.md")):
            return candidate
    return None


def topics(where: Path) -> dict[str, str]:
    """Each topic's name and its first heading."""
    out = {}
    for path in sorted(where.glob("*.md")):
        first = path.read_text(encoding="utf-8").lstrip().splitlines()[0]
        out[path.stem] = first.lstrip("# ").strip()
    return out


def docs_command(args: argparse.Namespace) -> int:
    where = docs_dir()
    if where is None:
        raise UsageError("the manual is not installed with this copy of cnncompare")
    known = topics(where)
    if args.topic is None:
        width = max(map(len, known))
        print("\n".join(f"{name:<{width}}  {title}" for name, title in known.items()))
        print("\ncnncompare docs TOPIC prints one.")
        return EXIT_OK
    if args.topic not in known:
        raise UsageError(f"unknown topic {args.topic!r}; topics: {', '.join(known)}")
    print((where / f"{args.topic}.md").read_text(encoding="utf-8"), end="")
    return EXIT_OK
