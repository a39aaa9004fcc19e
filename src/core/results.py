"""A run's results as the parent and the reports see them; the report's JSON round trip.

A ``CellResult`` is one row: what the child measured (``records.Measured``,
copied from its ``CellRecord``), what the parent knows (plugin, cache mode,
wall time, how the child ended) and the derived figures (``stats.derive``).
``RunReport`` derives them once whenever a result joins it or it is loaded,
so what is written and what is rendered agree.
"""
from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from . import stats
from .codec import finite, from_data
from .config import RunConfig
from .records import CellRecord, Measured, ReferenceInfo, Status
from .stats import StepStats

#: 2: parity judges steps 1 and N with a relative rule (``margin``, ``worst_error``, buffers);
#: version 1's ``worst_rmse`` (an absolute RMSE, first step only) is read and dropped.
#: 3: per-phase memory peaks (``*_warmup_mb``, ``cuda_peak_*_steady_mb``; ``peak_rss_steady_mb``
#: is the measured steps' alone), ``workers_peak_rss_mb``, ``peak_precision``, ``compile_threads``
#: as the cell found it (null where dynamo never ran). 2: the relative parity rule and rounds.
#: 4: the config's workload says what throughput counts (``throughput_unit``, ``units_per_sample``:
#: tokens for the transformer), and ``images_per_s`` / ``global_images_per_s`` are in that unit;
#: older reports read as one sample per unit. (A batch-size sweep's summary JSON carries the same
#: version with ``"kind": "batch-size sweep"``.)
#: 5: the config's ``mode`` (``train`` or ``inference``; older reports read as ``train``), inference
#: rows' ``latency_p50_s`` / ``latency_p90_s`` / ``latency_p99_s`` and parity's ``output_rel_error``.
#: 6: the config's ``backend_options``.
#: 7: a new batch every step; parity's ``trajectory_steps``, ``precision`` (measured),
#: ``declared_precision`` and ``random``; weights judged by their last update; the device
#: verdict's ``precision`` and ``fastest_other_precision``.
#: 8: warm interleaved pairs: ``round_eager_samples`` (each round's eager steps paired with the
#: row's), ``target_reached``, the config's ``target`` and ``budget_s``.
#: 9: each row's ``use_it`` (the code a user writes to get it; empty in older reports).
#: 10: every speed figure from the paired measurement: ``step_time_s`` and ``step_time_ci`` (eager's
#: paired step / the speedup), ``images_per_s`` and GFLOP/s from them; ``up_front_s`` and
#: ``break_even_ci``; parity's ``coverage`` per judged step; ``memory_vs_eager`` (the backend's peak / eager's, < 1 uses less) replaces
#: ``memory_ratio_vs_eager`` (eager's / the backend's); the report's ``order_seed``. ``step_s`` is
#: each row's own processes' steps, unpaired.
#: 11: the report's ``references`` (per device: computed or reused from the cache, and what
#: computing it took); parity judges each weight's last ``update`` and each check (norm, scale)
#: where fp32 resolves it.
#: 12: the stopping rule: the config's ``target`` is null unless ``--target`` asked for every row
#: precise; each round's ``ended_s``; the device verdict's ``confidence`` (every test of it),
#: ``tested_ci``, ``undecided_between`` and ``rounds_to_separate``.
#: 13: the workload's training recipe (``config.workload.recipe``: optimizer, scheduler,
#: clip_grad_norm, accumulation_steps); older files read as the default recipe, Adam at ``lr``.
#: 14: the loop: each row's ``loop_rehearsal`` (the loop's events as its cell met them) and ``loop``
#: (``total_s``, ``speedup_vs_eager``, ``speedup_ci``, ``recompiles``, ``events``, ``error``); the config's
#: ``workload.loop``. Older files read with no loop figures.
#: 15: each row's ``allocated_peak_steady_mb`` (the CPU's allocated peak of a step: what
#: ``memory_vs_eager`` compares on the CPU); the config's ``fork_server`` (older files: ``per-run``).
SCHEMA_VERSION = 15

#: Environment keys that must match for two runs to be comparable cell by cell.
#: (The thread count is the config's, compared there.)
COMPARABLE_ENVIRONMENT = ("python", "torch", "cpu", "cpu_cores_available", "gpus", "cuda", "cnncompare",
                          "platform", "nvidia_driver")


