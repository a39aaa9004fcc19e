"""The markdown report of a ``RunReport``: it formats, it never computes (``stats`` does).

Backend names, descriptions, warnings and errors come from third-party code,
so every table cell is escaped (no ``|``, newline, backtick or HTML can
break or inject into the table) and tracebacks go in fences longer than any
backtick run they contain.
"""
from __future__ import annotations

import html
import re
from typing import Any, Optional

from tabulate import tabulate

from ..config import RunConfig
from ..records import Status
from ..results import CellResult, RoundInfo, RunReport
from ..stats import (
    CONFIDENCE,
    KERNEL_SHARE_HINT,
    NOISE_THRESHOLD,
    T_INTERVAL_MIN_ROUNDS,
    Verdict,
    kernel_share,
    measured_precision,
    one_off_peak,
    parity_cost,
    sentinel_spread,
)
from .charts import PLOT_HINT
from .wording import STEP_UNIT, plural


def md_cell(value: Any) -> str:
    """One markdown table cell's text, safe whatever the input."""
    text = html.escape(str(value), quote=False)
    text = re.sub(r"\s*[\r\n]+\s*", " ", text)
    return text.replace("|", "\\|").replace("`", "\\`").replace("*", "\\*")


def md_code(text: str) -> str:
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}text\n{text}\n{fence}"


def _num(value: Optional[float], digits: int = 3) -> str:
    if value is None:
        return "–"
    if value == 0:
        return "0"
    if abs(value) >= 10 ** digits:
        return f"{value:,.0f}"
    return f"{value:.{digits}g}"


def _parity_cell(r: CellResult) -> str:
    p = r.parity
    if p is None:
        return "–"
    verdict = "pass" if p.passed else "FAIL"
    if p.margin is None:  # a report from before margins were recorded
        return f"{verdict} ({p.max_rel_error:.1e})"
    return f"{verdict} ({_margin(p.margin)})"


def _precision_cell(r: CellResult) -> str:
    """The precision the row measured as computing in, and what it declares where that differs."""
    measured = measured_precision(r)
    if measured is None or r.parity is None:
        return "–"
    declared = r.parity.declared_precision
    return measured + (f" (declares {declared})" if declared and declared != measured else "")


def _margin(value: float) -> str:
    """worst ÷ limit: two decimals, or two significant digits below 0.01 (a forward's error is ~1e-6
    of its limit, and "0.00" would read as no error at all)."""
    return f"{value:.2f}" if value >= 0.01 or value == 0 else f"{value:.1e}"


def _sorted(results: list[CellResult]) -> list[CellResult]:
    """ok rows fastest first, then the rest in run order."""
    ok = sorted((r for r in results if r.status == Status.OK and r.step_s),
                key=lambda r: r.step_s.median if r.step_s else 0.0)
    return ok + [r for r in results if r not in ok]


def _per_s(config: RunConfig) -> str:
    return f"{config.workload.unit}s/s"


