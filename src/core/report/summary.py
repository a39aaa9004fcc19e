"""The report's sentences: who measured what where (``run_line``), each device's verdict
(``summary_line``), and the lines that introduce a device's tables (rounds, parity's cost and
randomness, DDP scaling).

The verdict is ``stats.verdict``'s, already decided (the pick, ties, noise, the other precision's
row); these functions only word it. Every name from a report goes through ``md_cell``.
"""
from __future__ import annotations

import math
from typing import Optional, Sequence

from ..config import PARITY_MIN_WARMUP, RunConfig
from ..records import ReferenceInfo, Status
from ..results import CellResult, RoundInfo, RunReport
from ..stats import (
    CONFIDENCE,
    CONTROL,
    LOOKS,
    MAX_LOOKS,
    T_INTERVAL_MIN_ROUNDS,
    VERDICT_CONFIDENCE,
    Verdict,
    later_round_s,
    measured_precision,
    measured_rounds,
    parity_cost,
    sentinel_spread,
    target_cost,
)
from .formatting import break_even, md_cell, num, per_s, speedup, step_time
from .wording import STEP_UNIT, plural


def setup_rows(report: RunReport) -> list[tuple[str, str]]:
    """The run's setup, a few short items for the report's first screen: machine, workload and
    step, batch, how the steps were measured, when."""
    env, config = report.environment, report.config
    gpus = ", ".join(g["name"] for g in env.get("gpus") or [])
    workload = config.workload
    options = ", ".join(f"{k} {v}" for k, v in workload.options.items())
    recipe = workload.recipe
    step = ("inference: one forward of the eval-mode model per step" if config.mode == "inference"
            else "training: forward, loss, backward and the optimizer per step")
    rows = [
        ("machine", f"{md_cell(env.get('cpu'))}, {env.get('threads')} threads" + (f"; {md_cell(gpus)}" if gpus else "")),
        ("software", f"torch {md_cell(env.get('torch'))}, cnncompare {md_cell(env.get('cnncompare'))}"),
        ("workload", f"**{md_cell(workload.name)}**" + (f" ({md_cell(options)})" if options else "") + f"; {step}"),
        ("batch", f"{config.batch_size} {md_cell(plural(workload.sample_unit, config.batch_size))}"
                  + (f" per micro-batch, {config.micro_batches} per step" if config.micro_batches > 1 else "")),
        *([] if config.mode == "inference" else [("recipe", md_cell(recipe.describe(config.lr)))]),
        ("loop", md_cell(workload.loop.describe(config.batch_size, config.mode == "inference"))
                 + " (each row's loop column projects it; `--loop KEY=VALUE` changes it)"),
        ("measured", _protocol(report)),
        ("started", md_cell(report.started_at or env.get("date", ""))),
    ]
    if config.malloc != "system":
        rows.append(("C allocator", f"`--malloc {md_cell(config.malloc)}`"))
    return rows


def warmup_text(config: RunConfig) -> str:
    """The warm-up steps the cells run: in round 1 at least parity's (it judges the step after them)."""
    if config.warmup >= PARITY_MIN_WARMUP:
        return f"{config.warmup} warm-up"
    return (f"{PARITY_MIN_WARMUP} warm-up in round 1 (parity judges step {PARITY_MIN_WARMUP + 1}; --warmup "
            f"{config.warmup} applies to later rounds)")


def _protocol(report: RunReport) -> str:
    config = report.config
    if paired(report):
        more = ("more for the rows contending for the pick until it is decided" if config.target is None
                else f"more while an interval is wider than ±{config.target:g} %")
        return (f"{warmup_text(config)} steps, then {config.steps} step pairs with a fresh eager process per cell "
                f"and round; at least {config.rounds} rounds, {more}, while the {config.budget_s:g} s budget allows; "
                + ("each round's processes forked from a new server (a new memory layout)" if config.fork_server == "per-round"
                   else "every round's processes forked from one server (one memory layout, `--fork-server per-run`)"))
    return (f"{warmup_text(config)} + {config.steps} measured steps per cell"
            + (f" and round, {config.rounds} rounds" if config.rounds > 1 else ""))


