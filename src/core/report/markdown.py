"""The markdown report of a ``RunReport``, and the combined report of several runs.

This module assembles: the sections in order, each device's tables (``tables``) with the
sentences that introduce them (``summary``), the legend (``legend``), the environment,
configuration and notes. Everything is formatted (``formatting``), never computed: figures,
verdicts and the thresholds behind every hint come from ``stats``.
"""
from __future__ import annotations

from typing import Any, Optional

from tabulate import tabulate

from ..config import RunConfig
from ..results import CellResult, RunReport
from ..stats import kernel_share_hint
from .charts import PLOT_HINT
from .formatting import md_cell, md_code, num
from .legend import how_to_read
from .summary import (
    coverage_line,
    loop_line,
    parity_cost_line,
    randomness_line,
    rounds_line,
    run_line,
    scaling_line,
    setup_rows,
    stop_line,
    summary_line,
    use_it_line,
)
from .tables import cost_table, device_table, diagnostics_table, parity_table, scaling_table

#: What a ``*`` means, where it first appears: under the summary and under each table that shows one.
STAR_NOTE = ("`*`: the speedup's 95 % interval is wider than `--target`; each device's rounds line says what a "
             "run would need to narrow it.")


def _env_value(key: str, value: Any) -> Any:
    if key == "gpus":
        return "; ".join(f"{g['device']}: {g['name']} ({g['memory_gb']} GB, sm {g['capability']})" for g in value or []) or "none"
    return "–" if value is None else value


def _environment_table(env: dict) -> str:
    rows = [[md_cell(key), md_cell(_env_value(key, value))] for key, value in env.items()]
    return tabulate(rows, headers=["", ""], tablefmt="github", disable_numparse=True)