def _device_table(results: list[CellResult], config: RunConfig) -> str:
    cuda = any(r.cuda_peak_allocated_mb is not None for r in results)
    phases = any(r.peak_rss_steady_mb is not None for r in results)  # older reports: lifetime peaks only
    headers = ["backend", "status", "step median (s)", "IQR (s)", _per_s(config), "speedup vs eager",
               "compile (s)", "first step (s)", "break-even (steps)",
               "peak RSS steady / one-off (MB)" if phases else "peak RSS (MB)"]
    latency = any(r.latency_p50_s is not None for r in results)
    if latency:
        headers.insert(4, "latency p50 / p90 / p99 (ms)")
    if cuda:
        headers += ["CUDA peak alloc steady / one-off (MB)", "CUDA peak reserved (MB)"]
    headers.append("parity (worst ÷ limit)" if any(r.parity and r.parity.margin is not None for r in results)
                   else "parity (max rel. err)")
    measured = any(measured_precision(r) for r in results)
    if measured:
        headers.append("computes in")
    rows = []
    for r in _sorted(results):
        s = r.step_s
        row = [
            md_cell(r.backend),
            md_cell(r.status.value),
            _num(s.median if s else None),
            _num(s.iqr if s else None, 2),
            _num(r.images_per_s),
            _speedup(r),
            _num(r.compile_s) + (f" (warm {_num(r.warm_compile_s)})" if r.warm_compile_s is not None else ""),
            _num(r.first_step_s) + (f" (warm {_num(r.warm_first_step_s)})" if r.warm_first_step_s is not None else ""),
            str(r.break_even_steps) if r.break_even_steps is not None else "–",
            _steady_and_one_off(r.peak_rss_steady_mb, one_off_peak(r.peak_rss_first_step_mb, r.peak_rss_warmup_mb),
                                r.peak_rss_mb),
        ]
        if latency:
            row.insert(4, " / ".join(_num(v * 1000 if v is not None else None)
                                     for v in (r.latency_p50_s, r.latency_p90_s, r.latency_p99_s)))
        if cuda:
            row += [_steady_and_one_off(r.cuda_peak_allocated_steady_mb,
                                        one_off_peak(r.cuda_peak_allocated_first_step_mb,
                                                     r.cuda_peak_allocated_warmup_mb), r.cuda_peak_allocated_mb),
                    _num(r.cuda_peak_reserved_mb, 4)]
        row.append(_parity_cell(r))
        if measured:
            row.append(_precision_cell(r))
        rows.append(row)
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _steady_and_one_off(steady: Optional[float], one_off: Optional[float], lifetime: Optional[float]) -> str:
    """"steady / one-off" peaks; the lifetime peak alone where the phases are unknown."""
    if steady is None or one_off is None:
        return _num(lifetime, 4)
    return f"{_num(steady, 4)} / {_num(one_off, 4)}"


def _workers(r: CellResult) -> str:
    """Inductor's compile workers and their summed peak RSS (processes outside the cell's own)."""
    if r.compile_threads is None:
        return "–"
    return f"{r.compile_threads}" + (f" ({_num(r.workers_peak_rss_mb, 4)} MB)" if r.workers_peak_rss_mb else "")


def _faults(value: Optional[float]) -> str:
    return "–" if value is None else f"{value / 1000:.0f}k" if value >= 10_000 else f"{value:.0f}"


def _diagnostics_table(results: list[CellResult]) -> Optional[str]:
    """Why each row is as fast as it is: distance to the hardware, memory, what dynamo did."""
    rows = []
    for r in _sorted(results):
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
        cache = r.compile_cache or "–"
        if r.cold_compile_s is not None:
            cache += f" (cold: compile {_num(r.cold_compile_s)} s, first step {_num(r.cold_first_step_s)} s)"
        rows.append([
            md_cell(r.backend),
            _num(r.achieved_gflops),
            "–" if r.pct_of_peak is None else f"{r.pct_of_peak:.1f} %" + (f" ({r.peak_precision})" if r.peak_precision
                                                                         else ""),
            "–" if r.memory_ratio_vs_eager is None else f"{r.memory_ratio_vs_eager:.2f}x",
            _faults(r.page_faults_per_step),
            _num(r.cpu_sys_s_per_step),
            md_cell(dyn),
            md_cell(cache),
            _workers(r),
        ])
    if not rows:
        return None
    headers = ["backend", "achieved GFLOP/s", "% of peak", "memory vs eager",
               "page faults / step", "kernel CPU s / step", "dynamo graphs / breaks / recompiles", "compile cache",
               "compile workers (peak RSS)"]
    # Runs from before getrusage was recorded have no fault figures: drop those columns, not fill them with dashes.
    if all(row[4] == "–" and row[5] == "–" for row in rows):
        headers, rows = headers[:4] + headers[6:], [row[:4] + row[6:] for row in rows]
    # Runs from before the workers were recorded: no such column.
    if all(row[-1] == "–" for row in rows):
        headers, rows = headers[:-1], [row[:-1] for row in rows]
    return tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)