def run_line(report: RunReport, batch: Optional[str] = None) -> str:
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
           else ", **training** (forward, loss, backward and the optimizer per step)")
        + f", batch {size} {md_cell(plural(workload.sample_unit, size))}, " + _protocol(report)
        + (f"; C allocator: `--malloc {md_cell(config.malloc)}`" if config.malloc != "system" else "")
        + "."
    )


def summary_line(v: Verdict, mode: str = "train") -> str:
    """Which backend to pick on this device, what it costs up front, and whether the win is real;
    break-even counted in ``mode``'s steps (training steps, or forwards); then, apart, the fastest
    row that computes in another precision than eager, and the run's noise floor (eager against
    itself)."""
    line = _ranked_line(v, mode)
    other = v.other_precision
    if other is not None:
        declared = other.parity.declared_precision if other.parity else None
        measured = measured_precision(other)
        how = f"computes in {measured}" + (f", though it declares {declared}" if declared and declared != measured else "")
        line = (line[:-1] if line.endswith(".") else line) + (
            f". At another precision than eager's ({v.precision}): **{md_cell(other.backend)}** at {speedup(other)} "
            f"eager ({how}; parity passed).")
    if v.control is not None and v.control.speedup_vs_eager is not None:
        line += f" Noise floor (eager against itself, `{CONTROL}`): {speedup(v.control)}."
    return line


#: Past this many rounds a suggested budget stops being advice (hours on this machine).
ROUNDS_WORTH_SUGGESTING = 100


def verdict_level(v: Verdict) -> str:
    """The verdict's level in words: what its tests are at, and why not 95 %."""
    return f"{v.confidence * 100:.1f} % (95 % over the up to {MAX_LOOKS} looks a run takes)"


def stop_line(v: Verdict, log: Sequence[RoundInfo], config: RunConfig, rows: Sequence[CellResult] = ()) -> Optional[str]:
    """How the rounds ended, indented under the summary line: decided after N rounds, or
    undecided between the rows no round separated, with what separating them would take. None
    for a run without rounds of warm pairs (nothing was decided round by round). ``rows``: the
    device's, whose later rounds' cost prices the rounds still needed."""
    if not v.paired or len(log) < 2 or v.best is None or v.eager is None:
        return None
    ended = log[-1].ended_s
    after = f"{len(log)} rounds" + (f", {ended / 60:.1f} min" if ended is not None else "")
    if v.pick is not None:
        return f"  Decided after {after}."
    between = v.undecided_between
    names = " and ".join(f"**{md_cell(n)}**" for n in between) if len(between) < 3 else (
        ", ".join(f"**{md_cell(n)}**" for n in between[:-1]) + f" and **{md_cell(between[-1])}**")
    text = f"  Undecided between {names} after {after}"
    needed = v.rounds_to_separate
    if needed is None:
        return text + ": they measured alike, and no number of rounds is sure to separate them."
    if needed > ROUNDS_WORTH_SUGGESTING:
        return (text + f": what they measured apart would take over {ROUNDS_WORTH_SUGGESTING} rounds to separate; "
                f"for a difference that small, {'either' if len(between) == 2 else 'any of them'} will do.")
    if ended is None:
        return text + f": separating them would take about {needed} rounds in all if their difference held."
    # Each more round runs every row still undecided, at what a later round of it costs.
    per_round = sum(later_round_s(r) or 0.0 for r in rows if r.backend in between and r.backend != "eager")
    extra = max(0, needed - len(log)) * (per_round or ended - (log[-2].ended_s or 0.0))
    return (text + f": separating them would take about {needed} rounds in all if their difference held, "
            f"some {max(1, round(extra / 60))} more min (`--budget {config.budget_s + extra:.0f}`).")


def use_it_line(v: Verdict) -> Optional[str]:
    """The pick's "use it" line (the code to write), indented under its summary line; None
    without a pick or where the row recorded none (reports from before rows did)."""
    if v.pick is None or v.best is None or not v.best.use_it:  # the pick is the best row
        return None
    return f"  Use it: `{v.best.use_it}`"


