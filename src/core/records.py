"""The typed records that cross the process boundary, and their JSON form.

A cell's child builds one ``CellRecord`` and writes it as JSON; the parent
reads it back as a ``CellRecord`` (``from_json``), never as a dict. The same
records are the report's nested objects (``parity``, ``dynamo``,
``distributed``), so a figure has one name from the child to the report.
Reading is strict: an unknown key or a value of the wrong type is an error,
not a figure silently dropped. Both sides import this module; it imports no
torch.
"""
from __future__ import annotations

import json
import math
import pickle
from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Callable, Optional

from .codec import finite, from_data
from .config import RunConfig


class Status(str, Enum):
    OK = "ok"
    FAIL_ACCURACY = "fail_accuracy"
    FAIL_COMPILE = "fail_compile"
    FAIL_RUN = "fail_run"
    TIMEOUT = "timeout"
    CRASHED = "crashed"
    OOM = "oom"
    SKIPPED = "skipped"


@dataclass
class StepCoverage:
    """What parity judged after one step: ``judged`` of its ``tensors`` (the others are beyond
    what fp32 itself resolves at this config)."""

    step: int
    judged: int
    tensors: int

    @property
    def under_half(self) -> bool:
        return 2 * self.judged < self.tensors


@dataclass
class Parity:
    """The backend's training (in inference: its forwards) against float64 eager after the same
    steps on the same batches (``cell/parity.py``, whose docstring states the rules).

    ``step`` is the parity step N (the first after the backend's warm-up); ``tensors`` how many
    tensors were judged: every gradient and buffer after step 1, the loss of every step 1..N,
    every gradient, weight and buffer after step N, less ``not_judged``: those no check can
    resolve at this config (fp32 itself can't reproduce them). ``*_rel_error`` are norm-relative
    errors ``||x - ref|| / ||ref||`` over each group's elements together, for the backend and,
    for scale, for fp32 eager. ``worst_tensor`` is the check nearest its limit (a tensor's key;
    ``scale of <key>`` for the scale test; ``trajectory:<k>`` for step k's loss against fp32
    eager's) and ``margin`` its ``worst_error / worst_limit`` (pass at <= 1).
    ``coverage`` says, per judged step (1 and N), how many of its tensors were judged out of how
    many there are (the rest are ``not_judged``). ``trajectory_steps`` is how many steps' losses were checked; ``precision`` what the row
    measured as computing in (fp32, tf32, bf16, fp16: the nearest reference by its first-step
    errors), ``declared_precision`` what the backend declares; ``random`` that the workload
    draws random numbers (judged with eager's: docs/parity.md). ``check_s`` is the cell's own
    parity phase; ``reference_s`` what computing the shared reference cost, set on one row per
    device.
    """

    passed: bool
    reference: str
    multiplier: float
    tolerance: float
    loss_rel_error: Optional[float]
    grad_rel_error: Optional[float]
    weight_rel_error: Optional[float]
    eager_loss_rel_error: Optional[float]
    eager_grad_rel_error: Optional[float]
    eager_weight_rel_error: Optional[float]
    buffer_rel_error: Optional[float] = None
    eager_buffer_rel_error: Optional[float] = None
    #: Inference (``--mode inference``): the forward's outputs; the training groups are then None.
    output_rel_error: Optional[float] = None
    eager_output_rel_error: Optional[float] = None
    worst_tensor: Optional[str] = None
    worst_error: Optional[float] = None
    worst_limit: Optional[float] = None
    margin: Optional[float] = None
    step: int = 1
    tensors: Optional[int] = None
    not_judged: list[str] = field(default_factory=list)
    coverage: list["StepCoverage"] = field(default_factory=list)
    trajectory_steps: Optional[int] = None
    precision: Optional[str] = None
    declared_precision: Optional[str] = None
    random: bool = False
    detail: Optional[str] = None
    check_s: Optional[float] = None
    reference_s: Optional[float] = None

    @property
    def max_rel_error(self) -> float:
        """The largest group error (NaN first: a NaN is never hidden behind a finite one)."""
        errors = [e for e in (self.loss_rel_error, self.grad_rel_error, self.weight_rel_error, self.buffer_rel_error,
                              self.output_rel_error) if e is not None]
        return math.nan if not errors or any(math.isnan(e) for e in errors) else max(errors)