@dataclass(kw_only=True)
class CellResult(Measured):
    """One backend on one device. Figures that don't apply are None (null in JSON)."""

    backend: str
    device: str
    plugin: Optional[str] = None
    description: str = ""
    #: The backend's "use it" line for this row's device (``backends.base.use_it``).
    use_it: str = ""
    #: The steps the row's own processes measured (every round's, in run order): unpaired, each
    #: from its own minutes; the report's step time is ``step_time_s``.
    step_s: Optional[StepStats] = None
    compile_cache: Optional[str] = None
    cold_compile_s: Optional[float] = None
    cold_first_step_s: Optional[float] = None
    #: ``--compile-cache warm``: a third run from an empty cache loaded with the cold run's portable
    #: cache (``torch.compiler.load_cache_artifacts``, its load in the compile), its status, and the
    #: cache's size; None where the cold run saved none (nothing compiled).
    portable_compile_s: Optional[float] = None
    portable_first_step_s: Optional[float] = None
    portable_cache_mb: Optional[float] = None
    portable_status: Optional[str] = None
    wall_s: Optional[float] = None
    # Each round's median step seconds; with --rounds > 1 also each round's samples (step_s
    # pools them), compile and first-step seconds (round 1's are the cold ones).
    rounds: Optional[list[Optional[float]]] = None
    round_samples: Optional[list[list[float]]] = None
    # Warm pairs: each round's eager steps paired with round_samples' (step pair i is the i-th of
    # each); None for eager itself and for rows measured without pairs (--nproc).
    round_eager_samples: Optional[list[list[float]]] = None
    #: Warm pairs: the steady-state peaks of the eager process round 1's cell was paired with (the
    #: same phase of the same kind of process, started beside it): what ``memory_vs_eager`` divides by.
    eager_peak_rss_steady_mb: Optional[float] = None
    eager_cuda_peak_allocated_steady_mb: Optional[float] = None
    eager_cuda_peak_reserved_steady_mb: Optional[float] = None
    round_compile_s: Optional[list[Optional[float]]] = None
    round_first_step_s: Optional[list[Optional[float]]] = None
    # Derived (stats.derive), every speed figure from the speedup: step_time_s is eager's paired
    # step / speedup_vs_eager (its interval step_time_ci), images_per_s throughput per second in the
    # workload's throughput unit (config.workload.throughput_unit: images for the CNNs, tokens for
    # the transformer) at that step time.
    step_time_s: Optional[float] = None
    step_time_ci: Optional[list[float]] = None
    images_per_s: Optional[float] = None
    speedup_vs_eager: Optional[float] = None
    speedup_ci: Optional[list[float]] = None
    #: Paired rows: whether the interval's half-width is within the run's ``--target``.
    target_reached: Optional[bool] = None
    warm_compile_s: Optional[float] = None
    warm_first_step_s: Optional[float] = None
    #: What the backend costs once beyond eager (compile, first step, warm-up), 0 within a step's noise.
    up_front_s: Optional[float] = None
    break_even_steps: Optional[int] = None
    #: ``[low, high]`` from the speedup's interval; ``high`` None: never (the interval reaches 1).
    break_even_ci: Optional[list[Optional[int]]] = None
    achieved_gflops: Optional[float] = None
    pct_of_peak: Optional[float] = None
    memory_vs_eager: Optional[float] = None
    # Inference only: batch latency percentiles over every measured step of every round.
    latency_p50_s: Optional[float] = None
    latency_p90_s: Optional[float] = None
    latency_p99_s: Optional[float] = None
    #: The run's training loop projected from the row's rehearsal (``stats.LoopFigures``).
    loop: Optional[stats.LoopFigures] = None

    @classmethod
    def from_record(cls, record: CellRecord, **row: Any) -> "CellResult":
        """The row for ``record``; ``row`` holds what the parent knows (backend, device, ...)."""
        samples = record.step_samples
        return cls(**record.measured(), step_s=StepStats.from_samples(samples) if samples else None, **row)

    def add_round(self, later: Optional["CellResult"], k: int) -> None:
        """Fold round ``k`` into this row: its samples and median (paired with eager's where it was
        paired), its warm compile times. A round that failed leaves a note and an empty round (the
        row keeps round 1's status); ``later`` None: the row sat the round out, an empty round too.
        Either way round ``k`` stays the ``k``-th everywhere, so it still pairs with eager's round ``k``."""
        assert self.step_s is not None
        ran = later if later is not None and later.status == Status.OK and later.step_s is not None else None
        if later is not None and ran is None:
            self.notes.append(f"round {k}: {later.status.value}" + (f" ({later.error})" if later.error else ""))
        samples = ran.step_s.samples if ran is not None and ran.step_s is not None else []
        self.round_samples = (self.round_samples or [self.step_s.samples]) + [samples]
        self.rounds = [statistics.median(s) if s else None for s in self.round_samples]
        if self.round_eager_samples is not None:
            paired = ran.round_eager_samples[0] if ran and ran.round_eager_samples else []
            self.round_eager_samples = self.round_eager_samples + [paired]
        if ran is None:
            return
        self.step_s = StepStats.from_samples([s for samples in self.round_samples for s in samples])
        self.round_compile_s = (self.round_compile_s or [self.compile_s]) + [ran.compile_s]
        self.round_first_step_s = (self.round_first_step_s or [self.first_step_s]) + [ran.first_step_s]
        self.wall_s = (self.wall_s or 0.0) + (ran.wall_s or 0.0)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["status"] = self.status.value
        # Which row it is first, for whoever reads the JSON.
        return {"backend": data.pop("backend"), "device": data.pop("device"), "status": data.pop("status"), **data}


