"""The run's configuration: every option's default, flag, help and bounds, stated once.

``RunConfig`` validates itself on construction; the command line is built
from its fields (``cli.build_parser`` reads the ``metadata`` below), so a
default or a bound is written here and nowhere else.
"""
from __future__ import annotations

import math
import os
import platform
import sys
from dataclasses import Field, asdict, dataclass, field, fields, replace
from typing import Any, Mapping, Optional

from ..backends.base import default_optimizer
from .codec import from_data


class ConfigError(ValueError):
    """An invalid configuration value; ``option`` names the CLI flag."""

    def __init__(self, option: str, message: str):
        super().__init__(f"{option}: {message}")
        self.option = option


def available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


#: cold: each cell compiles with an empty cache. warm: each cell runs twice sharing one cache;
#: the second (warm) run's figures are reported, with the cold compile times beside them.
COMPILE_CACHE_MODES = ("cold", "warm")

#: ``--malloc``: how the C allocator treats a cell's freed CPU memory (``cell/memory.use_malloc``).
#: system: the C library's defaults, what a user's own script gets. reuse: glibc keeps freed
#: memory for the next allocation instead of handing it back to the kernel, so a step that frees
#: and re-allocates the same large buffers stops paying a page fault (a zeroed page from the
#: kernel) per 4 KiB of them; the effect of the jemalloc or tcmalloc preload PyTorch's CPU tuning
#: guide recommends, with nothing to install.
MALLOC_POLICIES = ("system", "reuse")

#: ``--fork-server``: how often the cells' fork server (``run/forkserver.py``) starts afresh. Every
#: child forked from one server has its address-space layout (ASLR), and a layout moves a small
#: step's time by a few per cent, differently for different code (docs/verdicts.md, "One layout
#: per run"). per-round: a new server each round, so a row's rounds each draw a layout and the
#: interval over rounds covers it. per-run: one for the run (a server start, about 4 s here, less
#: per round), every round in one layout: an effect the interval can't see.
FORK_SERVER_MODES = ("per-round", "per-run")

DEFAULT_WORKLOAD = "seed-cnn"

#: ``--mode``: what a cell times. train: forward, loss, backward, the workload's optimizer (the default step).
#: inference: one forward of the eval-mode model under inference_mode (docs/inference.md).
MODES = ("train", "inference")

#: Steps before parity's step, at least, whatever ``--warmup`` says: the parity step is then step
#: 3 or later, after Adam has state (step 2), after a CUDA-graph tree has recorded (step 2) and
#: replays, and after a step whose loss could only be right if step 2 trained (``cell/parity.py``).
PARITY_MIN_WARMUP = 2

#: Measured steps (step pairs with eager's) per cell and round when ``--steps`` is not given: in
#: training, rounds narrow the interval more than steps do (docs/verdicts.md), so a round is
#: short; a forward is cheap, and inference's latency percentiles need samples.
DEFAULT_STEPS = {"train": 4, "inference": 20}


def malloc_supported(policy: str) -> Optional[str]:
    """None if ``policy`` can be applied in this process's C library, else why not."""
    if policy == "system":
        return None
    if sys.platform != "linux" or platform.libc_ver()[0] != "glibc":
        return f"needs Linux with glibc (this is {sys.platform}, libc {platform.libc_ver()[0] or 'unknown'})"
    return None


def option(default: Any, flag: str, help: str, *, minimum: Optional[int] = None, choices: Optional[tuple] = None,
           metavar: Optional[str] = None, group: Optional[str] = None, shown_default: Optional[str] = None) -> Any:
    """A config field with its command-line flag. ``minimum``: a whole number at least that;
    ``choices``: one of them. The flag's type is the default's (int, float or str)."""
    return field(default=default, metadata={
        "flag": flag, "help": help, "minimum": minimum, "choices": choices, "metavar": metavar, "group": group,
        "shown_default": shown_default})


DISTRIBUTED = "distributed (each cell a torchrun job under DistributedDataParallel)"


