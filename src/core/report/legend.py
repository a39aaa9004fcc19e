"""The report's "How to read this": what every column and figure means, worded per mode
(a training step or a forward). Text only; ``how_to_read(mode)`` is the whole legend.

Its figures (the 95 % interval, parity's 5 × and 1 %) restate
``stats`` and ``cell.parity``: change them there and here together.
"""

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
  over the measured steps after warm-up, every round's; IQR = third minus first quartile. CPU
  steps are timed with `perf_counter`, CUDA steps with events, so no queued GPU work escapes the
  timed region. Rows' medians come from different minutes: compare rows by the speedup.
- **speedup vs eager**: eager's step ÷ this backend's on the same device; >1 is faster. Only
  `ok` rows get one. Measured in warm pairs: each step of the backend's process alternates with
  one of an eager process alive beside it; the geometric mean of the pairs' ratios, with its
  95 % interval in brackets (Student's t over the rounds, each a fresh pair of processes, their
  spread pooled with the device's other rows'); `*`:
  the interval is wider than the run's `--target`. The summary names a pick only when its
  interval clears eager, the noise floor (`eager-control`) and every other row round by round;
  else a tie.
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
