"""PNG charts beside a markdown report (needs the optional matplotlib: ``pip install cnncompare[plot]``).

Two pictures: step time per backend per device with quartile error bars,
and the break-even picture (one-off cost against step time).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..records import Status
from ..results import RunReport
from ..stats import one_off_cost
from .wording import STEP_UNIT, plural

PLOT_HINT = "Charts: `pip install 'cnncompare[plot]'` (matplotlib) and rerun to get PNG charts beside this report."


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _ok_rows(report: RunReport):
    return [r for r in report.results if r.status in (Status.OK, Status.FAIL_ACCURACY) and r.step_s]


def write_charts(report: RunReport, md_path: Path) -> Optional[list[tuple[str, str]]]:
    """Write the charts next to ``md_path``; return (title, file name) pairs, or None without matplotlib."""
    if not matplotlib_available():
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display; never opens a window
    import matplotlib.pyplot as plt

    rows = _ok_rows(report)
    if not rows:
        return []
    stem = md_path.with_suffix("")
    written = []

    step = STEP_UNIT[report.config.mode]

    # 1. Step time per backend, grouped by device, fastest first, quartile error bars.
    labels, medians, lows, highs, colors = [], [], [], [], []
    devices = list(dict.fromkeys(r.device for r in rows))
    palette = plt.get_cmap("tab10")
    for d_index, device in enumerate(devices):
        for r in sorted((r for r in rows if r.device == device), key=lambda r: r.step_s.median):
            mark = "" if r.status == Status.OK else " (wrong numbers)"
            labels.append(f"{r.backend} · {device}{mark}")
            medians.append(r.step_s.median)
            lows.append(r.step_s.median - r.step_s.q1)
            highs.append(r.step_s.q3 - r.step_s.median)
            colors.append(palette(d_index % 10))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.6))
    y = range(len(labels))
    ax.barh(y, medians, xerr=[lows, highs], color=colors, capsize=3, alpha=0.85)
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    if max(medians) / min(medians) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(f"seconds per {step} (median; bars: first to third quartile)")
    workload = report.config.workload
    size = report.config.batch_size
    ax.set_title(f"Step time, {workload.name}, batch {size} {plural(workload.sample_unit, size)} "
                 "(lower is faster)")
    for i, m in enumerate(medians):
        ax.annotate(f"{m:.3g} s", (m + highs[i], i), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    name = f"{stem.name}-step-time.png"
    fig.savefig(stem.parent / name, dpi=110)
    plt.close(fig)
    written.append(("Step time per backend", name))

    # 2. Break-even: one-off cost (stats.one_off_cost, what break-even repays) against step time.
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for d_index, device in enumerate(devices):
        pts = [r for r in rows if r.device == device]
        xs = [max(one_off_cost(r), 1e-2) for r in pts]
        ys = [r.step_s.median for r in pts]
        ax.scatter(xs, ys, color=palette(d_index % 10), label=device, s=40)
        for r, xv, yv in zip(pts, xs, ys):
            ax.annotate(r.backend, (xv, yv), xytext=(5, 3), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    left, right = ax.get_xlim()
    ax.set_xlim(left, right * 4)  # room for the labels of the slowest compilers
    ax.set_xlabel("one-off cost: compile, and first step + warm-up beyond steady steps (s, log scale)")
    ax.set_ylabel(f"seconds per {step} (median)")
    ax.set_title("Compile cost against step time\n(lower left wins; lower right pays back only over many steps)",
                 fontsize=11)
    ax.grid(alpha=0.3, which="both")
    if len(devices) > 1:
        ax.legend(title="device")
    fig.tight_layout()
    name = f"{stem.name}-compile-vs-step.png"
    fig.savefig(stem.parent / name, dpi=110)
    plt.close(fig)
    written.append(("Compile cost against step time", name))
    return written
