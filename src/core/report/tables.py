"""The report's tables, one device's rows each: speed and memory (``device_table``), why
(``diagnostics_table``), parity (``parity_table``) and DDP scaling (``scaling_table``).

Each takes rows with their figures already derived (``stats.derive``) and returns the table's
markdown, or None where no row has what the table shows. Rows are ordered the same in every
table: ``ok`` rows fastest first, then the rest in run order. Where older reports lack a
column's figures, the column is dropped or named for what they have; nothing is computed here.
"""
from __future__ import annotations

from typing import Any, Optional

from tabulate import tabulate

from ..config import LoopSpec, RunConfig
from ..records import CompilePhases, Status
from ..results import CellResult
from ..stats import measured_precision, one_off_peak
from .formatting import break_even, loop_cell, margin, md_cell, num, per_s, speedup, step_time


def _parity_cell(r: CellResult) -> str:
    p = r.parity
    if p is None:
        return "–"
    verdict = "pass" if p.passed else "FAIL"
    if p.margin is None:  # a report from before margins were recorded
        return f"{verdict} ({p.max_rel_error:.1e})"
    return f"{verdict} ({margin(p.margin)})"


def _coverage_cell(p: Any) -> str:
    """Per judged step, its tensors judged out of all (reports before coverage: the total and the
    count not resolvable)."""
    if not p.coverage:
        return f"{p.tensors} ({len(p.not_judged)} not resolvable)"
    return "; ".join(f"step {c.step}: {c.judged} of {c.tensors}" for c in p.coverage)


def _precision_cell(r: CellResult) -> str:
    """The precision the row measured as computing in, and what it declares where that differs."""
    measured = measured_precision(r)
    if measured is None or r.parity is None:
        return "–"
    declared = r.parity.declared_precision
    return measured + (f" (declares {declared})" if declared and declared != measured else "")


def ranked(results: list[CellResult]) -> list[CellResult]:
    """ok rows fastest first, by the speedup the verdict ranks by (round by round against eager;
    the pooled step median where there is no speedup), then the rest in run order."""
    ok = sorted((r for r in results if r.status == Status.OK and r.step_s),
                key=lambda r: (-r.speedup_vs_eager, 0.0) if r.speedup_vs_eager else (0.0, r.step_s.median if r.step_s else 0.0))
    return ok + [r for r in results if r not in ok]


def device_table(results: list[CellResult], config: RunConfig) -> str:
    """The main table, what a verdict is read from (about 160 characters wide at most): the
    speedup and the step time derived from it, what the backend costs up front beyond eager and
    when that is repaid, parity and precision; the rest is in ``cost_table``."""
    latency = any(r.latency_p50_s is not None for r in results)
    measured = any(measured_precision(r) for r in results)
    headers = ["backend", "status", "speedup vs eager", "step (s)"]
    headers += ["latency p50 / p90 / p99 (ms)"] if latency else []
    loop = _loop_declared(config) and any(r.loop is not None for r in results)
    headers += ["loop: time, vs eager"] if loop else []
    headers += ["up front (s)", "break-even",
                "parity" if any(r.parity and r.parity.margin is not None for r in results) else "parity (max rel. err)"]
    headers += ["computes in"] if measured else []
    rows = []
    for r in ranked(results):
        row = [md_cell(r.backend), md_cell(r.status.value), speedup(r), step_time(r)]
        if latency:
            row.append(" / ".join(num(v * 1000 if v is not None else None)
                                  for v in (r.latency_p50_s, r.latency_p90_s, r.latency_p99_s)))
        row += [loop_cell(r)] if loop else []
        row += [num(r.up_front_s), break_even(r), _parity_cell(r)]
        if measured:
            row.append(_precision_cell(r))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _loop_declared(config: RunConfig) -> bool:
    """Whether the run's loop is one the user or the workload declared (the main table shows it
    beside the step); the default loop's figures go to the cost table."""
    return config.workload.loop != LoopSpec()