@dataclass
class CompilePhases:
    """Where a cell's compile time went, in seconds, from torch's own compile metrics
    (``torch._dynamo.utils.get_compilation_metrics``), over every compile of the cell up to the end
    of its measured steps (recompiles included), each phase exclusive of the next:

    ``dynamo_s``: dynamo's bytecode tracing and guards (a frame's compile less its backend's);
    ``aot_autograd_s``: AOT autograd's tracing of the joint graph and its partition (the backend's
    compile less inductor's, the lazy backward's likewise); ``inductor_s``: inductor's lowering and
    graph passes (less its code generation); ``codegen_s``: inductor's code generation and the
    compilation of the generated C++ or Triton; ``autotune_s``: kernel autotuning where torch
    timed it (null where it reports none). ``compiles``: the compile events summed (frames, the
    lazy backward's)."""

    dynamo_s: float
    aot_autograd_s: float
    inductor_s: float
    codegen_s: float
    autotune_s: Optional[float]
    compiles: int


#: The loop's events a cell rehearses (``cell/loop.py``), in the order a loop meets them.
#: full: a full training step (every step the loop takes in its first epoch but the events below);
#: ragged: an epoch's last, smaller step; after_ragged: a full step in a later epoch (after a ragged
#: batch a compiler may have made its graph dynamic); eval: one evaluation batch (eval mode, no
#: gradients; the first of each evaluation switches the mode); resume: the first training step after
#: an evaluation (back in train mode).
LOOP_EVENTS = ("full", "ragged", "after_ragged", "eval", "resume")


@dataclass
class LoopEvent:
    """One event of the loop as the cell met it: ``first_s`` the first time (a recompile lands
    here), ``steady_s`` the median of later times, both in the cell's own seconds; ``ratio`` a later
    time over a full step's before any ragged batch (the median of ratios to full steps timed next
    to it, ``cell/loop.py``); ``compiles`` the compiles dynamo started during the first time,
    ``steady_compiles`` during the later ones (None where dynamo never ran in the cell)."""

    name: str
    first_s: float
    steady_s: float
    ratio: float
    compiles: Optional[int] = None
    steady_compiles: Optional[int] = None


@dataclass
class LoopRehearsal:
    """What a cell measured of the run's loop (``config.LoopSpec``) after its measured steps:
    each event it holds (``LOOP_EVENTS``; ``full`` always first, the others where the loop has
    them), or the ``error`` that stopped the rehearsal (the row's step figures stand)."""

    events: list[LoopEvent] = field(default_factory=list)
    error: Optional[str] = None

    def event(self, name: str) -> Optional[LoopEvent]:
        return next((e for e in self.events if e.name == name), None)


@dataclass
class DynamoStats:
    """What dynamo did in the cell (``cell/diagnostics.py``); absent when it never ran.

    ``cudagraph_skips`` and ``cudagraphs_recorded`` are counted where inductor
    ran on CUDA (null elsewhere); ``cudagraphs_recorded`` is also null where
    torch's private CUDA-graph tree API has moved.
    """

    graphs: int
    graph_breaks: int
    recompiles: Optional[int]
    frames_compiled: int
    frames_seen: int
    fell_back_to_eager: bool
    break_reasons: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    cudagraph_skips: Optional[int] = None
    cudagraphs_recorded: Optional[int] = None
    compile_phases: Optional[CompilePhases] = None


@dataclass
class DistributedFigures:
    """A ``--nproc`` cell's DDP figures: the JSON's ``distributed`` object.

    Three groups, each written in one place: the job's shape and the ranks'
    own figures by the reporting rank (``cell/rank.py: combine``); the
    same backend in one process by the parent (``run/cell.py``);
    throughput and scaling efficiency by ``stats.derive``.
    """

    nproc: int
    nnodes: int
    nproc_per_node: int
    process_group: str
    batch_size_per_rank: int
    global_batch_size: int
    threads_per_rank: Optional[int]
    rank_step_median_s: list[float]
    slowest_rank: int
    slowest_rank_step_median_s: float
    peak_rss_mb_per_rank: list[Optional[float]]
    #: Every rank's weights after the first step equal rank 0's, bit for bit.
    ranks_identical: bool
    max_rank_weight_diff: float
    # The same backend in one process with one rank's batch and threads (parent).
    single_process_status: Optional[str] = None
    single_process_step_median_s: Optional[float] = None
    single_process_threads: Optional[int] = None
    single_process_error: Optional[str] = None
    # Derived (stats.derive).
    global_images_per_s: Optional[float] = None
    single_process_images_per_s: Optional[float] = None
    scaling_efficiency: Optional[float] = None