@dataclass(frozen=True)
class RecipeInfo:
    """The workload's training recipe as the report names it (``workloads.base.Recipe`` holds the
    callables; this is what crosses to the parent and into the JSON). ``optimizer`` is the
    class with the hyperparameters it sets (``SGD(lr=0.1, momentum=0.9)``), "" for the
    harness's default, Adam at the config's ``lr``; ``scheduler`` the scheduler's class ("" for
    none)."""

    optimizer: str = ""
    scheduler: str = ""
    clip_grad_norm: Optional[float] = None
    accumulation_steps: int = 1

    def optimizer_at(self, lr: float) -> str:
        """The optimizer the step trains with: the recipe's, else the default Adam at ``lr``."""
        return self.optimizer or default_optimizer(lr)

    def describe(self, lr: float) -> str:
        """One line: ``SGD(lr=0.1, momentum=0.9), OneCycleLR every step, clip_grad_norm 1``."""
        parts = [self.optimizer_at(lr) + ("" if self.optimizer else " (the default)")]
        if self.scheduler:
            parts.append(f"{self.scheduler} every step")
        if self.clip_grad_norm is not None:
            parts.append(f"clip_grad_norm {self.clip_grad_norm:g}")
        if self.accumulation_steps > 1:
            parts.append(f"{self.accumulation_steps} micro-batches per step")
        return ", ".join(parts)


#: ``--loop`` keys (``LoopSpec``'s fields) with what each means, for the CLI's help and errors.
LOOP_KEYS = {
    "epoch_steps": "optimizer steps per epoch, the last one included",
    "last_batch": "samples (per micro-batch) in an epoch's last step; default: a full --batch-size",
    "eval_every": "steps between evaluations, counted across epochs; 0: no evaluation",
    "eval_steps": "batches (of --batch-size) per evaluation",
    "epochs": "epochs in the loop",
}


@dataclass(frozen=True)
class LoopSpec:
    """The training loop a row's ``loop`` figures project (``--loop KEY=VALUE``, over the
    workload's own declaration, over these defaults): ``epochs`` of ``epoch_steps`` optimizer
    steps, the last of each epoch with ``last_batch`` samples per micro-batch (None: a full
    batch), and an evaluation of ``eval_steps`` batches, in eval mode without gradients, after
    every ``eval_every`` steps (0: none). Inference's loop is ``epochs`` x ``epoch_steps``
    forwards, the last of each epoch ``last_batch`` long; it has no evaluation."""

    epoch_steps: int = 1000
    last_batch: Optional[int] = None
    eval_every: int = 0
    eval_steps: int = 10
    epochs: int = 1

    #: Above this many steps the projection (which walks the loop step by step) refuses.
    MAX_STEPS = 10_000_000

    @classmethod
    def of(cls, values: Mapping[str, Any], owner: str) -> "LoopSpec":
        """The loop from ``values`` (a subset of ``LOOP_KEYS``), checked; a ``ValueError`` naming
        ``owner`` (``--loop``, the workload) and the key on a bad one."""
        unknown = sorted(set(values) - set(LOOP_KEYS))
        if unknown:
            raise ValueError(f"{owner}: unknown key {unknown[0]!r}; the keys are {', '.join(LOOP_KEYS)}")
        for key, value in values.items():
            if value is None and key == "last_batch":
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{owner}: {key} must be a whole number, got {value!r}")
            if value < (0 if key == "eval_every" else 1):
                raise ValueError(f"{owner}: {key} must be at least {0 if key == 'eval_every' else 1}, got {value}")
        loop = cls(**values)
        if loop.epochs * loop.epoch_steps > cls.MAX_STEPS:
            raise ValueError(f"{owner}: {loop.epochs} epochs of {loop.epoch_steps} steps is over {cls.MAX_STEPS:,} steps")
        return loop

    def ragged(self, batch_size: int) -> bool:
        """Whether each epoch ends on a smaller batch."""
        return self.last_batch is not None and self.last_batch != batch_size

    def describe(self, batch_size: int, inference: bool = False) -> str:
        """One line: ``2 epochs of 50 steps, the last of 12 samples; an evaluation of 5 batches every 20 steps``."""
        unit = "forwards" if inference else "steps"
        text = f"{self.epochs} epoch{'s' if self.epochs > 1 else ''} of {self.epoch_steps} {unit}"
        if self.ragged(batch_size):
            text += f", the last of {self.last_batch} samples"
        if self.eval_every and not inference:
            text += f"; an evaluation of {self.eval_steps} batches every {self.eval_every} steps"
        return text