def cost_table(results: list[CellResult], config: RunConfig) -> Optional[str]:
    """Throughput (from the paired step time), what each row's own processes measured (unpaired:
    median and spread), compile and first step, and memory, rows as in ``device_table``; None
    where no row was measured."""
    cuda = any(r.cuda_peak_allocated_mb is not None for r in results)
    phases = any(r.peak_rss_steady_mb is not None for r in results)  # older reports: lifetime peaks only
    warm = any(r.warm_first_step_s is not None for r in results)
    headers = ["backend", per_s(config), "own median (s)", "own IQR (s)", "compile (s)", "first step (s)"]
    headers += ["warm first step (s)"] if warm else []
    headers.append("peak RSS steady / one-off (MB)" if phases else "peak RSS (MB)")
    allocated = any(r.allocated_peak_steady_mb is not None for r in results)
    headers += ["allocated peak (MB)"] if allocated else []
    headers.append("memory ÷ eager")
    loop = not _loop_declared(config) and any(r.loop is not None for r in results)
    headers += ["loop: time, vs eager"] if loop else []
    if cuda:
        headers += ["CUDA peak alloc steady / one-off (MB)", "CUDA peak reserved (MB)"]
    rows = []
    for r in ranked(results):
        s = r.step_s
        if s is None and r.compile_s is None:
            continue
        row = [md_cell(r.backend), num(r.images_per_s), num(s.median if s else None), num(s.iqr if s else None, 2),
               num(r.compile_s) + (f" (warm {num(r.warm_compile_s)})" if r.warm_compile_s is not None else ""),
               num(r.first_step_s)]
        row += [num(r.warm_first_step_s)] if warm else []
        row += [_steady_and_one_off(r.peak_rss_steady_mb, one_off_peak(r.peak_rss_first_step_mb, r.peak_rss_warmup_mb),
                                    r.peak_rss_mb)]
        row += [num(r.allocated_peak_steady_mb, 4)] if allocated else []
        row += ["–" if r.memory_vs_eager is None else f"{r.memory_vs_eager:.2f}x"]
        row += [loop_cell(r)] if loop else []
        if cuda:
            row += [_steady_and_one_off(r.cuda_peak_allocated_steady_mb,
                                        one_off_peak(r.cuda_peak_allocated_first_step_mb,
                                                     r.cuda_peak_allocated_warmup_mb), r.cuda_peak_allocated_mb),
                    num(r.cuda_peak_reserved_mb, 4)]
        rows.append(row)
    if not rows:
        return None
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _steady_and_one_off(steady: Optional[float], one_off: Optional[float], lifetime: Optional[float]) -> str:
    """"steady / one-off" peaks; the lifetime peak alone where the phases are unknown."""
    if steady is None or one_off is None:
        return num(lifetime, 4)
    return f"{num(steady, 4)} / {num(one_off, 4)}"


def _workers(r: CellResult) -> str:
    """Inductor's compile workers and their summed peak RSS (processes outside the cell's own)."""
    if r.compile_threads is None:
        return "–"
    return f"{r.compile_threads}" + (f" ({num(r.workers_peak_rss_mb, 4)} MB)" if r.workers_peak_rss_mb else "")


def _faults(value: Optional[float]) -> str:
    return "–" if value is None else f"{value / 1000:.0f}k" if value >= 10_000 else f"{value:.0f}"


def _phases(p: CompilePhases) -> str:
    text = f"{p.dynamo_s:.2f} / {p.aot_autograd_s:.2f} / {p.inductor_s:.2f} / {p.codegen_s:.2f}"
    return text + (f" (autotune {p.autotune_s:.2f})" if p.autotune_s is not None else "")


