"""Where every report is written, in every format: the one entry point the commands use.

``write_report`` writes one run's report: JSON (the record), markdown (what people read), CSV
when asked, and at the final write the PNG charts beside the markdown. ``write_sweep`` writes
a batch-size sweep's summary the same way. Each file is replaced atomically, so a run killed
mid-write leaves the previous version, never half a file.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..fileio import write_atomic
from ..results import RunReport


@dataclass(frozen=True)
class Outputs:
    """Where one report goes; a None path is a format not written."""

    markdown: Path
    json: Optional[Path] = None
    csv: Optional[Path] = None

    def paths(self) -> list[Path]:
        return [p for p in (self.markdown, self.json, self.csv) if p is not None]


@dataclass
class Written:
    """What the final write produced: the markdown text, and the charts as (title, file) pairs."""

    markdown: str
    charts: list[tuple[str, str]] = field(default_factory=list)


def write_report(report: RunReport, outputs: Outputs, final: bool = False) -> Written:
    """Write ``report`` to ``outputs``. While a run goes on (not ``final``) the text formats are
    rewritten after each cell; the ``final`` write also draws the charts. A chart that can't be
    drawn is a note in the report, never a lost report."""
    from .charts import write_charts
    from .data import render_csv, render_json
    from .markdown import render_markdown

    charts: Optional[list[tuple[str, str]]] = None
    if final:
        try:
            charts = write_charts(report, outputs.markdown)
        except Exception as exc:  # a chart is not worth losing the report for
            charts = []
            report.notes.append(f"charts could not be drawn: {type(exc).__name__}: {exc}")
    if outputs.json is not None:
        write_atomic(outputs.json, render_json(report))
    markdown = render_markdown(report, charts, final=final)
    write_atomic(outputs.markdown, markdown)
    if outputs.csv is not None:
        write_atomic(outputs.csv, render_csv(report))
    return Written(markdown, charts or [])


def write_sweep(points: list, outputs: Outputs, final: bool) -> Written:
    """A ``--batch-size`` sweep's summary (``sweep.SweepPoint``s, one per size whose own report
    ``write_report`` wrote): markdown and JSON, the chart at the final write."""
    import sys

    from .sweep import render_sweep_json, render_sweep_markdown, write_sweep_chart

    chart = None
    if final:
        try:
            chart = write_sweep_chart(points, outputs.markdown)
        except Exception as exc:  # a chart is not worth losing the summary for
            print(f"cnncompare: the sweep's chart could not be drawn: {type(exc).__name__}: {exc}", file=sys.stderr)
    markdown = render_sweep_markdown(points, outputs.markdown, chart, final=final)
    write_atomic(outputs.markdown, markdown)
    if outputs.json is not None:
        write_atomic(outputs.json, render_sweep_json(points, outputs.markdown))
    return Written(markdown, [("throughput against batch size", chart)] if chart else [])
