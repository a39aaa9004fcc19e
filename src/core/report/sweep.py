"""A batch-size sweep's summary (``--batch-size 16,32,64``): one table and one chart of
throughput against batch size per backend, and the verdict at each size.

Each size is a whole run of its own, written as its own report beside the summary (markdown,
JSON, charts), so ``compare``, ``report`` and ``--resume`` work on it unchanged; the summary's
JSON names those reports and repeats what the summary shows.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from tabulate import tabulate

from ..codec import finite
from ..records import Status
from ..results import SCHEMA_VERSION, RunReport
from .charts import matplotlib_available
from .formatting import md_cell, num
from .summary import run_line, summary_line


@dataclass
class SweepPoint:
    """One batch size's run and where its own report was written."""

    batch_size: int
    report: RunReport
    markdown_path: Path
    json_path: Path


def _row(report: RunReport, device: str, backend: str):
    return next((r for r in report.rows(device) if r.backend == backend), None)


def render_sweep_markdown(points: list[SweepPoint], md_path: Path, chart: Optional[str], final: bool = True) -> str:
    first = points[0].report
    unit = first.config.workload.unit
    sizes = [p.batch_size for p in points]
    out = ["# cnncompare: batch-size sweep", ""]
    if not final:
        out += ["*(in progress: sizes still to run are missing)*", ""]
    out += [run_line(first, batch=", ".join(map(str, sizes))), "",
            "Each batch size is a whole run (its own rounds, order and eager baseline), reported in full on its "
            "own: " + ", ".join(f"[batch {p.batch_size}]({_relative(p.markdown_path, md_path)})" for p in points)
            + ".", ""]
    out += ["## Verdict per batch size", ""]
    for p in points:
        for device in p.report.devices():
            out.append(f"- batch {p.batch_size}: " + summary_line(p.report.verdicts[device], p.report.config.mode).lstrip("- "))
    for device in dict.fromkeys(d for p in points for d in p.report.devices()):
        backends = list(dict.fromkeys(r.backend for p in points for r in p.report.rows(device)))
        rows = []
        for backend in backends:
            row = [md_cell(backend)]
            for p in points:
                r = _row(p.report, device, backend)
                if r is None:
                    row.append("–")
                elif r.status != Status.OK or r.images_per_s is None:
                    row.append(r.status.value)
                else:
                    speedup = f" ({r.speedup_vs_eager:.2f}x)" if r.speedup_vs_eager is not None else ""
                    row.append(f"{num(r.images_per_s)}{speedup}")
            rows.append(row)
        out += ["", f"## Throughput ({md_cell(device)}): {unit}s/s (speedup vs eager at that size)", "",
                tabulate(rows, headers=["backend"] + [f"batch {s}" for s in sizes], tablefmt="github",
                         disable_numparse=True)]
    if chart:
        out += ["", f"![throughput against batch size]({chart})"]
    return "\n".join(out).rstrip() + "\n"


def render_sweep_json(points: list[SweepPoint], md_path: Path) -> str:
    """``sweep``: the sizes and each one's report; ``throughput``: per device, backend and size."""
    first = points[0].report
    data = {
        "schema_version": SCHEMA_VERSION,
        "kind": "batch-size sweep",
        "workload": first.config.to_dict()["workload"],
        "batch_sizes": [p.batch_size for p in points],
        "runs": [{"batch_size": p.batch_size, "json": _relative(p.json_path, md_path),
                  "markdown": _relative(p.markdown_path, md_path), "interrupted": p.report.interrupted,
                  "verdict": {d: v.to_dict() for d, v in p.report.verdicts.items()}} for p in points],
        "throughput": [{"device": r.device, "backend": r.backend, "batch_size": p.batch_size,
                        "status": r.status.value, "per_s": r.images_per_s, "unit": first.config.workload.unit,
                        "speedup_vs_eager": r.speedup_vs_eager, "speedup_ci": r.speedup_ci}
                       for p in points for r in p.report.results],
    }
    return json.dumps(finite(data), indent=2, allow_nan=False) + "\n"


def write_sweep_chart(points: list[SweepPoint], md_path: Path) -> Optional[str]:
    """Throughput against batch size, one line per ok backend, one panel per device; the file name."""
    if not matplotlib_available() or len(points) < 2:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    devices = list(dict.fromkeys(d for p in points for d in p.report.devices()))
    fig, axes = plt.subplots(1, len(devices), figsize=(7 * len(devices), 4.5), squeeze=False)
    workload = points[0].report.config.workload
    for ax, device in zip(axes[0], devices):
        backends = list(dict.fromkeys(r.backend for p in points for r in p.report.rows(device)))
        for backend in backends:
            xs, ys = [], []
            for p in points:
                r = _row(p.report, device, backend)
                if r is not None and r.status == Status.OK and r.images_per_s:
                    xs.append(p.batch_size)
                    ys.append(r.images_per_s)
            if xs:
                ax.plot(xs, ys, marker="o", label=backend, linewidth=2.5 if backend == "eager" else 1.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks([p.batch_size for p in points], [str(p.batch_size) for p in points])
        ax.set_xlabel(f"batch size ({workload.sample_unit}s per step)")
        ax.set_ylabel(f"{workload.unit}s/s (median step)")
        ax.set_title(f"{workload.name} on {device}")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    name = md_path.with_suffix("").name + "-throughput.png"
    fig.savefig(md_path.with_name(name), dpi=110)
    plt.close(fig)
    return name


def _relative(path: Path, md_path: Path) -> str:
    try:
        return str(path.resolve().relative_to(md_path.resolve().parent))
    except ValueError:
        return str(path)