def diagnostics_table(results: list[CellResult]) -> Optional[str]:
    """Why each row is as fast as it is: distance to the hardware, memory, what dynamo did."""
    rows = []
    for r in ranked(results):
        if r.step_s is None:
            continue
        d = r.dynamo
        dyn = "–"
        if d is not None:
            recompiles = "?" if d.recompiles is None else d.recompiles
            dyn = f"{d.graphs} / {d.graph_breaks} / {recompiles}" + (" fell back to eager" if d.fell_back_to_eager else "")
            if r.device.startswith("cuda") and d.cudagraph_skips is not None:
                recorded = "?" if d.cudagraphs_recorded is None else d.cudagraphs_recorded
                dyn += f"; CUDA graphs {recorded} recorded, {d.cudagraph_skips} skipped"
        phases = "–" if d is None or d.compile_phases is None else _phases(d.compile_phases)
        cache = r.compile_cache or "–"
        if r.cold_compile_s is not None:
            cache += f" (cold: compile {num(r.cold_compile_s)} s, first step {num(r.cold_first_step_s)} s"
            if r.portable_compile_s is not None:
                cache += (f"; from a portable cache of {num(r.portable_cache_mb)} MB: compile {num(r.portable_compile_s)}"
                          f" s, first step {num(r.portable_first_step_s)} s")
            elif r.portable_status is not None:
                cache += f"; from a portable cache: {r.portable_status}"
            cache += ")"
        rows.append([
            md_cell(r.backend),
            num(r.achieved_gflops),
            "–" if r.pct_of_peak is None else f"{r.pct_of_peak:.1f} %" + (f" ({r.peak_precision})" if r.peak_precision
                                                                         else ""),
            _faults(r.page_faults_per_step),
            num(r.cpu_sys_s_per_step),
            md_cell(dyn),
            phases,
            md_cell(cache),
            _workers(r),
        ])
    if not rows:
        return None
    headers = ["backend", "achieved GFLOP/s", "% of peak", "page faults / step", "kernel CPU s / step",
               "dynamo graphs / breaks / recompiles", "compile phases (s): dynamo / AOT / inductor / codegen",
               "compile cache", "compile workers (peak RSS)"]
    # Runs from before getrusage was recorded have no fault figures: drop those columns, not fill them with dashes.
    if all(row[3] == "–" and row[4] == "–" for row in rows):
        headers, rows = headers[:3] + headers[5:], [row[:3] + row[5:] for row in rows]
    # Runs from before the workers were recorded: no such column.
    if all(row[-1] == "–" for row in rows):
        headers, rows = headers[:-1], [row[:-1] for row in rows]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def parity_table(results: list[CellResult]) -> Optional[str]:
    """Per row: the verdict, the tensor nearest its limit and each group's error, beside fp32 eager's."""
    rows = []
    for r in ranked(results):
        p = r.parity
        if p is None or p.margin is None:
            continue
        groups = " / ".join(num(e, 2) for e in _parity_groups(p).values())
        rows.append([md_cell(r.backend), "pass" if p.passed else "FAIL", margin(p.margin),
                     md_cell(p.worst_tensor or "–"), num(p.worst_error, 2), num(p.worst_limit, 2),
                     str(p.step), _coverage_cell(p),
                     str(p.trajectory_steps or "–"), groups])
    if not rows:
        return None
    first = next(r.parity for r in results if r.parity is not None and r.parity.margin is not None)
    return tabulate(rows, headers=["backend", "parity", "worst ÷ limit", "worst tensor", "its error", "its limit",
                                   "parity step", "tensors judged", "steps' losses checked",
                                   " / ".join(_parity_groups(first)) + " rel. error"],
                    tablefmt="github", disable_numparse=True)


def _parity_groups(p: Any) -> dict[str, Optional[float]]:
    """The error groups a parity record judges: a training step's, or inference's outputs."""
    if p.output_rel_error is not None:
        return {"output": p.output_rel_error, "buffer": p.buffer_rel_error}
    return {"loss": p.loss_rel_error, "grad": p.grad_rel_error, "weight": p.weight_rel_error,
            "buffer": p.buffer_rel_error}


def scaling_table(results: list[CellResult], config: RunConfig) -> Optional[str]:
    """Under --nproc: what N ranks give over one process of the same backend."""
    rows = []
    for r in ranked(results):
        d = r.distributed
        if d is None:
            continue
        eff = d.scaling_efficiency
        rows.append([
            md_cell(r.backend), md_cell(r.status.value), str(d.nproc), md_cell(d.process_group),
            num(d.global_images_per_s), num(d.slowest_rank_step_median_s),
            f"rank {d.slowest_rank}", num(d.single_process_images_per_s),
            "–" if eff is None else f"{eff:.2f}",
            "yes" if d.ranks_identical else f"NO ({d.max_rank_weight_diff:.2g})",
        ])
    if not rows:
        return None
    return tabulate(rows, headers=["backend", "status", "ranks", "process group", f"global {per_s(config)}",
                                   "slowest rank median (s)", "slowest", f"single-process {per_s(config)}",
                                   "scaling efficiency", "ranks identical"],
                    tablefmt="github", disable_numparse=True)