@dataclass
class RoundInfo:
    """One round on one device: the order its backends ran in (shuffled, seeded), the drift
    sentinel's seconds at its start (``run/sentinel.py``) and the run's seconds when it ended."""

    order: list[str]
    sentinel_s: Optional[float] = None
    ended_s: Optional[float] = None


@dataclass
class RunReport:
    """A whole run: what was measured where, and every cell's result.

    ``round_log`` holds each device's rounds; ``verdicts`` (derived, written as
    the JSON's ``verdict``) which backend each device's figures pick."""

    environment: dict[str, Any]
    config: RunConfig
    results: list[CellResult] = field(default_factory=list)
    plugins: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started_at: Optional[str] = None
    finished_at: Optional[str] = None
    interrupted: bool = False
    round_log: dict[str, list[RoundInfo]] = field(default_factory=dict)
    #: The seed of every round's order and of the order inside each step pair (drawn per run
    #: unless ``--order-seed``; None in reports from before it was recorded).
    order_seed: Optional[int] = None
    #: Per device, how the run got its parity reference: computed, or reused from the cache.
    references: dict[str, ReferenceInfo] = field(default_factory=dict)
    schema_version: int = SCHEMA_VERSION
    verdicts: dict[str, stats.Verdict] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._derive()

    def add(self, result: CellResult, first: bool = False) -> None:
        """Add a row: after the others, or (``first``) before its device's other rows, where a plan
        puts eager when its row joins last (warm pairs: it serves until its round ends)."""
        at = next((i for i, r in enumerate(self.results) if r.device == result.device), len(self.results))
        self.results.insert(at if first else len(self.results), result)
        self._derive()

    def fold(self, result: CellResult, k: int) -> None:
        """Round ``k``'s ``result``: a new row in round 1 (eager's before its device's others, where
        the plan puts it), the next round of its row after that."""
        if k == 1:
            result.rounds = [result.step_s.median] if result.step_s else None
            self.add(result, first=result.backend == "eager")
            return
        row = self.row(result.backend, result.device)
        assert row is not None, f"round {k} of {result.backend} on {result.device} without its row"
        row.add_round(result, k)
        self._derive()

    def end_round(self, device: str, k: int) -> None:
        """Round ``k`` on ``device`` is over: the ``ok`` rows that sat it out keep its place (an empty
        round), so that round ``k`` is the ``k``-th of every row."""
        for row in self.rows(device):
            if row.status == Status.OK and len(row.rounds or []) < k:
                row.add_round(None, k)
        self._derive()

    def row(self, backend: str, device: str) -> Optional[CellResult]:
        return next((r for r in self.results if (r.backend, r.device) == (backend, device)), None)

    def rederive(self) -> None:
        """Derive again after a row changed in place (a later round joined it)."""
        self._derive()

    def _derive(self) -> None:
        # One timed training step is one optimizer step: every micro-batch of its recipe counts.
        config = self.config
        stats.derive(self.results, config.batch_size * config.micro_batches * config.workload.units_per_sample,
                     latency=config.mode == "inference", target_pct=config.target, loop=config.workload.loop,
                     batch_size=config.batch_size)
        self.verdicts = {device: stats.verdict(device, self.rows(device), self.config.rounds) for device in self.devices()}

    def devices(self) -> list[str]:
        return list(dict.fromkeys(r.device for r in self.results))

    def rows(self, device: str) -> list[CellResult]:
        return [r for r in self.results if r.device == device]

    def to_dict(self) -> dict:
        data = asdict(self)
        data.pop("verdicts")
        data["config"] = self.config.to_dict()
        data["results"] = [r.to_dict() for r in self.results]
        data["verdict"] = {device: v.to_dict() for device, v in self.verdicts.items()}
        return finite(data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, allow_nan=False) + "\n"

    @classmethod
    def from_dict(cls, data: dict) -> "RunReport":
        if data.get("schema_version") not in range(1, SCHEMA_VERSION + 1):
            raise ValueError(f"unsupported schema_version {data.get('schema_version')!r} (expected {SCHEMA_VERSION})")
        data = _upgrade(dict(data))
        config = RunConfig.from_dict(data.pop("config"))
        results = [from_data(CellResult, r) for r in data.pop("results", [])]
        round_log = {device: [from_data(RoundInfo, r) for r in rounds]
                     for device, rounds in data.pop("round_log", {}).items()}
        references = {device: from_data(ReferenceInfo, r) for device, r in data.pop("references", {}).items()}
        return cls(**{k: v for k, v in data.items() if k in _REPORT_KEYS}, config=config, results=results,
                   round_log=round_log, references=references)

    @classmethod
    def from_json(cls, text: str) -> "RunReport":
        return cls.from_dict(json.loads(text))