def _config_value(key: str, value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(value)
    if key == "backend_options":  # per backend, its options
        return "; ".join(f"{name}: " + ", ".join(f"{k}={v!r}" for k, v in options.items())
                         for name, options in value.items()) or "–"
    if isinstance(value, dict):  # the workload: its name, options and unit
        options = ", ".join(f"{k}={v}" for k, v in value["options"].items())
        return f"{value['name']} ({options}; one sample: one {value['sample_unit']})" if options else value["name"]
    return "–" if value is None else str(value)


def _config_table(config: RunConfig) -> str:
    rows = [[md_cell(k), md_cell(_config_value(k, v))] for k, v in config.to_dict().items()]
    return tabulate(rows, headers=["option", "value"], tablefmt="github", disable_numparse=True)


def render_markdown(report: RunReport, charts: Optional[list[tuple[str, str]]] = None, final: bool = False) -> str:
    """The report. ``charts`` are (title, file) pairs to link; at the ``final`` write, no charts
    means matplotlib is missing, and the report says how to get them."""
    env, config = report.environment, report.config
    out = ["# cnncompare report", ""]
    if report.interrupted:
        out += ["**interrupted**: this run was stopped before every cell finished.", ""]
    out += ["## Summary", ""]
    devices = report.devices()
    for device in devices:
        v = report.verdicts[device]
        out.append(summary_line(v, config.mode))
        out += [line for line in [use_it_line(v), stop_line(v, report.round_log.get(device, []), config, report.rows(device)),
                                  loop_line(v, report.rows(device), config)] if line]
    if not devices:
        out.append("No cell finished.")
    if any(_starred(report.rows(device)) for device in devices):
        out += ["", STAR_NOTE]
    out += ["", "Setup:", ""] + [f"- **{key}**: {value}" for key, value in setup_rows(report)]
    for device in devices:
        rows = report.rows(device)
        out += ["", f"## {md_cell(device)}", "", device_table(rows, config)]
        if _starred(rows):
            out += ["", STAR_NOTE]
        rounds = rounds_line(device, report.round_log.get(device, []), report.rows(device), report.config,
                             report.order_seed)
        if rounds:
            out += ["", rounds]
        costs = cost_table(rows, config)
        if costs:
            out += ["", f"Throughput, compile time and memory ({md_cell(device)}):", "", costs]
        diagnostics = diagnostics_table(rows)
        if diagnostics:
            peaks = {r.peak_precision or "fp32": r.peak_gflops for r in rows if r.peak_gflops}
            gflop = next((r.gflop_per_step for r in rows if r.gflop_per_step), None)
            probes = ", ".join(f"{precision} {num(value)}" for precision, value in peaks.items())
            counted = "forward" if config.mode == "inference" else "forward + backward"
            out += ["", f"Why ({md_cell(device)}): the step is {num(gflop)} GFLOP ({counted}); "
                        f"matmul probes reached (GFLOP/s) {probes or '–'} here; each row's % of peak is against "
                        f"its own precision's.{_kernel_time_hint(rows, config)}",
                    "", diagnostics]
        parity = parity_table(rows)
        if parity:
            out += ["", f"Parity ({md_cell(device)}): each tensor's error against float64 eager after the same steps, "
                        "÷ its limit (see How to read this)." + coverage_line(rows)
                        + parity_cost_line(rows, report.references.get(device))
                        + randomness_line(rows),
                    "", parity]
        scaling = scaling_table(rows, config)
        if scaling:
            out += ["", scaling_line(device, rows, config) or "", "", scaling]
    if charts:
        out += ["", "## Charts", ""] + [f"![{md_cell(title)}]({name})" for title, name in charts]
    elif final and charts is None:
        out += ["", PLOT_HINT]
    out += ["", "## How to read this", "", how_to_read(config.mode, config.workload.unit).rstrip()]
    out += ["", "## Environment", "", _environment_table(env)]
    out += ["", "## Configuration", "", _config_table(config)]
    notes = _notes(report)
    if notes:
        out += ["", "## Notes", ""] + notes
    return "\n".join(out).rstrip() + "\n"


def _starred(rows: list[CellResult]) -> bool:
    """Whether a speedup among ``rows`` is printed with ``*`` (``formatting.speedup``)."""
    return any(r.target_reached is False and r.speedup_vs_eager is not None for r in rows)


def _kernel_time_hint(rows: list[CellResult], config: RunConfig) -> str:
    """The sentence pointing at ``--malloc reuse`` where ``stats.kernel_share_hint`` finds page faults,
    not compute, a large share of eager's CPU step; empty otherwise."""
    share = kernel_share_hint(rows, config.malloc)
    if share is None:
        return ""
    return (f" {share:.0%} of eager's CPU time is in the kernel, mostly page faults: freed tensors go back to "
            "the OS and come back as fresh zeroed pages every step. `--malloc reuse` keeps them in the process "
            "(the same for every backend); run with it to see the step without that cost.")


def _notes(report: RunReport) -> list[str]:
    out: list[str] = [f"- {md_cell(n)}" for n in report.notes]
    for p in report.plugins:
        if p.get("error"):
            out.append(f"- plugin **{md_cell(p['name'])}** was not loaded: {md_cell(p['error'])}")
    for r in report.results:
        if not (r.error or r.notes):
            continue
        out += ["", f"### {md_cell(r.backend)} on {md_cell(r.device)}: {md_cell(r.status.value)}", ""]
        if r.description:
            out.append(f"{md_cell(r.description)}.")
            out.append("")
        if r.error:
            out.append(f"- error: {md_cell(r.error)}")
        for note in r.notes:
            out.append(f"- {md_cell(note)}")
        if r.error_tail:
            out += ["", md_code(r.error_tail)]
    return out


def render_combined(reports: list[RunReport]) -> str:
    """One report from several runs (e.g. a CPU laptop and a GPU server), each with its environment."""
    out = ["# cnncompare: combined report", "", f"{len(reports)} runs, each measured on its own machine:", ""]
    for i, rep in enumerate(reports, 1):
        out.append(f"{i}. " + ("(interrupted) " if rep.interrupted else "") + run_line(rep))
    out += ["", "## Summary", ""]
    for i, rep in enumerate(reports, 1):
        for device in rep.devices():
            line = summary_line(rep.verdicts[device], rep.config.mode)
            out.append(line.replace(f"**{md_cell(device)}**", f"**run {i}, {md_cell(device)}**", 1))
    for i, rep in enumerate(reports, 1):
        for device in rep.devices():
            out += ["", f"## Run {i}: {md_cell(device)} ({md_cell(rep.environment.get('cpu'))})", "",
                    device_table(rep.rows(device), rep.config)]
    keys = list(dict.fromkeys(k for rep in reports for k in rep.environment))
    rows = [[md_cell(k)] + [md_cell(_env_value(k, rep.environment.get(k))) for rep in reports] for k in keys]
    out += ["", "## Environments", "", tabulate(rows, headers=[""] + [f"run {i}" for i in range(1, len(reports) + 1)],
                                                   tablefmt="github", disable_numparse=True)]
    modes = {rep.config.mode for rep in reports}
    out += ["", "## How to read this", "", how_to_read(modes.pop() if len(modes) == 1 else "train").rstrip()]
    return "\n".join(out).rstrip() + "\n"
