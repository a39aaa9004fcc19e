"""PNG charts beside a markdown report (needs the optional matplotlib: ``pip install cnncompare[plot]``).

The pictures, every figure the table's and in its order (``tables.ranked``): the speedup over
eager with its 95 % interval (what the verdict ranks by, the control's interval shaded as the
noise floor), the step time derived from it (eager's paired step / the speedup, with the
interval that follows), and the break-even picture (the cost up front beyond eager against the
step time).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..records import Status
from ..results import RunReport
from ..stats import CONFIDENCE, CONTROL
from .tables import ranked as table_order
from .wording import STEP_UNIT, plural

#: Where the speedup chart's log axis is labelled (those inside its range).
SPEEDUP_TICKS = (0.1, 0.2, 0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 3.0, 5.0, 10.0, 20.0, 50.0)

PLOT_HINT = "Charts: `pip install 'cnncompare[plot]'` (matplotlib) and rerun to get PNG charts beside this report."


def matplotlib_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _ok_rows(report: RunReport):
    """The rows with a step time, in the table's order, device by device."""
    return [r for device in report.devices() for r in table_order(report.rows(device))
            if r.status in (Status.OK, Status.FAIL_ACCURACY) and r.step_time_s]


def write_charts(report: RunReport, md_path: Path) -> Optional[list[tuple[str, str]]]:
    """Write the charts next to ``md_path``; return (title, file name) pairs, or None without matplotlib."""
    if not matplotlib_available():
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display; never opens a window
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    rows = _ok_rows(report)
    if not rows:
        return []
    stem = md_path.with_suffix("")
    written = []

    step = STEP_UNIT[report.config.mode]
    devices = list(dict.fromkeys(r.device for r in rows))
    palette = plt.get_cmap("tab10")

    # 1. The speedup over eager with its interval, per device, largest first: the figure the
    # verdict ranks by (step times come from each row's own minutes; the speedups pair them).
    ranked = [r for r in rows if r.status == Status.OK and r.speedup_ci and r.speedup_vs_eager
              and r.backend != "eager"]
    if ranked:
        fig, ax = plt.subplots(figsize=(8, 0.42 * len(ranked) + 1.8))
        names: list[str] = []
        for d_index, device in enumerate(devices):
            mine = [r for r in ranked if r.device == device]
            control = next((r for r in mine if r.backend == CONTROL), None)
            if control is not None and control.speedup_ci:
                floor_low, floor_high = control.speedup_ci
                ax.axvspan(floor_low, floor_high, color=palette(d_index % 10), alpha=0.12, lw=0)
            for r in mine:
                assert r.speedup_vs_eager is not None and r.speedup_ci is not None
                low, high = r.speedup_ci
                at = len(names)
                ax.errorbar(r.speedup_vs_eager, at, xerr=[[r.speedup_vs_eager - low], [high - r.speedup_vs_eager]],
                            fmt="o", color=palette(d_index % 10), capsize=3)
                star = "*" if r.target_reached is False else ""
                ax.annotate(f"{r.speedup_vs_eager:.2f}x{star}", (high, at), xytext=(6, 0), textcoords="offset points",
                            va="center", fontsize=8)
                names.append(f"{r.backend} · {device}")
        ax.set_yticks(range(len(names)), names)
        ax.invert_yaxis()
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xscale("log")
        left, right = ax.get_xlim()
        ax.set_xlim(left, right * 1.08)  # room for the labels
        ax.set_xticks([v for v in SPEEDUP_TICKS if left <= v <= right * 1.08] or [1.0])
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(f"speedup over eager (> 1x is faster; log scale), {CONFIDENCE:.0%} interval\n"
                      f"shaded: the noise floor ({CONTROL}, eager against itself)")
        starred = any(r.target_reached is False for r in ranked)
        ax.set_title("Speedup over eager, step pair by step pair"
                     + ("\n(* interval wider than --target)" if starred else ""), fontsize=11)
        ax.grid(axis="x", alpha=0.3, which="both")
        fig.tight_layout()
        name = f"{stem.name}-speedup.png"
        fig.savefig(stem.parent / name, dpi=110)
        plt.close(fig)
        written.append(("Speedup over eager", name))

    # 2. Step time per backend, as the table has it: eager's paired step over each row's speedup,
    # with the interval that follows from the speedup's (a row without a speedup: its own median).
    labels, times, lows, highs, colors = [], [], [], [], []
    for d_index, device in enumerate(devices):
        for r in (r for r in rows if r.device == device):
            mark = "" if r.status == Status.OK else " (wrong numbers)"
            labels.append(f"{r.backend} · {device}{mark}")
            assert r.step_time_s is not None
            low, high = r.step_time_ci or (r.step_time_s, r.step_time_s)
            times.append(r.step_time_s)
            lows.append(r.step_time_s - low)
            highs.append(high - r.step_time_s)
            colors.append(palette(d_index % 10))
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(labels) + 1.6))
    y = range(len(labels))
    ax.barh(y, times, xerr=[lows, highs], color=colors, capsize=3, alpha=0.85)
    ax.set_yticks(list(y), labels)
    ax.invert_yaxis()
    if max(times) / min(times) > 20:
        ax.set_xscale("log")
    ax.set_xlabel(f"seconds per {step}: eager's paired step ÷ the speedup (bars: its {CONFIDENCE:.0%} interval)")
    workload = report.config.workload
    size = report.config.batch_size
    ax.set_title(f"Step time, {workload.name}, batch {size} {plural(workload.sample_unit, size)} "
                 "(lower is faster)")
    for i, m in enumerate(times):
        ax.annotate(f"{m:.3g} s", (m + highs[i], i), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    name = f"{stem.name}-step-time.png"
    fig.savefig(stem.parent / name, dpi=110)
    plt.close(fig)
    written.append(("Step time per backend", name))

    # 3. Break-even: the cost up front beyond eager (what break-even repays) against step time.
    fig, ax = plt.subplots(figsize=(8, 5.5))
    for d_index, device in enumerate(devices):
        pts = [r for r in rows if r.device == device and (r.up_front_s is not None or r.backend == "eager")]
        xs = [max(r.up_front_s or 0.0, 1e-2) for r in pts]
        ys = [r.step_time_s for r in pts]
        ax.scatter(xs, ys, color=palette(d_index % 10), label=device, s=40)
        for r, xv, yv in zip(pts, xs, ys):
            ax.annotate(r.backend, (xv, yv), xytext=(5, 3), textcoords="offset points", fontsize=8)
    ax.set_xscale("log")
    left, right = ax.get_xlim()
    ax.set_xlim(left, right * 4)  # room for the labels of the slowest compilers
    ax.set_xlabel("up front beyond eager: compile, and first step + warm-up beyond steady steps\n"
                  "(s, log scale; 0.01: nothing beyond a step's noise)")
    ax.set_ylabel(f"seconds per {step} (eager's paired step ÷ the speedup)")
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