def _upgrade(data: dict) -> dict:
    """An older report as the current version. Version 1: its parity (first step, absolute RMSE)
    keeps its verdict and group errors, with no margin (the renderers then show the largest
    relative error). Version 3 adds keys, which load as null, and changes two: ``compile_threads``
    was the run's setting and is now what each cell found (rows where dynamo never ran lose it), and
    ``peak_rss_steady_mb`` is now the measured steps' peak alone (older ones are dropped)."""
    if data.get("schema_version") == 1:
        for row in data.get("results", []):
            if row.get("parity"):
                row["parity"] = {k: v for k, v in row["parity"].items() if k != "worst_rmse"}
                row["parity"]["worst_limit"] = None  # an RMSE limit, not comparable with a relative error
    if data.get("schema_version") in (1, 2):
        for row in data.get("results", []):
            if not row.get("dynamo"):
                row["compile_threads"] = None
            # Its "steady" peak spanned the warm-up steps too: not the measured steps' peak that
            # version 3 compares, so memory vs eager stays on the lifetime peaks, as it was.
            row["peak_rss_steady_mb"] = None
    for row in data.get("results", []):  # derived figures are derived again on loading
        row.pop("memory_ratio_vs_eager", None)
    data["schema_version"] = SCHEMA_VERSION
    return data


_REPORT_KEYS = ("environment", "plugins", "notes", "started_at", "finished_at", "interrupted", "order_seed",
                "schema_version")


def differences(base: RunReport, new: RunReport) -> list[str]:
    """Why two runs' cells are not comparable: every change in the machine, the software or the
    workload (batch, steps, ``--malloc``, ...). Empty when they are. ``--resume`` refuses a
    run with any; ``compare`` lists them above its table."""
    changes = [f"{k}: {base.environment.get(k)!r} → {new.environment.get(k)!r}"
               for k in COMPARABLE_ENVIRONMENT if base.environment.get(k) != new.environment.get(k)]
    old, now = base.config.comparable(), new.config.comparable()
    return changes + [f"{k}: {old.get(k)!r} → {now.get(k)!r}" for k in dict.fromkeys([*old, *now])
                      if old.get(k) != now.get(k)]