@dataclass(frozen=True)
class WorkloadSpec:
    """Which workload a run trains, with every option's value (defaults filled in when the
    workload is resolved, ``workloads.base.resolve_options``), the unit of one sample, what
    throughput counts: ``units_per_sample`` of ``throughput_unit`` per sample (tokens per
    sequence; 1 and the sample unit itself for most workloads), its training recipe and the loop
    its ``loop`` figures project."""

    name: str = DEFAULT_WORKLOAD
    options: Mapping[str, Any] = field(default_factory=dict)
    sample_unit: str = "sample"
    throughput_unit: str = ""
    units_per_sample: int = 1
    recipe: RecipeInfo = RecipeInfo()
    loop: LoopSpec = LoopSpec()

    @property
    def unit(self) -> str:
        """What throughput counts (singular)."""
        return self.throughput_unit or self.sample_unit


@dataclass(frozen=True)
class RunConfig:
    """What one run measures. Defaults are the default workload's (training, batch 128, 28x28), measured
    in warm interleaved pairs with eager: at least 2 rounds of 4 step pairs per backend, then
    more for the rows still contending for the pick until it is decided (or, with ``target``,
    for every row wider than ``target`` %) while ``budget_s`` allows (docs/verdicts.md).

    ``backends`` and ``devices`` are resolved names (the CLI expands ``all``
    and patterns); ``threads`` None means every core this process may use,
    resolved and recorded when the run starts.
    """

    backends: tuple[str, ...] = ("eager",)
    devices: tuple[str, ...] = ("cpu",)
    workload: WorkloadSpec = WorkloadSpec()
    #: ``--backend-option NAME:KEY=VALUE``: per backend, the options its ``configure`` takes
    #: (e.g. ``torch.compile``'s ``options`` for a ``dynamo:*`` backend). Part of what is measured.
    backend_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    mode: str = option("train", "--mode", "train: forward, loss, backward and the workload's optimizer per step; inference: one "
                       "forward of the eval-mode model under inference_mode, with latency percentiles",
                       choices=MODES)
    batch_size: int = option(128, "--batch-size", "samples per step", minimum=1)
    lr: float = 1e-3
    #: None: the mode's default (``DEFAULT_STEPS``), resolved on construction.
    steps: int = option(None, "--steps", "measured steps per cell and round: step pairs with eager's, in a pair", minimum=1,
                        shown_default="4 in training, 20 in inference", metavar="N")
    warmup: int = option(3, "--warmup", "warm-up steps; at least 2 run (parity judges step 3), a backend may ask "
                         "for more", minimum=0, metavar="N")
    rounds: int = option(
        2, "--rounds", "process pairs at least per backend: in each round each backend's process, once warm, is "
        "paired with a fresh eager process warmed up as long, the parent alternating their steps; round 1's cells "
        "are the cold ones (compile, memory, parity), later rounds reuse each cell's compile cache", minimum=1,
        metavar="N")
    #: None: rounds go to the rows still contending for the pick until it is decided
    #: (``run/policy.py``); a number: to every row whose interval is wider than it.
    target: Optional[float] = option(
        None, "--target", "every row precise instead of a decided pick: after --rounds (from 2), keep adding rounds "
        "for the backends whose speedup's 95 %% interval is wider than this half-width, in %% of the speedup, "
        "while --budget allows", metavar="PCT",
        shown_default="off: rounds go to the rows still contending for the pick, and the run stops once it is decided")
    budget_s: float = option(
        540.0, "--budget", "seconds the run may take before it stops adding rounds (the first --rounds always "
        "run); a run whose pick is decided stops before", metavar="SECONDS")
    round_s: float = option(
        0.5, "--round-time", "seconds of eager's steps a round's step pairs cover at least: with fast steps a round "
        "takes more pairs than --steps (up to 1000), alternated a chunk of about 50 ms at a time; 0: --steps pairs",
        metavar="SECONDS")
    seed: int = option(0, "--seed", "seed for weights and data", minimum=0, metavar="N")
    threads: Optional[int] = option(None, "--threads", "torch CPU threads", minimum=1,
                                    shown_default="every available core", metavar="N")
    timeout_s: float = option(600.0, "--timeout", "seconds per cell before its processes are killed", metavar="SECONDS")
    max_memory_mb: Optional[int] = option(
        None, "--max-memory", "kill a cell whose processes exceed this RSS, reported as oom", minimum=64,
        metavar="MB", shown_default="no cap")
    compile_cache: str = option(
        "cold", "--compile-cache", "cold: every cell compiles from an empty cache; warm: each cell runs twice "
        "sharing its cache, reporting the warm run with the cold compile times beside it, and a third time from "
        "an empty cache loaded with the cold run's portable cache (torch.compiler.save_cache_artifacts)",
        choices=COMPILE_CACHE_MODES)
    compile_threads: Optional[int] = option(
        None, "--compile-threads", "inductor compile workers (TORCHINDUCTOR_COMPILE_THREADS); 1 compiles "
        "in-process. Workers are processes of their own: their peak RSS is reported beside the cell's", minimum=1,
        shown_default="torch's own (from this machine's cores), recorded per row", metavar="N")
    malloc: str = option(
        "system", "--malloc", "system: the C library's allocator as your own script gets it; reuse (glibc): freed "
        "CPU memory is kept for the next step instead of returned to the kernel, so large tensors stop paying "
        "page faults every step", choices=MALLOC_POLICIES)
    fork_server: str = option(
        "per-round", "--fork-server", "per-round: each round's cells are forked from a new fork server, a new "
        "address-space layout, so the speedup's interval covers what the layout does to a row's step; per-run: one "
        "server for the run (one layout for every round: about 4 s less per round here, and an interval that can't see "
        "the layout)", choices=FORK_SERVER_MODES)
    #: Reuse the parity reference an earlier run cached (``run/reference_cache.py``); ``--no-cache``
    #: turns it off. It changes nothing a cell measures.
    reference_cache: bool = True
    #: None: one process per cell, no DDP. N: each cell is a torchrun job of N ranks per node
    #: under DistributedDataParallel (1 is DDP with one rank, e.g. to prove nccl on one GPU).
    nproc: Optional[int] = option(
        None, "--nproc", "ranks per node: gloo on the CPU, nccl on CUDA (one GPU per rank); batch size is per "
        "rank (weak scaling); CPU threads per rank = cores / N unless --threads", minimum=1, metavar="N",
        group=DISTRIBUTED, shown_default="one process, no DDP")
    nnodes: int = option(1, "--nnodes", "nodes in the job; run the same command on each with its --node-rank",
                         minimum=1, group=DISTRIBUTED, metavar="N")
    node_rank: int = option(0, "--node-rank", "this node's rank", minimum=0, group=DISTRIBUTED, metavar="R")
    rdzv_endpoint: Optional[str] = option(
        None, "--rdzv-endpoint", "torchrun's c10d rendezvous, the same on every node", metavar="HOST:PORT",
        group=DISTRIBUTED, shown_default="--standalone on one node")

    def __post_init__(self) -> None:
        if self.steps is None and self.mode in MODES:
            object.__setattr__(self, "steps", DEFAULT_STEPS[self.mode])
        for f in flagged_fields():
            if f.metadata["minimum"] is not None and getattr(self, f.name) is not None:
                _require_int(f.metadata["flag"], getattr(self, f.name), f.metadata["minimum"])
            if f.metadata["choices"] and getattr(self, f.name) not in f.metadata["choices"]:
                raise ConfigError(f.metadata["flag"], f"must be one of {', '.join(f.metadata['choices'])}, "
                                  f"got {getattr(self, f.name)!r}")
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError("--timeout", f"must be a positive number of seconds, got {self.timeout_s!r}")
        for flag, value in (("--target", self.target), ("--budget", self.budget_s)):
            if flag == "--target" and value is None:
                continue
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(flag, f"must be a positive number, got {value!r}")
        if isinstance(self.round_s, bool) or not (isinstance(self.round_s, (int, float)) and 0 <= self.round_s < math.inf):
            raise ConfigError("--round-time", f"must be a number of seconds >= 0, got {self.round_s!r}")
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ConfigError("lr", f"must be a positive float, got {self.lr!r}")
        self._check_distributed()
        last = self.workload.loop.last_batch
        if last is not None and last > self.batch_size:
            raise ConfigError("--loop", f"last_batch {last} is more than --batch-size {self.batch_size}: an epoch's last "
                              f"batch holds what is left of it (give --loop last_batch=N, N <= {self.batch_size})")
        if not self.backends:
            raise ConfigError("--backends", "no backend selected")
        if not self.devices:
            raise ConfigError("--devices", "no device selected")

    def _check_distributed(self) -> None:
        if self.nproc is not None and self.mode != "train":
            raise ConfigError("--nproc", f"DistributedDataParallel is a training technique; --mode {self.mode} "
                              "runs one process per cell")
        if self.node_rank >= self.nnodes:
            raise ConfigError("--node-rank", f"must be below --nnodes {self.nnodes}, got {self.node_rank}")
        if self.nnodes > 1 and self.nproc is None:
            raise ConfigError("--nnodes", "needs --nproc (ranks per node)")
        if self.nnodes > 1 and not self.rdzv_endpoint:
            raise ConfigError("--nnodes", "several nodes need --rdzv-endpoint HOST:PORT (the same on every node)")
        if self.rdzv_endpoint is not None:
            if self.nproc is None:
                raise ConfigError("--rdzv-endpoint", "needs --nproc")
            host, _, port = self.rdzv_endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ConfigError("--rdzv-endpoint", f"expected HOST:PORT, got {self.rdzv_endpoint!r}")

    def check_here(self) -> None:
        """What only this machine can refuse (the values themselves were checked on construction)."""
        if why_not := malloc_supported(self.malloc):
            raise ConfigError("--malloc", f"{self.malloc}: {why_not}")

    @property
    def distributed(self) -> bool:
        return self.nproc is not None

    @property
    def micro_batches(self) -> int:
        """Micro-batches of ``batch_size`` one timed step runs: the recipe's accumulation in
        training, one forward in inference."""
        return 1 if self.mode == "inference" else self.workload.recipe.accumulation_steps

    @property
    def resolved_threads(self) -> int:
        """Torch threads per process: --threads, else every core, divided among this node's ranks."""
        if self.threads is not None:
            return self.threads
        return max(1, available_cores() // (self.nproc or 1))

    def single_process(self) -> "RunConfig":
        """This run as one process with one rank's share: its threads and its batch.

        Scaling efficiency divides by this throughput, so the ranks and the
        single process get the same resources each (weak scaling)."""
        return replace(self, nproc=None, nnodes=1, node_rank=0, rdzv_endpoint=None, threads=self.resolved_threads)

    def to_dict(self) -> dict:
        data = asdict(self)
        data["backends"] = list(self.backends)
        data["devices"] = list(self.devices)
        data["workload"]["options"] = dict(self.workload.options)
        data["backend_options"] = {name: dict(options) for name, options in self.backend_options.items()}
        data["threads"] = self.resolved_threads
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        """A recorded config; reports from before workloads (image size etc. at the top level)
        are read as seed-cnn's options, and from before ``--rounds`` as one round."""
        data = dict(data)
        data.setdefault("rounds", 1)
        data.setdefault("target", 3.0)  # reports from before warm pairs, which had no target
        data.setdefault("budget_s", 540.0)
        data.setdefault("round_s", 0.0)  # and before rounds grew for fast steps: --steps pairs
        data.setdefault("mode", "train")  # reports from before --mode
        data.setdefault("backend_options", {})  # and before --backend-option
        data.setdefault("fork_server", "per-run")  # and before --fork-server: one server per run
        if "workload" not in data:
            data["workload"] = {"name": DEFAULT_WORKLOAD, "sample_unit": "image",
                                "options": {k: data.pop(k) for k in ("image_size", "in_channels", "num_classes")
                                            if k in data}}
        data["backends"] = tuple(data.get("backends", ()))
        data["devices"] = tuple(data.get("devices", ()))
        return from_data(cls, data)

    def comparable(self) -> dict[str, Any]:
        """What must match for two runs' cells to be comparable: every field but those that
        choose what runs, where, or how it is supervised."""
        data = self.to_dict()
        for key in ("sample_unit", "throughput_unit"):
            data["workload"].pop(key)
        return {k: v for k, v in data.items() if k not in _SELECTION_KEYS}


#: Config keys that choose what runs, where, or how it is supervised, not what a cell measures.
_SELECTION_KEYS = ("backends", "devices", "timeout_s", "max_memory_mb", "node_rank", "rdzv_endpoint", "target",
                   "budget_s", "reference_cache", "fork_server")


def flagged_fields() -> list[Field]:
    """The config fields that have a command-line flag, in declaration order."""
    return [f for f in fields(RunConfig) if "flag" in f.metadata]


def _require_int(option: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(option, f"must be a whole number, got {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f"at least {minimum}"
        raise ConfigError(option, f"must be {what}, got {value}")