def _rounds_line(device: str, log: list[RoundInfo]) -> Optional[str]:
    """How many rounds, and how far the drift sentinel moved over them."""
    if len(log) < 2:
        return None
    text = (f"Rounds ({md_cell(device)}): {len(log)}, each backend once per round in a fresh shuffled order; "
            f"speedup = median over rounds of each round's ratio to eager, with its {CONFIDENCE:.0%} interval "
            f"({_interval_method(len(log))}); compile and first step (warm) = the median of later rounds', "
            "which reuse the cell's compile cache; break-even counts round 1's cold costs.")
    spread = sentinel_spread([info.sentinel_s for info in log])
    if spread:
        low, high = spread
        text += (f" Drift sentinel: {low * 1000:.1f} to {high * 1000:.1f} ms "
                 f"(the machine's speed moved by {high / low - 1:.0%} over the run).")
    return text


def _interval_method(rounds: int) -> str:
    return ("Student's t over the rounds' log ratios" if rounds >= T_INTERVAL_MIN_ROUNDS
            else "a bootstrap over rounds and steps, narrower than the truth with so few rounds")


def _parity_table(results: list[CellResult]) -> Optional[str]:
    """Per row: the verdict, the tensor nearest its limit and each group's error, beside fp32 eager's."""
    rows = []
    for r in _sorted(results):
        p = r.parity
        if p is None or p.margin is None:
            continue
        groups = " / ".join(_num(e, 2) for e in _parity_groups(p).values())
        rows.append([md_cell(r.backend), "pass" if p.passed else "FAIL", _margin(p.margin),
                     md_cell(p.worst_tensor or "–"), _num(p.worst_error, 2), _num(p.worst_limit, 2),
                     str(p.step), f"{p.tensors} ({len(p.not_judged)} not resolvable)",
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


def _randomness_line(rows: list[CellResult]) -> str:
    """What a workload that draws random numbers (dropout) was judged and timed with."""
    if not any(r.parity is not None and r.parity.random for r in rows):
        return ""
    return (" The workload's step draws random numbers (dropout): every cell and the reference seed torch's "
            "generator before each step, and inductor draws eager's random numbers "
            "(`torch._inductor.config.fallback_random`), so a correct backend computes the same masks; compiled "
            "rows were timed that way too, not with inductor's own generator.")


def _parity_cost_line(rows: list[CellResult]) -> str:
    cost = parity_cost(rows)
    if cost is None:
        return ""
    share = f": {cost.share:.0%} of the cells' {_num(cost.cells_wall_s)} s" if cost.share is not None else ""
    return (f" The check cost {_num(cost.reference_s)} s for the float64 reference (computed once) and "
            f"{_num(cost.checks_s)} s of checks in all{share}.")


def _scaling_table(results: list[CellResult], config: RunConfig) -> Optional[str]:
    """Under --nproc: what N ranks give over one process of the same backend."""
    rows = []
    for r in _sorted(results):
        d = r.distributed
        if d is None:
            continue
        eff = d.scaling_efficiency
        rows.append([
            md_cell(r.backend), md_cell(r.status.value), str(d.nproc), md_cell(d.process_group),
            _num(d.global_images_per_s), _num(d.slowest_rank_step_median_s),
            f"rank {d.slowest_rank}", _num(d.single_process_images_per_s),
            "–" if eff is None else f"{eff:.2f}",
            "yes" if d.ranks_identical else f"NO ({d.max_rank_weight_diff:.2g})",
        ])
    if not rows:
        return None
    return tabulate(rows, headers=["backend", "status", "ranks", "process group", f"global {_per_s(config)}",
                                   "slowest rank median (s)", "slowest", f"single-process {_per_s(config)}",
                                   "scaling efficiency", "ranks identical"],
                    tablefmt="github", disable_numparse=True)


def _scaling_line(device: str, results: list[CellResult], config: RunConfig) -> Optional[str]:
    d = next((r.distributed for r in results if r.distributed), None)
    if d is None:
        return None
    threads = d.threads_per_rank
    unit = config.workload.sample_unit
    return (f"Scaling ({md_cell(device)}): DistributedDataParallel over {d.nproc} ranks "
            f"({d.nnodes} node(s) × {d.nproc_per_node}), weak scaling: {d.batch_size_per_rank} {unit}s "
            f"per rank, {d.global_batch_size} per global step"
            + (f", {threads} CPU thread(s) per rank" if threads and device == "cpu" else "")
            + f". Scaling efficiency = global {_per_s(config)} ÷ (ranks × the same backend's single-process "
            f"{_per_s(config)}, "
            "measured in this run with one rank's batch and threads); 1.00 means DDP costs nothing. "
            "The tables above show the slowest rank's steps: a synchronous step waits for it.")


def _speedup(r: CellResult) -> str:
    """``1.49x`` with its interval where it has one: ``1.49x [1.40, 1.58]``."""
    if r.speedup_vs_eager is None:
        return "–"
    ci = r.speedup_ci
    return f"{r.speedup_vs_eager:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and ci[0] != ci[1] else "")


def _summary_line(v: Verdict, mode: str = "train") -> str:
    """Which backend to pick on this device, what it costs up front, and whether the win is real;
    break-even counted in ``mode``'s steps (training steps, or forwards); then, apart, the fastest
    row that computes in another precision than eager."""
    line = _ranked_line(v, mode)
    other = v.other_precision
    if other is None:
        return line
    declared = other.parity.declared_precision if other.parity else None
    measured = measured_precision(other)
    how = f"computes in {measured}" + (f", though it declares {declared}" if declared and declared != measured else "")
    return (line[:-1] if line.endswith(".") else line) + (
        f". At another precision than eager's ({v.precision}): **{md_cell(other.backend)}** at {_speedup(other)} "
        f"eager ({how}; parity passed).")


def _ranked_line(v: Verdict, mode: str) -> str:
    """The verdict among the rows at eager's precision."""
    best, device = v.best, md_cell(v.device)
    if best is None or best.step_s is None:
        return f"- **{device}**: no backend finished `ok`."
    if v.eager is None:
        return (f"- **{device}**: fastest **{md_cell(best.backend)}**, {best.step_s.median:.4g} s/step "
                "(no eager row, so no speedup and no verdict).")
    names = ", ".join(f"**{md_cell(n)}**" for n in v.tied_with if n != "eager")
    if best is v.eager:
        return (f"- **{device}**: pick **eager**, {best.step_s.median:.4g} s/step: no backend beat it here"
                + (f" ({names} within its noise)." if names else "."))
    if "eager" in v.tied_with:
        return (f"- **{device}**: no backend is clearly faster than eager: the fastest, **{md_cell(best.backend)}** "
                f"at {_speedup(best)} eager, has a {CONFIDENCE:.0%} interval that reaches 1.0"
                + (f" ({names} within it too)" if names else "") + ". Rerun with more `--rounds` to separate them.")
    if v.tied_with:
        return (f"- **{device}**: a tie: **{md_cell(best.backend)}** at {_speedup(best)} eager, and {names}, whose "
                f"{CONFIDENCE:.0%} intervals reach its lower end. Rerun with more `--rounds` to separate them.")
    text = f"- **{device}**: pick **{md_cell(best.backend)}**, {best.step_s.median:.4g} s/step, {_speedup(best)} eager"
    if best.break_even_steps == 0:
        text += ", with no extra up-front cost"
    elif (steps := best.break_even_steps) is not None:
        text += f"; its extra compile cost is repaid after {steps} {plural(STEP_UNIT[mode], steps)}"
    if v.overlaps_eager:
        text += " (its quartiles overlap eager's: within one round's noise)"
    elif v.noisy:
        text += f" (spread above {NOISE_THRESHOLD * 100:.0f} % of the median: a noisy machine)"
    return text + "."


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


#: What one step is, per mode, in the report's legend.
STEP_IS = {
    "train": "one training step (forward, the workload's loss, zero_grad, backward, Adam)",
    "inference": "one forward of the batch through the eval-mode model (under `torch.inference_mode()`)",
}


#: What parity judges, per mode (the rule that follows is the same).
PARITY_JUDGES = {
    "train": """the backend's training against float64 eager after the same steps on the
  same batches: every gradient and buffer (BatchNorm's running statistics and counts) after step 1;
  every gradient, weight (its last update) and buffer after the parity step (step 3 for the
  built-ins: after the backend's warm-up, with Adam's state, CUDA graphs replaying, TorchScript
  optimised); the loss of every step up to it; then every later step's loss against fp32 eager's.""",
    "inference": """the backend's forward against float64 eager's forward of the eval-mode
  model on the same batches: the outputs (against their spread) and every buffer (BatchNorm's
  running statistics, which must not move) after step 1 and after the parity step (step 3 for the
  built-ins), then every later forward's largest output against fp32 eager's.""",
}


def how_to_read(mode: str) -> str:
    """The report's legend, worded for ``mode``'s step (a training step or a forward)."""
    lazy = "forward and backward" if mode == "train" else "the forward"
    return HOW_TO_READ.format(step=STEP_IS[mode], lazy=lazy, judged=PARITY_JUDGES[mode])


HOW_TO_READ = """\
- **step median / IQR**: seconds per step, {step},
  over the measured steps after warm-up; IQR = third minus first quartile. CPU steps are timed with
  `perf_counter`, CUDA steps with events, so no queued GPU work escapes the timed region.
- **speedup vs eager**: eager's median ÷ this backend's median on the same device; >1 is faster.
  Only `ok` rows get one. With `--rounds`, each round's ratio of medians, then the median over
  rounds, with its 95 % interval in brackets (Student's t over the rounds' log ratios from 3
  rounds; below that a bootstrap over rounds and steps). The summary
  names a pick only when its interval clears every other row's (eager's is 1.0); else a tie.
- **compile**: wall time of the backend's `compile` call. **first step**: the first step,
  which includes lazy compilation (`torch.compile` compiles here, {lazy}). Caches are
  cold: each cell runs in a fresh process with a fresh inductor cache directory; "(warm …)" is
  the median of later rounds', which reuse the cell's cache.
- **break-even**: steps until the backend's extra one-off cost is repaid by its saving
  per step; – when it is not faster. The one-off cost is compile, plus what the first step and the
  warm-up steps took beyond as many steady steps (lazy compiles, recompiles, CUDA-graph recording,
  TorchScript's profiling runs), minus eager's.
- **peak RSS steady / one-off**: the cell's process; steady = the measured steps' peak, one-off =
  compile, first step and warm-up (autotuning, CUDA-graph recording, the parity snapshot). The same
  split for CUDA's allocated memory; reserved is the lifetime peak. Inductor's compile workers are
  processes of their own, not in these figures: their summed peak RSS (sampled every 0.1 s through
  compile and warm-up) is under **compile workers**, with their count (torch's default unless
  `--compile-threads`).
- **achieved GFLOP/s, % of peak**: the step's FLOPs (torch.utils.flop_counter, forward +
  backward; the forward alone in inference) ÷ the median step time, against the best rate of a matmul probe on the same device in
  the precision the step's FLOPs run in (in brackets): fp32; for fp32 rows on CUDA, TF32 or fp32
  for convolutions and matmuls as torch's flags say, weighted by their FLOPs; bf16/fp16 for
  mixed-precision rows. How far from the hardware the step runs.
- **memory vs eager**: eager's steady peak ÷ this backend's (CUDA allocated where there is one,
  else RSS); >1 uses less. One-off peaks are not compared. A CUDA-graph row is compared by
  reserved memory; a backend with an allocator of its own gets none on CUDA.
- **page faults / step, kernel CPU s / step**: over the measured steps, from `getrusage` (all
  threads of the cell's process). A page fault maps a fresh page the kernel must zero: tensors
  larger than glibc's mmap threshold are mapped anew each step, so a step that frees and
  re-allocates hundreds of MB (eager's for-loop Adam, a `.grad` freed by `zero_grad`) pays here.
  `--malloc reuse` keeps freed memory in the process; the header says when a run used it.
- **dynamo graphs / breaks / recompiles**: what `torch.compile` captured during the measured
  steps; a break or a recompile costs speed. "fell back to eager" means dynamo gave up. On CUDA:
  the CUDA graphs inductor recorded and skipped (a CUDA-graph mode with 0 recorded ran without).
- **scaling efficiency** (with `--nproc`): global images/s ÷ (ranks × single-process images/s);
  **ranks identical**: every rank's weights after the first step equal rank 0's, bit for bit.
- **parity (worst ÷ limit)**: {judged}
  Every step runs on a new batch of the run's seeded sequence, the same for every backend.
  Each tensor passes when its norm-relative error ‖x − ref‖ / ‖ref‖ is at most 5 × its
  sensitivity (the largest error of three correct fp32 computations: eager, and eager perturbed
  by a few ulps twice) plus the backend's relative tolerance (1 % unless it declares more), and
  when its size along the reference (⟨x − ref, ref⟩ / ⟨ref, ref⟩) is within 5 × the same
  computations' + 1 %. A row declaring bf16 or fp16 has each sensitivity raised to eager's own
  error in that precision. The loss of every step of the first round must stay within 5 × the
  perturbed run's drift + the tolerance of fp32 eager's over the same batches. The figure is the
  worst check's error ÷ its limit (≤ 1 passes; the parity table names it). Tensors whose
  sensitivity exceeds 1 % can't be resolved at this size (a conv bias before BatchNorm; at tiny
  batches, what a near-zero gradient's sign decides) and are not judged. Under DDP the reference
  trains the same global batch in one process, slice by slice (each rank's BatchNorm sees only
  its slice), and the ranks must also agree.
- **computes in**: the precision the row's first-step errors match best: fp32's, or eager's own
  in bf16 (autocast), and on CUDA fp16 or TF32. A row that declares fp32 but computes in bf16 is
  marked, and the summary ranks it apart from the rows at eager's precision.
- **latency p50 / p90 / p99** (inference): percentiles of the batch latency over every measured
  step of every round (linear interpolation between order statistics: with fewer than 100
  samples p99 sits near the slowest step); one step is one batch's forward.
"""


def _run_line(report: RunReport, batch: Optional[str] = None) -> str:
    """Who measured what where: the machine, torch, the workload and the protocol. ``batch``
    replaces the config's batch size (a sweep's sizes)."""
    env, config = report.environment, report.config
    gpus = ", ".join(g["name"] for g in env.get("gpus") or [])
    workload = config.workload
    options = ", ".join(f"{k} {v}" for k, v in workload.options.items())
    size = batch or str(config.batch_size)
    return (
        f"Measured {md_cell(report.started_at or env.get('date', ''))} with cnncompare {md_cell(env.get('cnncompare'))}, "
        f"torch {md_cell(env.get('torch'))}, on {md_cell(env.get('cpu'))} ({env.get('threads')} threads)"
        + (f" and {md_cell(gpus)}" if gpus else "") + ". "
        f"Workload **{md_cell(workload.name)}**" + (f" ({md_cell(options)})" if options else "")
        + (", **inference** (one forward of the eval-mode model per step)" if config.mode == "inference"
           else ", **training** (forward, loss, backward, Adam per step)")
        + f", batch {size} {md_cell(plural(workload.sample_unit, size))}, "
        f"{config.warmup} warm-up + {config.steps} measured steps per cell"
        + (f" and round, {config.rounds} rounds" if config.rounds > 1 else "")
        + (f"; C allocator: `--malloc {md_cell(config.malloc)}`" if config.malloc != "system" else "")
        + "."
    )


def render_markdown(report: RunReport, charts: Optional[list[tuple[str, str]]] = None, final: bool = False) -> str:
    """The report. ``charts`` are (title, file) pairs to link; at the ``final`` write, no charts
    means matplotlib is missing, and the report says how to get them."""
    env, config = report.environment, report.config
    out = ["# cnncompare report", ""]
    status = "**interrupted**: this run was stopped before every cell finished. " if report.interrupted else ""
    out.append(status + _run_line(report))
    out += ["", "## Summary", ""]
    devices = report.devices()
    for device in devices:
        out.append(_summary_line(report.verdicts[device], config.mode))
    if not devices:
        out.append("No cell finished.")
    if charts:
        out += [""] + [f"![{md_cell(title)}]({name})" for title, name in charts]
    elif final and charts is None:
        out += ["", PLOT_HINT]
    for device in devices:
        rows = report.rows(device)
        out += ["", f"## {md_cell(device)}", "", _device_table(rows, config)]
        rounds = _rounds_line(device, report.round_log.get(device, []))
        if rounds:
            out += ["", rounds]
        diagnostics = _diagnostics_table(rows)
        if diagnostics:
            peaks = {r.peak_precision or "fp32": r.peak_gflops for r in rows if r.peak_gflops}
            gflop = next((r.gflop_per_step for r in rows if r.gflop_per_step), None)
            probes = ", ".join(f"{precision} {_num(value)}" for precision, value in peaks.items())
            counted = "forward" if config.mode == "inference" else "forward + backward"
            out += ["", f"Why ({md_cell(device)}): the step is {_num(gflop)} GFLOP ({counted}); "
                        f"matmul probes reached (GFLOP/s) {probes or '–'} here; each row's % of peak is against "
                        f"its own precision's.{_kernel_time_hint(rows, config)}",
                    "", diagnostics]
        parity = _parity_table(rows)
        if parity:
            out += ["", f"Parity ({md_cell(device)}): each tensor's error against float64 eager after the same steps, "
                        "÷ its limit (see How to read this)." + _parity_cost_line(rows) + _randomness_line(rows),
                    "", parity]
        scaling = _scaling_table(rows, config)
        if scaling:
            out += ["", _scaling_line(device, rows, config) or "", "", scaling]
    out += ["", "## How to read this", "", how_to_read(config.mode).rstrip()]
    out += ["", "## Environment", "", _environment_table(env)]
    out += ["", "## Configuration", "", _config_table(config)]
    notes = _notes(report)
    if notes:
        out += ["", "## Notes", ""] + notes
    return "\n".join(out).rstrip() + "\n"


def _kernel_time_hint(rows: list[CellResult], config: RunConfig) -> str:
    """A sentence when page faults, not compute, are a large share of eager's CPU step under the
    system allocator; empty otherwise (and on accelerators, whose host kernel time is the driver's)."""
    eager = next((r for r in rows if r.backend == "eager" and r.status is Status.OK and r.device == "cpu"), None)
    if config.malloc != "system" or eager is None:
        return ""
    share = kernel_share(eager.cpu_user_s_per_step, eager.cpu_sys_s_per_step)
    if share is None or share < KERNEL_SHARE_HINT:
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
        out.append(f"{i}. " + ("(interrupted) " if rep.interrupted else "") + _run_line(rep))
    out += ["", "## Summary", ""]
    for i, rep in enumerate(reports, 1):
        for device in rep.devices():
            line = _summary_line(rep.verdicts[device], rep.config.mode)
            out.append(line.replace(f"**{md_cell(device)}**", f"**run {i}, {md_cell(device)}**", 1))
    for i, rep in enumerate(reports, 1):
        for device in rep.devices():
            out += ["", f"## Run {i}: {md_cell(device)} ({md_cell(rep.environment.get('cpu'))})", "",
                    _device_table(rep.rows(device), rep.config)]
    keys = list(dict.fromkeys(k for rep in reports for k in rep.environment))
    rows = [[md_cell(k)] + [md_cell(_env_value(k, rep.environment.get(k))) for rep in reports] for k in keys]
    out += ["", "## Environments", "", tabulate(rows, headers=[""] + [f"run {i}" for i in range(1, len(reports) + 1)],
                                                   tablefmt="github", disable_numparse=True)]
    modes = {rep.config.mode for rep in reports}
    out += ["", "## How to read this", "", how_to_read(modes.pop() if len(modes) == 1 else "train").rstrip()]
    return "\n".join(out).rstrip() + "\n"
