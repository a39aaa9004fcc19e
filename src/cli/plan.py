"""``cnncompare run --dry-run``: the plan of a run, and how long it should take, without running it.

The estimate comes from what is known: the most recent earlier run in the output folder (or in
./reports) of the same workload, options, mode, batch size and devices, scaled by how many
cells and rounds each has. Without one, the plan says so rather than guess.
"""
from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any, Optional, Sequence

from ..core.config import RunConfig


def _same_job(report: Any, config: RunConfig) -> bool:
    c = report.config
    return (c.workload.name, dict(c.workload.options), c.mode, c.batch_size, tuple(c.devices)) == \
        (config.workload.name, dict(config.workload.options), config.mode, config.batch_size, tuple(config.devices))


def _seconds(report: Any) -> Optional[float]:
    try:
        start, end = (_dt.datetime.fromisoformat(t) for t in (report.started_at, report.finished_at))
    except (TypeError, ValueError):
        return None
    return (end - start).total_seconds() if not report.interrupted else None


def earlier_run(config: RunConfig, folders: list[Path]) -> Optional[tuple[Path, Any]]:
    """The most recent finished run of the same job in ``folders``, with its path."""
    from ..core.results import RunReport

    found = []
    for folder in folders:
        for path in folder.glob("*.json") if folder.is_dir() else []:
            try:
                report = RunReport.from_json(path.read_text(encoding="utf-8"))
            except Exception:  # another tool's JSON, a sweep's summary, an older schema: not ours to read
                continue
            if _same_job(report, config) and _seconds(report):
                found.append((report.finished_at or "", path, report))
    if not found:
        return None
    _, path, report = max(found, key=lambda item: item[0])
    return path, report


#: Why the command line adds a backend the user didn't name (``run._configs``).
ADDED_BECAUSE = {
    "eager": "the baseline every speedup is measured against",
    "eager-control": "eager measured again like any backend: the run's noise floor (--no-control leaves it out)",
}


def render_plan(configs: list[RunConfig], registry, slots, output_dir: Path, added: Sequence[str] = ()) -> str:
    """What ``run`` would do with ``configs`` on ``slots``: per device, the backends that run and
    those skipped (with why), those added though not named (with why), the cells and rounds, and
    the estimated time."""
    from ..core.report.summary import warmup_text
    from ..core.run.orchestrate import unavailable

    lines = []
    for config in configs:
        w = config.workload
        options = ", ".join(f"{k}={v}" for k, v in w.options.items())
        lines.append(f"Plan: {w.name} ({options or 'no options'}), {config.mode}, batch {config.batch_size}, "
                     f"{warmup_text(config)} + {config.steps} measured steps, {config.rounds} round(s) per device"
                     + (f", then more {_more_rounds(config)} while the run is within {config.budget_s:g} s."
                        if config.rounds > 1 and not config.distributed else "."))
        lines.append(f"- loop each row projects: {w.loop.describe(config.batch_size, config.mode == 'inference')}")
        lines += [f"- added {name}: {ADDED_BECAUSE[name]}" for name in added]
        cells = 0
        for slot in slots:
            runs, skips = [], []
            for name in config.backends:
                reason = slot.unavailable or unavailable(registry.backends[name], slot.name, config)
                (skips.append(f"{name} ({reason})") if reason else runs.append(name))
            cells += len(runs)
            lines.append(f"- {slot.name}: {len(runs)} cells x {config.rounds} rounds: {', '.join(runs) or 'none'}")
            lines += [f"  skipped {skip}" for skip in skips]
        lines.append(_estimate(config, cells, [output_dir, Path("reports")]))
    return "\n".join(lines)


def _estimate(config: RunConfig, cells: int, folders: list[Path]) -> str:
    found = earlier_run(config, folders)
    if found is None:
        return ("Estimated time: unknown (no earlier run of this workload, mode, batch size and devices in "
                f"{', '.join(str(f) for f in folders)} to estimate from).")
    path, report = found
    seconds = _seconds(report)
    assert seconds is not None
    done = sum(len([m for m in r.rounds or [None] if m is not None]) or 1
               for r in report.results if r.status.value != "skipped")
    if not done:
        return f"Estimated time: unknown ({path} ran no cell)."
    estimate = seconds / done * cells * config.rounds
    if config.rounds > 1 and not config.distributed:  # further rounds stop at the budget
        estimate = max(estimate, min(config.budget_s, seconds))
    return (f"Estimated time: about {estimate / 60:.0f} min ({path}: {done} cell-rounds took "
            f"{seconds / 60:.1f} min on {report.environment.get('cpu', 'its machine')}).")


def _more_rounds(config: RunConfig) -> str:
    """Which rows the rounds after ``--rounds`` go to (``core/run/policy.py``)."""
    if config.target is None:
        return "for the rows still contending for the pick, stopping once it is decided,"
    return f"for the rows wider than ±{config.target:g} %"
