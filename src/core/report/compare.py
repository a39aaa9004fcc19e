"""Compare two runs cell by cell: did it get slower, and is the change beyond the noise?

Each side's figure is the median of its rounds' medians (``stats.typical_step_s``). The
test is at the level that is independent: each round is a fresh process, so the samples are the
rounds' log medians (Welch's t-test, ``stats.rounds_test``); steps inside one process are not
independent repeats. With one round on a side there is nothing to test: the change is shown,
its significance is not claimed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tabulate import tabulate

from ..records import Status
from ..results import RunReport, differences
from ..stats import rounds_of, rounds_test, typical_step_s
from .formatting import md_cell


@dataclass
class CellComparison:
    backend: str
    device: str
    base_status: Optional[str]
    new_status: Optional[str]
    base_median: Optional[float] = None
    new_median: Optional[float] = None
    ratio: Optional[float] = None  # new / base: > 1 is slower
    p_value: Optional[float] = None

    @property
    def comparable(self) -> bool:
        return self.ratio is not None

    @property
    def change_pct(self) -> Optional[float]:
        return None if self.ratio is None else (self.ratio - 1.0) * 100.0

    def significant(self, alpha: float) -> bool:
        return self.p_value is not None and self.p_value < alpha


def compare_runs(base: RunReport, new: RunReport) -> list[CellComparison]:
    base_cells = {(r.backend, r.device): r for r in base.results}
    new_cells = {(r.backend, r.device): r for r in new.results}
    out = []
    for key in list(dict.fromkeys([*base_cells, *new_cells])):
        b, n = base_cells.get(key), new_cells.get(key)
        c = CellComparison(key[0], key[1], b.status.value if b else None, n.status.value if n else None)
        if b and n and b.status == n.status == Status.OK and b.step_s and n.step_s:
            c.base_median, c.new_median = typical_step_s(b), typical_step_s(n)
            c.ratio = c.new_median / c.base_median
            c.p_value = rounds_test(rounds_of(b), rounds_of(n))
        out.append(c)
    return out


def regressions(cells: list[CellComparison], fail_above_pct: float) -> list[CellComparison]:
    """Cells ok in both runs whose median got slower by more than ``fail_above_pct`` percent."""
    return [c for c in cells if c.change_pct is not None and c.change_pct > fail_above_pct]


def render_comparison(base: RunReport, new: RunReport, cells: list[CellComparison], alpha: float,
                      fail_above_pct: Optional[float]) -> str:
    out = ["# cnncompare: comparison", "",
           f"Base: {md_cell(base.started_at)} · new: {md_cell(new.started_at)}. Ratio = new median ÷ base median "
           f"(> 1 is slower). *Beyond noise* = Welch's t-test on the rounds' log medians (each round a fresh process), "
           f"two-sided, p < {alpha:g}; with one round on a side, untested."]
    changes = differences(base, new)
    if changes:
        out += ["", "**The environment or the workload changed**, so differences may come from them, not the code:", ""]
        out += [f"- {md_cell(c)}" for c in changes]
    for device in dict.fromkeys(c.device for c in cells):
        rows = []
        for c in (c for c in cells if c.device == device):
            if c.ratio is not None:
                verdict = (("slower" if c.ratio > 1 else "faster") if c.significant(alpha) else
                           "within noise" if c.p_value is not None else "untested (one round)")
                rows.append([md_cell(c.backend), f"{c.base_median:.4g}", f"{c.new_median:.4g}", f"{c.ratio:.3f}",
                             f"{c.change_pct:+.1f} %", "–" if c.p_value is None else f"{c.p_value:.3g}", verdict])
            else:
                rows.append([md_cell(c.backend), "–", "–", "–", "–", "–",
                             f"not comparable (base {c.base_status or 'absent'}, new {c.new_status or 'absent'})"])
        out += ["", f"## {md_cell(device)}", "", tabulate(
            rows, headers=["backend", "base median (s)", "new median (s)", "ratio", "change", "p", "verdict"],
            tablefmt="github", disable_numparse=True)]
    if fail_above_pct is not None:
        bad = regressions(cells, fail_above_pct)
        out += ["", f"**Gate (--fail-above {fail_above_pct:g} %)**: " + (
            "failed: " + ", ".join(f"{md_cell(c.backend)} on {md_cell(c.device)} ({c.change_pct:+.1f} %)" for c in bad)
            if bad else "passed.")]
    return "\n".join(out) + "\n"
