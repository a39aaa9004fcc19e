"""Compare two runs cell by cell: did a backend get slower, and is the change beyond the noise?

By default each row's figure is what its run's verdict uses: its speedup over eager, measured
inside that run (paired step by step where the run had warm pairs), with its 95 % interval. The
change of a row is base speedup ÷ new speedup (> 1: its step now takes that much longer relative
to eager); its interval comes from both runs' intervals (``stats.interval_ratio``), so a change
that each run's own noise could make is "within noise". Comparing speedups cancels what moves
every row alike between two runs minutes or machines apart (a busier machine, another CPU).

``absolute`` compares step times instead (eager across machines or torch releases): each side's
figure is the median of its rounds' medians (``stats.typical_step_s``), tested at the level that
is independent, the rounds' log medians (Welch's t-test, ``stats.rounds_test``). Those figures
come from different minutes and are unpaired; the comparison says so.

The gate (``regressions``): a row fails when it got slower by more than the threshold **and**
the change is beyond noise (its interval excludes 1; with ``absolute``, p < alpha). A row whose
change can't be tested (one round, no interval) never fails the gate; it is shown as untested.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tabulate import tabulate

from ..records import Status
from ..results import CellResult, RunReport, differences
from ..stats import CONFIDENCE, interval_ratio, rounds_of, rounds_test, typical_step_s
from .formatting import md_cell
from .tables import ranked


@dataclass
class CellComparison:
    """One backend on one device in both runs. ``slowdown`` is how many times longer its step
    takes in the new run than in the base (relative to eager's by default; in seconds with
    ``absolute``): > 1 is slower. ``interval`` is its 95 % interval (speedups), ``p_value`` the
    test's (absolute)."""

    backend: str
    device: str
    base_status: Optional[str]
    new_status: Optional[str]
    base_value: Optional[float] = None
    new_value: Optional[float] = None
    slowdown: Optional[float] = None
    interval: Optional[tuple[float, float]] = None
    p_value: Optional[float] = None
    baseline: bool = False  # eager, when speedups are compared: 1 by definition in both

    @property
    def comparable(self) -> bool:
        return self.slowdown is not None

    @property
    def change_pct(self) -> Optional[float]:
        return None if self.slowdown is None else (self.slowdown - 1.0) * 100.0

    def beyond_noise(self, alpha: float) -> Optional[bool]:
        """Whether the change is beyond the runs' noise; None where it can't be tested."""
        if self.interval is not None:
            return not (self.interval[0] <= 1.0 <= self.interval[1])
        return None if self.p_value is None else self.p_value < alpha


def compare_runs(base: RunReport, new: RunReport, absolute: bool = False) -> list[CellComparison]:
    """Every backend and device of either run, in the new run's report order (its ``ok`` rows
    fastest first by speedup, then the rest)."""
    base_cells = {(r.backend, r.device): r for r in base.results}
    new_cells = {(r.backend, r.device): r for r in new.results}
    out = []
    for key in _report_order(new.results, base.results):
        b, n = base_cells.get(key), new_cells.get(key)
        c = CellComparison(key[0], key[1], b.status.value if b else None, n.status.value if n else None)
        if b and n and b.status == n.status == Status.OK and b.step_s and n.step_s:
            if absolute:
                c.base_value, c.new_value = typical_step_s(b), typical_step_s(n)
                c.slowdown = c.new_value / c.base_value
                c.p_value = rounds_test(rounds_of(b), rounds_of(n))
            elif key[0] == "eager":
                c.base_value = c.new_value = 1.0
                c.baseline = True
            elif b.speedup_vs_eager and n.speedup_vs_eager:
                c.base_value, c.new_value = b.speedup_vs_eager, n.speedup_vs_eager
                c.slowdown = b.speedup_vs_eager / n.speedup_vs_eager
                if b.speedup_ci and n.speedup_ci:
                    (b_low, b_high), (n_low, n_high) = b.speedup_ci, n.speedup_ci
                    c.interval = interval_ratio((b.speedup_vs_eager, b_low, b_high), (n.speedup_vs_eager, n_low, n_high))
        out.append(c)
    return out