def loop_line(v: Verdict, rows: Sequence[CellResult], config: RunConfig) -> Optional[str]:
    """The declared loop's verdict, indented under the step's: the backend whose projected loop
    is shortest among the rows at eager's precision (the control aside), its loop speedup over eager's, the step's fastest where it
    differs, and which rows recompile in the loop. None where no row projects the loop."""
    timed = sorted((r for r in rows if r.loop is not None and r.loop.total_s is not None and r.backend != CONTROL),
                   key=lambda r: r.loop.total_s if r.loop is not None and r.loop.total_s is not None else math.inf)
    if v.precision:  # ranked as the step's verdict ranks: at eager's precision
        timed = [r for r in timed if measured_precision(r) in (None, v.precision)]
    if not timed:
        return None

    def figure(r: CellResult) -> str:
        f = r.loop
        assert f is not None and f.total_s is not None
        ci = f.speedup_ci
        ratio = "" if f.speedup_vs_eager is None else (
            f", {f.speedup_vs_eager:.2f}x" + (f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci and ci[0] != ci[1] else "")
            + " eager's")
        return f"{num(f.total_s)} s{ratio}"

    fastest = timed[0]
    loop = config.workload.loop.describe(config.batch_size, config.mode == "inference")
    text = f"  Over the loop ({md_cell(loop)}): fastest **{md_cell(fastest.backend)}** at {figure(fastest)}"
    best = v.best
    if best is not None and best is not fastest and best.loop is not None and best.loop.total_s is not None:
        text += f"; the step's fastest, **{md_cell(best.backend)}**, takes {figure(best)} there"
    recompiling = [r.backend for r in timed if r.loop is not None and r.loop.recompiles]
    if recompiling:
        text += f"; recompiling in the loop: {', '.join(md_cell(n) for n in recompiling)}"
    return text + "."


def _ranked_line(v: Verdict, mode: str) -> str:
    """The verdict among the rows at eager's precision."""
    best, device = v.best, md_cell(v.device)
    if best is None or best.step_s is None:
        return f"- **{device}**: no backend finished `ok`."
    if v.eager is None:
        return (f"- **{device}**: fastest **{md_cell(best.backend)}**, {num(best.step_time_s, 4)} s/step "
                "(no eager row, so no speedup and no verdict).")
    names = ", ".join(f"**{md_cell(n)}**" for n in v.tied_with if n != "eager")
    if v.too_few_rounds:
        return (f"- **{device}**: no pick from {v.rounds} round(s): the fastest is **{md_cell(best.backend)}** at "
                f"{speedup(best)} eager, but with fewer than {v.min_rounds} rounds the intervals come from "
                f"one process's steps and are narrower than the truth. Rerun with `--rounds "
                f"{v.min_rounds}` or more.")
    if best is v.eager:
        return (f"- **{device}**: pick **eager**, {num(best.step_time_s, 4)} s/step: no backend beat it here"
                + (f" ({names} within its noise)." if names else "."))
    level = verdict_level(v)
    if "eager" in v.tied_with:
        tested = f" ({num(v.tested_ci[0], 2)}, {num(v.tested_ci[1], 2)})" if v.tested_ci else ""
        return (f"- **{device}**: no backend is clearly faster than eager: the fastest, **{md_cell(best.backend)}** "
                f"at {speedup(best)} eager, has an interval at {level} that reaches 1.0{tested}"
                + (f" ({names} within it too)" if names else "") + f". {MORE}")
    if v.below_control:
        return (f"- **{device}**: no backend clears this run's noise floor: the fastest, **{md_cell(best.backend)}** "
                f"at {speedup(best)} eager, is not faster than eager measured against itself "
                f"(its interval over `{CONTROL}` at {level}, round by round, reaches 1)"
                + (f" ({names} tied with it)" if names else "") + f". {MORE}")
    if v.tied_with:
        return (f"- **{device}**: a tie: **{md_cell(best.backend)}** at {speedup(best)} eager, and {names}, which it "
                f"doesn't beat at {level} round by round. {MORE}")
    text = (f"- **{device}**: pick **{md_cell(best.backend)}**, {step_time(best)} s/step against eager's "
            f"{num(v.eager.step_time_s)}, {speedup(best)} eager")
    if best.break_even_steps == 0:
        text += ", with no extra up-front cost"
    elif (steps := best.break_even_steps) is not None:
        text += (f"; its {num(best.up_front_s)} s up front are repaid after {break_even(best)} "
                 f"{plural(STEP_UNIT[mode], steps)}")
    return text + "."


