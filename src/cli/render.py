"""``cnncompare report RUN.json ...``: one report rendered again from runs' JSON reports."""
from __future__ import annotations

import argparse
import sys

from .parser import EXIT_OK
from .select import load_report, writable


def report_command(args: argparse.Namespace) -> int:
    """One run: that run's own report as the run wrote it (with its charts, drawn beside
    ``--output``), so a committed report can be regenerated after the renderer changes. Several:
    one combined report. Without ``--output`` the markdown goes to stdout."""
    from ..core.report.markdown import render_combined, render_markdown
    from ..core.report.writer import Outputs, write_report

    output = writable("--output", args.output) if args.output is not None else None
    reports = [load_report("RUN.json", path) for path in args.runs]
    if len(reports) == 1 and output is not None:
        write_report(reports[0], Outputs(output), final=True)
    else:
        markdown = render_markdown(reports[0]) if len(reports) == 1 else render_combined(reports)
        if output is None:
            print(markdown, end="")
            return EXIT_OK
        from ..core.fileio import write_atomic

        write_atomic(output, markdown)
    print(f"cnncompare: wrote {output}", file=sys.stderr)
    return EXIT_OK