@dataclass(kw_only=True)
class Measured:
    """What a cell's child measures: the fields a ``CellRecord`` hands to the report's row.

    Figures that don't apply (or were never reached) are None.
    """

    status: Status = Status.OK
    threads: Optional[int] = None
    compile_s: Optional[float] = None
    first_step_s: Optional[float] = None
    warmup_s: list[float] = field(default_factory=list)
    rss_baseline_mb: Optional[float] = None
    peak_rss_mb: Optional[float] = None
    # Peaks by phase: compile + first step, the warm-up steps (one-off: CUDA-graph recording,
    # recompiles, the parity snapshot), the measured steps (steady; what memory_ratio compares);
    # the unsuffixed ones are the cell's lifetime peaks. RSS is the cell process's own: compile
    # workers are processes of their own, their summed peak is workers_peak_rss_mb.
    peak_rss_first_step_mb: Optional[float] = None
    peak_rss_warmup_mb: Optional[float] = None
    peak_rss_steady_mb: Optional[float] = None
    #: The CPU's allocated peak of a step after the measured ones (``cell.memory.allocated_peak_mb``:
    #: the C library's bytes in use, plus the step's tensors' rise): no heap in it, so identical
    #: processes agree to 0.01 %. Round 1's cell on the CPU, glibc only; None elsewhere.
    allocated_peak_steady_mb: Optional[float] = None
    workers_peak_rss_mb: Optional[float] = None
    cuda_peak_allocated_mb: Optional[float] = None
    cuda_peak_reserved_mb: Optional[float] = None
    cuda_peak_allocated_first_step_mb: Optional[float] = None
    cuda_peak_reserved_first_step_mb: Optional[float] = None
    cuda_peak_allocated_warmup_mb: Optional[float] = None
    cuda_peak_reserved_warmup_mb: Optional[float] = None
    cuda_peak_allocated_steady_mb: Optional[float] = None
    cuda_peak_reserved_steady_mb: Optional[float] = None
    #: Why this row's CUDA memory figures can't be compared with eager's (an allocator of the
    #: backend's own); None where they can.
    cuda_memory_incomparable: Optional[str] = None
    #: Inductor's compile workers in the cell (1: in-process); None where dynamo never ran.
    compile_threads: Optional[int] = None
    #: What the measured steps cost the OS, per step (process-wide: all threads).
    cpu_user_s_per_step: Optional[float] = None
    cpu_sys_s_per_step: Optional[float] = None
    page_faults_per_step: Optional[float] = None
    dynamo: Optional[DynamoStats] = None
    parity: Optional[Parity] = None
    gflop_per_step: Optional[float] = None
    peak_gflops: Optional[float] = None
    #: The precision peak_gflops was probed in: the backend's (fp32, bf16, fp16), tf32 for fp32 on CUDA
    #: where torch allows TF32 (roofline.peak_precision).
    peak_precision: Optional[str] = None
    distributed: Optional[DistributedFigures] = None
    #: The run's loop, rehearsed after the measured steps (None: not rehearsed; ``--nproc``).
    loop_rehearsal: Optional[LoopRehearsal] = None
    #: A cell that loaded a portable compile cache: what loading it took (in ``compile_s``) and its size.
    artifacts_load_s: Optional[float] = None
    artifacts_mb: Optional[float] = None
    error: Optional[str] = None
    error_tail: Optional[str] = None
    notes: list[str] = field(default_factory=list)


