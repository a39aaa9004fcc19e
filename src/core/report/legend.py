"""What every column of a report means: one table, ``COLUMNS``, that the report's "How to read
this" (``how_to_read``), docs/reading.md and ``cnncompare docs reading`` all render from.

docs/reading.md holds the training wording between two generated markers;
``python -m cnncompare.core.report.legend docs/reading.md`` rewrites it and the test suite fails
when it drifts. Column names are the tables' headers (``tables``). Figures here (the 95 %
interval, parity's 5 × and 1 %) restate ``stats`` and ``cell.parity``: change them there and
here together.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import NamedTuple

from .wording import STEP_UNIT, plural

#: What one step is, per mode.
STEP_IS = {
    "train": "one training step (forward, the workload's loss, zero_grad, backward, the workload's optimizer)",
    "inference": "one forward of the batch through the eval-mode model (under `torch.inference_mode()`)",
}

#: What the first step holds of a lazy compile, per mode.
LAZY = {"train": "forward and backward", "inference": "the forward"}

#: What parity judges, per mode (the rule that follows is the same).
PARITY_JUDGES = {
    "train": "the backend's training against float64 eager trained the same steps on the same batches: every "
             "gradient and buffer (BatchNorm's running statistics and counts) after step 1; every gradient, weight "
             "(against its last update), the last update itself and buffer after the *parity step*, the first after the "
             "backend's warm-up (step 3 for the built-ins: with Adam's state, CUDA graphs replaying, TorchScript "
             "optimised); the loss of every "
             "step up to it; then every later step's loss of the first round against fp32 eager's.",
    "inference": "the backend's forward against float64 eager's forward of the eval-mode model on the same "
                 "batches: the outputs (against their spread) and every buffer (BatchNorm's running statistics, "
                 "which must not move) after step 1 and after the parity step (step 3 for the built-ins), then "
                 "every later forward's largest output against fp32 eager's.",
}


class Column(NamedTuple):
    """A column (or a group of columns read together) and what it means; ``{step}``, ``{steps}``,
    ``{lazy}`` and ``{judged}`` are worded per mode, ``{unit}`` per workload. ``modes``: where it
    appears."""

    name: str
    meaning: str
    modes: tuple[str, ...] = ("train", "inference")


COLUMNS: tuple[Column, ...] = (
    Column("status", "`ok`, `fail_accuracy` (non-finite loss, or parity failed), `fail_compile`, `fail_run`, `timeout`, "
           "`crashed` (killed by a signal, or exited without a result), `oom`, `skipped` (device absent, or the "
           "backend declines it or this mode); the error's last lines are in the notes. Only `ok` rows are ranked."),
    Column("speedup vs eager", "eager's step time ÷ this row's on the same device; > 1 is faster (never clipped). "
           "Measured in warm pairs: once the row's process is warm, a fresh eager process starts beside it and "
           "warms up as many steps, then each step of one alternates with a step of the other, over rounds of "
           "fresh process pairs (the backends in a shuffled order each round, from the order seed the rounds line "
           "names). The geometric mean of the pairs' ratios, with its "
           "95 % interval in brackets (Student's t over the rounds, their spread pooled with the device's other "
           "rows'). `*` (with `--target`): the interval is wider than the target; the rounds line under the table says "
           "what would narrow it."),
    Column("step (s)", "seconds per step, {step}, from the speedup: the eager steps every row was paired with "
           "(their geometric mean) ÷ this row's speedup, with the interval that follows from the speedup's. So the "
           "step times, throughput, GFLOP/s, the summary and the charts all tell the speedup's story; a row "
           "without a speedup (not `ok`) has its own median. CPU steps are timed with `time.perf_counter`; CUDA "
           "steps with a pair of CUDA events on the stream and one synchronise after the loop, so queued GPU work "
           "can't escape the timed region."),
    Column("latency p50 / p90 / p99 (ms)", "percentiles of one batch's forward over every measured step of every "
           "round (linear interpolation between order statistics: with fewer than 100 samples p99 sits near the "
           "slowest step).", ("inference",)),
    Column("loop: time, vs eager", "the run's loop (the `loop` line of the setup; `--loop`) projected for this "
           "row: its compile, first step and warm-up, then every step, evaluation batch, ragged last batch and "
           "first step after an evaluation the loop holds. After its measured steps each cell meets "
           "each of those events once, then 3 times more, each later time divided by a full step's timed next to "
           "it (a full step after an evaluation or a ragged batch counts as a full step unless a compile came "
           "with it); the projection prices each event at that ratio times the row's step time, plus its first "
           "time's excess once (a recompile lands there). Then eager's loop ÷ this row's, with the interval that follows "
           "from the speedup's. **N recompiles**: compiles dynamo started while the cell met the loop's events "
           "(a ragged batch, a switch to evaluation and back); `none: ...` where the cell could not run an "
           "event (the loop would fail) or did not rehearse it (`--nproc`).", ("train", "inference")),
    Column("up front (s)", "what the backend costs once beyond eager, wherever its compile lands: compile, plus "
           "what the first step and the warm-up steps took beyond as many steady steps (lazy compiles, recompiles, "
           "CUDA-graph recording, TorchScript's profiling runs), minus the same of eager's; 0 when that is below "
           "one of eager's steps (a first step alone scatters by more)."),
    Column("break-even", "{steps} until the up-front cost is repaid by the saving per step (eager's step × (1 − "
           "1 ÷ speedup)), with the interval that follows from the speedup's (`≥ N`: its upper end is never); "
           "`none to repay` where nothing is paid up front; `never` where the speedup's interval reaches 1 or lies "
           "below it."),
    Column("parity", "pass or FAIL, and in brackets the worst check's error ÷ its limit (≤ 1 passes): {judged} "
           "Every step runs on a new batch of the run's seeded sequence, the same for every backend. A tensor passes "
           "when its norm-relative error ‖x − ref‖ / ‖ref‖ is at most 5 × "
           "its sensitivity (the largest error of three correct fp32 computations: eager, and eager perturbed by "
           "a few ulps, twice) plus the backend's relative tolerance (1 % unless it declares more), and its size along "
           "the reference (⟨x − ref, ref⟩ / ⟨ref, ref⟩) is within 5 × theirs + 1 %. A row declaring bf16 or fp16 "
           "has each sensitivity raised to eager's own error in that precision. The parity table names the worst "
           "check, and how many tensors were beyond resolution. Each of the two checks is judged where the fp32 "
           "computations agree to 1 %; a tensor neither resolves can't be judged at this size."),
    Column("computes in", "the precision the row's first-step errors match best: fp32, or eager's own under "
           "autocast bf16 (on CUDA also fp16 and TF32), with what the backend declares where that differs. The "
           "summary ranks a row at another precision than eager's apart, never over the rows at eager's."),
    Column("{unit}s/s", "throughput: the batch's {unit}s ÷ the step time (from the speedup, as **step (s)**)."),
    Column("own median (s), own IQR (s)", "the median and the third minus first quartile of the steps the row's "
           "own processes measured, every round's: unpaired, each from its own minutes, so rows' medians differ by "
           "the machine's drift as well as by the backend (`step_s` in the JSON). Nothing in the verdict is read "
           "from them."),
    Column("first step (s)", "the first step alone, which holds lazy compilation (`torch.compile` compiles "
           "{lazy} here). Cold: every cell runs in a fresh process with a fresh inductor cache. **warm first step "
           "(s)** is the median of later rounds', which reuse the cell's cache."),
    Column("compile (s)", "wall time of the backend's `compile(model, example, device)` call (plus "
           "`compile_step`), round 1, cold cache; \"(warm …)\": the median of later rounds'. `torch.compile` returns at "
           "once: its compiling lands in the first step."),
    Column("peak RSS steady / one-off (MB)", "peak resident memory of the cell's process over the measured steps "
           "(steady) and over compile, first step and warm-up (one-off: autotuning, CUDA-graph recording, the "
           "parity snapshot); the JSON has each phase (`peak_rss_first_step_mb`, `peak_rss_warmup_mb`, "
           "`peak_rss_steady_mb`) and the lifetime peak `peak_rss_mb`. Inductor's compile workers are processes of "
           "their own and not in it (see compile workers)."),
    Column("allocated peak (MB)", "CPU: the most memory the cell's process holds allocated during a step "
           "(`allocated_peak_steady_mb`), measured in one more, untimed step after the measured ones: the C "
           "library's bytes in use as the step begins (glibc's `mallinfo2`) plus the largest rise of the step's "
           "tensors (`torch.profiler`'s memory events). Unlike RSS it has no free heap in it, so processes running "
           "the same code agree to within 0.01 %; what memory ÷ eager compares on the CPU. Round 1's cell; glibc only."),
    Column("CUDA peak alloc steady / one-off, reserved (MB)", "`torch.cuda.max_memory_allocated` over the measured "
           "steps and over compile, first step and warm-up; `max_memory_reserved` over the cell (CUDA devices "
           "only). Neither counts the CUDA context."),
    Column("achieved GFLOP/s, % of peak", "the step's FLOPs (`torch.utils.flop_counter`; the optimizer's elementwise update "
           "is not counted) ÷ the step time (**step (s)**), against the best rate of a matmul probe on the same "
           "device (1024² on the CPU, 8192² on CUDA; "
           "best of 10) in the precision the step's FLOPs run in (in brackets): fp32; for fp32 rows on CUDA, TF32 or fp32 for the "
           "convolutions and matmuls as torch's flags say, weighted by their FLOPs; bf16 or fp16 for mixed "
           "precision. How far from the hardware the step runs."),
    Column("memory ÷ eager", "this row's steady peak ÷ eager's: 0.80x uses 20 % less memory than eager, 1.25x 25 % "
           "more. Allocated memory, as PyTorch's own harness compares it: on the CPU the allocated peak (the "
           "column before; eager's from its own cell), on CUDA the measured steps' CUDA allocated peak against the "
           "eager process the row's round-1 cell was paired with (the same phase of the same kind of process); "
           "one-off peaks such as autotuning are not in it. Without glibc, RSS against that eager process: "
           "identical processes' RSS differs by several per cent, so read such a ratio within about 5 % of 1 as "
           "no difference. A row that replays CUDA graphs is compared by reserved memory; a "
           "backend with an allocator of its own gets none on CUDA."),
    Column("page faults / step, kernel CPU s / step", "from `getrusage` around the measured steps (every thread of "
           "the cell's process): the OS's share of a step. A tensor larger than glibc's mmap threshold is mapped "
           "and zeroed anew each step, so a step that frees and re-allocates hundreds of MB pays here; `--malloc "
           "reuse` keeps freed memory in the process."),
    Column("dynamo graphs / breaks / recompiles", "what `torch.compile` captured during the cell: graphs, graph "
           "breaks (the reasons are in the JSON) and recompiles; \"fell back to eager\" where dynamo captured "
           "nothing or hit its recompile limit. On CUDA, the CUDA graphs inductor recorded and skipped."),
    Column("compile phases (s): dynamo / AOT / inductor / codegen", "where the cell's compile time went, from "
           "torch's own compile metrics over every compile up to the end of the measured steps (recompiles "
           "included), each phase without the next: dynamo's tracing and guards; AOT autograd's joint graph and "
           "partition; inductor's lowering and passes; inductor's code generation and the compilation of the "
           "generated C++ or Triton (with the wait on its workers); kernel autotuning in brackets where torch timed "
           "it. The JSON has them per row under `dynamo.compile_phases`."),
    Column("compile cache", "`cold` by default (a fresh inductor cache per cell); `--compile-cache warm` runs each "
           "cell three times: cold, saving its portable cache (`torch.compiler.save_cache_artifacts`); warm, sharing "
           "the cold run's cache directory, the run the row reports; and from an empty cache loaded with the portable "
           "one (`load_cache_artifacts`, its load counted in the compile), as a fresh machine or CI job would start. "
           "The cold and portable compile and first step are in brackets."),
    Column("compile workers (peak RSS)", "inductor's compile workers in the cell (torch's own count unless "
           "`--compile-threads`); their summed peak RSS, sampled every 0.1 s through compile and warm-up, in "
           "brackets."),
    Column("scaling efficiency, ranks identical", "with `--nproc`: global throughput ÷ (ranks × the same "
           "backend's single-process throughput); ranks identical: every rank's weights after the first step "
           "equal rank 0's, bit for bit.", ("train",)),
)


def columns(mode: str, unit: str = "image") -> list[tuple[str, str]]:
    """Each column's name and meaning, worded for ``mode`` and the throughput ``unit``."""
    words = {"step": STEP_IS[mode], "lazy": LAZY[mode], "judged": PARITY_JUDGES[mode], "unit": unit,
             "steps": plural(STEP_UNIT[mode], 2)}
    return [(c.name.format(**words), c.meaning.format(**words)) for c in COLUMNS if mode in c.modes]


def how_to_read(mode: str, unit: str = "image") -> str:
    """The report's legend: every column, worded for ``mode``'s step."""
    return "\n".join(f"- **{name}**: {meaning}" for name, meaning in columns(mode, unit))


#: The markers around the generated legend in docs/reading.md.
BEGIN = "<!-- columns: generated by `python -m cnncompare.core.report.legend docs/reading.md`; edit legend.py -->"
END = "<!-- columns: end -->"


def with_legend(page: str) -> str:
    """``page`` with its generated block replaced by the training legend."""
    head, found, rest = page.partition(BEGIN)
    if not found or END not in rest:
        raise ValueError(f"no generated block ({BEGIN} ... {END})")
    return head + BEGIN + "\n" + how_to_read("train") + "\n" + END + rest.split(END, 1)[1]


if __name__ == "__main__":
    target = Path(sys.argv[1])
    target.write_text(with_legend(target.read_text(encoding="utf-8")), encoding="utf-8")
