"""Text for one markdown cell or fence: escaping, numbers, ratios. Pure functions of a value.

Backend names, descriptions, warnings and errors come from third-party code, so every table
cell goes through ``md_cell`` (no ``|``, newline, backtick or HTML can break or inject into the
table) and tracebacks go in ``md_code``'s fences, longer than any backtick run they contain.
Nothing here decides what a figure means; ``stats`` does.
"""
from __future__ import annotations

import html
import re
from typing import Any, Optional

from ..config import RunConfig
from ..results import CellResult


def md_cell(value: Any) -> str:
    """One markdown table cell's text, safe whatever the input."""
    text = html.escape(str(value), quote=False)
    text = re.sub(r"\s*[\r\n]+\s*", " ", text)
    return text.replace("|", "\\|").replace("`", "\\`").replace("*", "\\*")


def md_code(text: str) -> str:
    """``text`` fenced as a code block, the fence longer than any backtick run inside it."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def num(value: Optional[float], digits: int = 3) -> str:
    """``digits`` significant digits; whole and comma-grouped from ``10 ** digits`` up; – for None."""
    if value is None:
        return "–"
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def margin(value: float) -> str:
    """worst ÷ limit: two decimals, or two significant digits below 0.01 (a forward's error is ~1e-6
    of its limit, and "0.00" would read as no error at all)."""
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.1e}"


def per_s(config: RunConfig) -> str:
    """The throughput unit's header text: ``images/s``, ``tokens/s``."""
    return f"{config.workload.unit}s/s"


def speedup(r: CellResult) -> str:
    """``1.49x`` with its interval where it has one: ``1.49x [1.40, 1.58]``, and ``*`` after it
    where the interval is wider than the run's ``--target`` (``CellResult.target_reached``)."""
    if r.speedup_vs_eager is None:
        return "–"
    ci = r.speedup_ci
    return (f"{r.speedup_vs_eager:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and ci[0] != ci[1] else "")
            + ("*" if r.target_reached is False else ""))


def loop_cell(r: CellResult) -> str:
    """The row's projected loop: ``412 s, 1.21x [1.18, 1.24]``, then ``, 2 recompiles`` where the
    loop's events recompiled, or why there is no projection."""
    f = r.loop
    if f is None:
        return "–"
    if f.total_s is None:
        return md_cell(f"none: {f.error}" if f.error else "–")
    text = f"{num(f.total_s)} s"
    if f.speedup_vs_eager is not None:
        ci = f.speedup_ci
        text += f", {f.speedup_vs_eager:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and ci[0] != ci[1] else "")
    if f.recompiles:
        text += f", **{f.recompiles} recompile{'s' if f.recompiles > 1 else ''}**"
    return text


def step_time(r: CellResult) -> str:
    """The row's step seconds: eager's paired step over its speedup, with the interval that follows
    (``0.412 [0.398, 0.427]``); its own processes' median where it has no speedup."""
    if r.step_time_s is None:
        return "–"
    ci = r.step_time_ci
    return num(r.step_time_s) + (f" [{num(ci[0])}, {num(ci[1])}]" if ci and ci[0] != ci[1] else "")


def break_even(r: CellResult) -> str:
    """Training steps until the up-front cost is repaid, with its interval: ``35 [22, 81]``;
    ``none to repay`` (no extra up-front cost), ``never`` (the speedup's interval reaches 1 or
    lies below it), ``≥ 22`` (its upper end never), – for eager and rows without a speedup."""
    if r.up_front_s is None:
        return "–"
    if r.break_even_steps == 0:
        return "none to repay"
    if r.break_even_steps is None:
        return "never"
    ci = r.break_even_ci
    if ci is None or ci[0] == ci[1]:
        return str(r.break_even_steps)
    return f"{r.break_even_steps} [{ci[0]}, {ci[1]}]" if ci[1] is not None else f"{r.break_even_steps} (≥ {ci[0]})"