def paired(report: RunReport) -> bool:
    """Whether the run measured its speedups in warm interleaved pairs."""
    return any(r.round_eager_samples for r in report.results)


#: What a verdict that can't separate its rows suggests.
MORE = "A larger `--budget` (or more `--rounds`) narrows the intervals."


def rounds_line(device: str, log: list[RoundInfo], rows: Sequence[CellResult] = (),
                config: Optional[RunConfig] = None, order_seed: Optional[int] = None) -> Optional[str]:
    """How many rounds, how the speedups were measured in them, which rows reached the target,
    how many rounds each row measured, and how far the drift sentinel moved over them."""
    if len(log) < 2:
        return None
    pairs = [r for r in rows if r.round_eager_samples]
    per_row = ", ".join(f"{md_cell(r.backend)} {measured_rounds(r)}" for r in rows if r.status == Status.OK)
    if pairs and config is not None:
        text = (f"Rounds ({md_cell(device)}): {len(log)}, the backends in a shuffled order each round (order seed "
                f"{order_seed}); in each, every backend's process, once warm, is paired with a fresh eager "
                "process warmed up as long (round 1: the cold cells, which also take compile, memory and parity), "
                "the parent alternating their steps in a random order; speedup = geometric mean of the step "
                f"pairs' ratios, each round weighing the same, with its {CONFIDENCE:.0%} interval (Student's t over "
                "the rounds' means, their spread pooled with the device's other rows', never narrower than the "
                "step pairs' own scatter allows). " + _policy_text(pairs, config)
                + f". Rounds measured per row: {per_row}. Compile and first step (warm) = the median of later "
                "rounds', which reuse the cell's compile "
                "cache; break-even counts round 1's cold costs.")
    else:
        text = (f"Rounds ({md_cell(device)}): {len(log)}, each backend once per round in a fresh shuffled order; "
                f"speedup = geometric mean over rounds of each round's ratio to eager, with its {CONFIDENCE:.0%} "
                f"interval ({_interval_method(len(log))}); compile and first step (warm) = the median of later "
                "rounds', which reuse the cell's compile cache; break-even counts round 1's cold costs.")
    spread = sentinel_spread([info.sentinel_s for info in log])
    if spread:
        low, high = spread
        text += (f" Drift sentinel: {low * 1000:.1f} to {high * 1000:.1f} ms "
                 f"(the machine's speed moved by {high / low - 1:.0%} over the run).")
    return text


def _policy_text(pairs: Sequence[CellResult], config: RunConfig) -> str:
    """Where the rounds after the first ``--rounds`` went (``run/policy.py``), and with
    ``--target`` which rows reached it."""
    if config.target is None:
        looks = ", ".join(str(k) for k in LOOKS if k > config.rounds)
        return (f"Rounds after the first {config.rounds} go to the rows still contending for the pick (the best, the "
                "rows the verdict can't yet tell from it, and the control in every round), and the "
                f"run stops once the verdict names a pick: it looks after round {config.rounds}"
                + (f" and rounds {looks}" if looks else "") + f", each of its tests at {VERDICT_CONFIDENCE * 100:.1f} % so "
                f"that over all {MAX_LOOKS} looks a run may take a wrong pick stays below 5 %")
    missed = [md_cell(r.backend) for r in pairs if r.target_reached is False]
    return (f"Rounds after the first {config.rounds} go to the rows wider than the target (`--target`), fewest "
            "rounds first, while the budget allows. "
            + (f"No row reached ±{config.target:g} % (each marked *)" if len(missed) == len(pairs) else
               f"{len(pairs) - len(missed)} of {len(pairs)} rows reached ±{config.target:g} %"
               + (f"; not (marked *): {', '.join(missed)}" if missed else ""))
            + _target_cost_text(pairs, config, config.target))


