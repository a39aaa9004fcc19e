"""Compare two runs cell by cell: did it get slower, and is the change beyond the noise?

The test is Mann-Whitney U (two-sided) on the kept per-step samples: a rank
test, so it assumes no distribution and one outlier step can't decide it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from tabulate import tabulate

from cnncompare.core.config import workload_key
from cnncompare.core.environment import COMPARABLE_KEYS
from cnncompare.core.report import md_cell
from cnncompare.core.results import RunReport, Status

DEFAULT_ALPHA = 0.05


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
    from scipy.stats import mannwhitneyu

    base_cells = {(r.backend, r.device): r for r in base.results}
    new_cells = {(r.backend, r.device): r for r in new.results}
    out = []
    for key in list(dict.fromkeys([*base_cells, *new_cells])):
        b, n = base_cells.get(key), new_cells.get(key)
        c = CellComparison(key[0], key[1], b.status.value if b else None, n.status.value if n else None)
        if b and n and b.status == n.status == Status.OK and b.step_s and n.step_s:
            c.base_median, c.new_median = b.step_s.median, n.step_s.median
            c.ratio = c.new_median / c.base_median
            if len(b.step_s.samples) > 1 and len(n.step_s.samples) > 1:
                c.p_value = float(mannwhitneyu(b.step_s.samples, n.step_s.samples, alternative="two-sided").pvalue)
        out.append(c)
    return out


def environment_changes(base: RunReport, new: RunReport) -> list[str]:
    """What differs between the two runs' machines and workloads (batch, steps, ``--malloc``, ...)."""
    keys = list(dict.fromkeys([*COMPARABLE_KEYS, "platform", "nvidia_driver"]))
    changes = [f"{k}: {base.environment.get(k)!r} → {new.environment.get(k)!r}"
               for k in keys if base.environment.get(k) != new.environment.get(k)]
    old_key, new_key = (workload_key(r.config) for r in (base, new))
    return changes + [f"{k}: {old_key.get(k)!r} → {new_key.get(k)!r}"
                      for k in dict.fromkeys([*old_key, *new_key])
                      if k not in keys and old_key.get(k) != new_key.get(k)]


def regressions(cells: list[CellComparison], fail_above_pct: float) -> list[CellComparison]:
    """Cells ok in both runs whose median got slower by more than ``fail_above_pct`` percent."""
    return [c for c in cells if c.comparable and c.change_pct > fail_above_pct]


def render_comparison(base: RunReport, new: RunReport, cells: list[CellComparison], alpha: float,
                      fail_above_pct: Optional[float]) -> str:
    out = ["# cnncompare: comparison", "",
           f"Base: {md_cell(base.started_at)} · new: {md_cell(new.started_at)}. Ratio = new median ÷ base median "
           f"(> 1 is slower). *Beyond noise* = Mann-Whitney U test on the per-step samples, two-sided, p < {alpha:g}."]
    changes = environment_changes(base, new)
    if changes:
        out += ["", "**The environment or the workload changed**, so differences may come from them, not the code:", ""]
        out += [f"- {md_cell(c)}" for c in changes]
    for device in dict.fromkeys(c.device for c in cells):
        rows = []
        for c in (c for c in cells if c.device == device):
            if c.comparable:
                verdict = ("slower" if c.ratio > 1 else "faster") if c.significant(alpha) else "within noise"
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