def _report_order(new: list[CellResult], base: list[CellResult]) -> list[tuple[str, str]]:
    """The new report's row order (``tables.ranked``), then the rows only the base has."""
    return list(dict.fromkeys([(r.backend, r.device) for r in [*ranked(new), *base]]))


def regressions(cells: list[CellComparison], fail_above_pct: float, alpha: float = 0.05) -> list[CellComparison]:
    """Rows that got slower by more than ``fail_above_pct`` percent, beyond the runs' noise."""
    return [c for c in cells if c.change_pct is not None and c.change_pct > fail_above_pct and c.beyond_noise(alpha)]


def render_comparison(base: RunReport, new: RunReport, cells: list[CellComparison], alpha: float,
                      fail_above_pct: Optional[float], absolute: bool = False) -> str:
    if absolute:
        how = ("Step times, **unpaired**: each side's figure is the median of its rounds' medians, measured in other "
               "minutes (or on another machine) than the other's. Change = new ÷ base (> 1 is slower). *Beyond "
               f"noise* = Welch's t-test on the rounds' log medians (each round a fresh process), two-sided, p < "
               f"{alpha:g}; with one round on a side, untested.")
        headers = ["backend", "base median (s)", "new median (s)", "change", "p", "verdict"]
    else:
        how = ("Each row's speedup over eager, as its run's verdict measured it (paired inside each run). Change = "
               "base speedup ÷ new speedup: how much longer the row's step takes relative to eager's (> 1 is slower), "
               f"with its {CONFIDENCE * 100:.0f} % interval from both runs' intervals; *beyond noise* when that interval "
               "excludes 1. `--absolute` compares step times instead.")
        headers = ["backend", "base speedup", "new speedup", f"change [{CONFIDENCE * 100:.0f} %]", "verdict"]
    out = ["# cnncompare: comparison", "", f"Base: {md_cell(base.started_at)} · new: {md_cell(new.started_at)}. {how}"]
    changes = differences(base, new)
    if changes:
        out += ["", "**The environment or the workload changed**, so differences may come from them, not the code:", ""]
        out += [f"- {md_cell(c)}" for c in changes]
    for device in dict.fromkeys(c.device for c in cells):
        rows = [_row(c, alpha, absolute) for c in cells if c.device == device]
        out += ["", f"## {md_cell(device)}", "", tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)]
    if fail_above_pct is not None:
        bad = regressions(cells, fail_above_pct, alpha)
        out += ["", f"**Gate (--fail-above {fail_above_pct:g} %: slower by more than that, beyond noise)**: " + (
            "failed: " + ", ".join(f"{md_cell(c.backend)} on {md_cell(c.device)} ({c.change_pct:+.1f} %)" for c in bad)
            if bad else "passed.")]
    return "\n".join(out) + "\n"


def _row(c: CellComparison, alpha: float, absolute: bool) -> list[str]:
    blank = ["–"] * (4 if absolute else 3)
    if c.baseline:
        return [md_cell(c.backend), "1.00x", "1.00x", "–", "the baseline (`--absolute` compares its step time)"]
    if c.slowdown is None:
        return [md_cell(c.backend), *blank, f"not comparable (base {c.base_status or 'absent'}, new "
                                            f"{c.new_status or 'absent'})"]
    beyond = c.beyond_noise(alpha)
    verdict = (("slower" if c.slowdown > 1 else "faster") if beyond else "within noise" if beyond is not None else
               "untested (one round)" if absolute else "untested (no interval)")
    change = f"{c.change_pct:+.1f} %"
    if absolute:
        return [md_cell(c.backend), f"{c.base_value:.4g}", f"{c.new_value:.4g}", change,
                "–" if c.p_value is None else f"{c.p_value:.3g}", verdict]
    if c.interval is not None:
        change += f" [{(c.interval[0] - 1) * 100:+.1f}, {(c.interval[1] - 1) * 100:+.1f}]"
    return [md_cell(c.backend), f"{c.base_value:.2f}x", f"{c.new_value:.2f}x", change, verdict]