def _target_cost_text(rows: Sequence[CellResult], config: RunConfig, target: float) -> str:
    """What reaching the target on every row would take here, at the rounds' measured cost."""
    cost = target_cost(rows, target)
    if cost is None:
        return ""
    minutes = max(1, round(cost.extra_s / 60))
    return (f"; at this run's cost per round, ±{target:g} % on every row would take about {cost.rounds} "
            f"rounds for the widest ({md_cell(cost.widest)}) and {minutes} more {plural('minute', minutes)} of rounds "
            f"(`--budget {config.budget_s + cost.extra_s:.0f}` for this device alone)")


def _interval_method(rounds: int) -> str:
    return ("Student's t over the rounds' log ratios" if rounds >= T_INTERVAL_MIN_ROUNDS
            else "a bootstrap over each round's steps, narrower than the truth with so few rounds: no pick")


def randomness_line(rows: list[CellResult]) -> str:
    """What a workload that draws random numbers (dropout) was judged and timed with."""
    if not any(r.parity is not None and r.parity.random for r in rows):
        return ""
    return (" The workload's step draws random numbers (dropout): every cell and the reference seed torch's "
            "generator before each step, and inductor draws eager's random numbers "
            "(`torch._inductor.config.fallback_random`), so a correct backend computes the same masks; compiled "
            "rows were timed that way too, not with inductor's own generator.")


def coverage_line(rows: list[CellResult]) -> str:
    """Where a judged step's tensors were mostly beyond resolution, how few parity judged: per step,
    the fewest judged over the rows (the steps and counts are the workload's, the same for every
    row at this config)."""
    thin: dict[int, tuple[int, int]] = {}
    for r in rows:
        for c in (r.parity.coverage if r.parity is not None else []):
            if c.under_half and (c.step not in thin or c.judged < thin[c.step][0]):
                thin[c.step] = (c.judged, c.tensors)
    if not thin:
        return ""
    steps = ", ".join(f"{judged} of the {tensors} tensors after step {step}" for step, (judged, tensors) in sorted(thin.items()))
    return (f" Parity judged fewer than half of a step's tensors here: {steps}; the others change by less "
            "than fp32's own rounding can tell at this size (they are not judged: a larger batch or more steps "
            "resolve more).")


def parity_cost_line(rows: list[CellResult], reference: Optional[ReferenceInfo] = None) -> str:
    """What parity cost this run, and where its reference came from (``reference``: None in
    reports from before the cache, or where it failed)."""
    cost = parity_cost(rows)
    if cost is None:
        return ""
    share = f": {cost.share:.0%} of the cells' {num(cost.cells_wall_s)} s" if cost.share is not None else ""
    if reference is not None and reference.reused:
        when = f" on {reference.computed_at[:10]}" if reference.computed_at else ""
        source = (f"reused from the cache ({num(reference.seconds)} s when computed{when}; `--no-cache` computes it "
                  f"afresh)" if reference.cache else "reused from this process's earlier run")
        return f" The float64 reference was {source}; the checks cost {num(cost.checks_s)} s in all{share}."
    cached = " and cached for the next run" if reference is not None and reference.cache else \
        f"; {reference.note}" if reference is not None and reference.note else ""
    return (f" The check cost {num(cost.reference_s)} s for the float64 reference (computed once{cached}) and "
            f"{num(cost.checks_s)} s of checks in all{share}.")


def scaling_line(device: str, results: list[CellResult], config: RunConfig) -> Optional[str]:
    d = next((r.distributed for r in results if r.distributed), None)
    if d is None:
        return None
    threads = d.threads_per_rank
    unit = config.workload.sample_unit
    return (f"Scaling ({md_cell(device)}): DistributedDataParallel over {d.nproc} ranks "
            f"({d.nnodes} node(s) × {d.nproc_per_node}), weak scaling: {d.batch_size_per_rank} {unit}s "
            f"per rank, {d.global_batch_size} per global step"
            + (f", {threads} CPU thread(s) per rank" if threads and device == "cpu" else "")
            + f". Scaling efficiency = global {per_s(config)} ÷ (ranks × the same backend's single-process "
            f"{per_s(config)}, "
            "measured in this run with one rank's batch and threads); 1.00 means DDP costs nothing. "
            "The tables above show the slowest rank's steps: a synchronous step waits for it.")