@dataclass(kw_only=True)
class CellRecord(Measured):
    """The child's whole answer, written as JSON (first after timing, again at the end).

    ``complete`` is true only in the final write: a record without it was cut
    short (a crash or a timeout in the parity check) and keeps its figures.
    ``step_samples`` are the measured steps' seconds, in run order. Under
    torchrun a failing rank also writes its own record with ``rank`` and
    ``failed_at`` (time.time()), so the parent can name the first to fail.
    """

    complete: bool = False
    step_samples: list[float] = field(default_factory=list)
    rank: Optional[int] = None
    failed_at: Optional[float] = None

    def measured(self) -> dict[str, Any]:
        """The ``Measured`` part, field by field (for the report's row)."""
        return {f.name: getattr(self, f.name) for f in fields(Measured)}

    def to_json(self) -> str:
        return json.dumps(finite(asdict(self)), allow_nan=False)

    @classmethod
    def from_json(cls, text: str) -> "CellRecord":
        return from_data(cls, json.loads(text))


@dataclass
class Shipped:
    """A plugin object (a backend, a workload) on its way to a cell's child: pickled, so objects
    registered in-process (tests, embedding applications) travel too; one that can't be pickled
    travels by name and is looked up again through the plugins in the child."""

    kind: str
    name: str
    pickled: Optional[bytes]
    pickle_error: Optional[str] = None

    @classmethod
    def of(cls, kind: str, obj: Any) -> "Shipped":
        try:
            return cls(kind, obj.name, pickle.dumps(obj))
        except Exception as exc:  # e.g. holds a lambda
            return cls(kind, obj.name, None, f"{type(exc).__name__}: {exc}")

    def unpack(self, lookup: Callable[[str, str], Any]) -> Any:
        """The object; ``lookup(kind, name)`` finds an unpicklable one through the plugins."""
        if self.pickled is not None:
            return pickle.loads(self.pickled)
        found = lookup(self.kind, self.name)
        if found is None:
            raise LookupError(
                f"{self.kind} {self.name!r} can't be pickled ({self.pickle_error}) and no installed plugin "
                f"registers it in the child; make it picklable or register it through an entry point")
        return found


@dataclass
class CellOrder:
    """What the parent asks of a cell's child, pickled into the cell's private directory.

    A file rather than stdin because under ``--nproc`` torchrun starts the
    ranks and their stdin is not ours. ``sys_path`` is the parent's: backends
    defined in its modules (tests, embedding apps) must import in the child.
    """

    sys_path: list[str]
    backend: Shipped
    workload: Shipped
    config: RunConfig
    device: str
    result_path: str
    cell_dir: str
    run_dir: Optional[str]
    progress_path: Optional[str]
    #: False in rounds after the first: time and memory only, no parity check or roofline.
    judge: bool = True
    #: Set: this child computes the device's parity reference (``cell/reference.py``), not a cell.
    reference: Optional["ReferencePlan"] = None
    #: Set: after its warm-up the cell serves its measured steps on command through the parent's
    #: socket at this path (``cell/serve.py``), one of a warm pair, instead of timing ``steps``.
    serve: Optional[str] = None
    #: Set: the portable compile cache (``torch.compiler.save_cache_artifacts``) at this path:
    #: written after the cell's steps (``CacheArtifacts.load`` false), or loaded before its compile.
    artifacts: Optional["CacheArtifacts"] = None


@dataclass(frozen=True)
class CacheArtifacts:
    """A cell's portable compile cache: ``path`` to write it to after the cell's steps, or (``load``)
    to load it from before the compile, the load timed as part of the compile."""

    path: str
    load: bool = False


@dataclass(frozen=True)
class ReferencePlan:
    """What one device's parity reference must cover: the parity steps of its backends, every
    step a cell runs in its first round, the reduced precisions some backend declares (traced
    over every step), and DDP's shards (the world size; 1 without ``--nproc``)."""

    parity_steps: tuple[int, ...]
    steps: int
    precisions: tuple[str, ...] = ()
    shards: int = 1


@dataclass
class ReferenceInfo:
    """How a run got one device's parity reference (``run/reference_cache.py``): ``seconds`` is
    what computing it took when it was computed (``computed_at``), ``reused`` whether this run
    took it from the cache or from an earlier run in the same process instead (then it paid
    none of it), ``cache`` the cache entry's directory (None with ``--no-cache``)."""

    seconds: float
    reused: bool
    cache: Optional[str] = None
    computed_at: Optional[str] = None
    #: Why the cache wasn't used where it was on (it can't be written, the disk is full).
    note: Optional[str] = None
