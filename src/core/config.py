"""The run's configuration, validated on construction."""
from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields, replace
from typing import Optional


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

#: ``--malloc``: how the C allocator treats a cell's freed CPU memory (``memory.use_malloc``).
#: system: the C library's defaults, what a user's own script gets. reuse: glibc keeps freed
#: memory for the next allocation instead of handing it back to the kernel, so a step that frees
#: and re-allocates the same large buffers stops paying a page fault (a zeroed page from the
#: kernel) per 4 KiB of them; the effect of the jemalloc or tcmalloc preload PyTorch's CPU tuning
#: guide recommends, with nothing to install.
MALLOC_POLICIES = ("system", "reuse")


@dataclass(frozen=True)
class RunConfig:
    """What one run measures. Defaults are the seed study's (batch 128, 28x28, 20 steps).

    ``threads`` None means every core this process may use; it is resolved
    and recorded when the run starts.
    """

    backends: tuple[str, ...] = ("eager",)
    devices: tuple[str, ...] = ("cpu",)
    batch_size: int = 128
    image_size: int = 28
    in_channels: int = 3
    num_classes: int = 10
    lr: float = 1e-3
    steps: int = 20
    warmup: int = 3
    seed: int = 0
    threads: Optional[int] = None
    timeout_s: float = 600.0
    max_memory_mb: Optional[int] = None
    compile_cache: str = "cold"
    compile_threads: int = 1
    #: How the C allocator treats a cell's freed CPU memory: one of MALLOC_POLICIES.
    malloc: str = "system"
    #: None: one process per cell, no DDP. N: each cell is a torchrun job of N ranks per node
    #: under DistributedDataParallel (1 is DDP with one rank, e.g. to prove nccl on one GPU).
    nproc: Optional[int] = None
    nnodes: int = 1
    node_rank: int = 0
    rdzv_endpoint: Optional[str] = None

    def __post_init__(self) -> None:
        positive = {
            "--batch-size": self.batch_size,
            "--image-size": self.image_size,
            "--steps": self.steps,
            "in_channels": self.in_channels,
            "num_classes": self.num_classes,
        }
        for option, value in positive.items():
            _require_int(option, value, minimum=1)
        _require_int("--warmup", self.warmup, minimum=0)
        _require_int("--seed", self.seed, minimum=0)
        if self.threads is not None:
            _require_int("--threads", self.threads, minimum=1)
        if self.max_memory_mb is not None:
            _require_int("--max-memory", self.max_memory_mb, minimum=64)
        _require_int("--compile-threads", self.compile_threads, minimum=1)
        if self.compile_cache not in COMPILE_CACHE_MODES:
            raise ConfigError("--compile-cache", f"must be one of {', '.join(COMPILE_CACHE_MODES)}, got {self.compile_cache!r}")
        if self.malloc not in MALLOC_POLICIES:
            raise ConfigError("--malloc", f"must be one of {', '.join(MALLOC_POLICIES)}, got {self.malloc!r}")
        if not (isinstance(self.timeout_s, (int, float)) and math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ConfigError("--timeout", f"must be a positive number of seconds, got {self.timeout_s!r}")
        if isinstance(self.lr, bool) or not (isinstance(self.lr, (int, float)) and self.lr > 0):
            raise ConfigError("lr", f"must be a positive float, got {self.lr!r}")
        self._check_distributed()
        if not self.backends:
            raise ConfigError("--backends", "no backend selected")
        if not self.devices:
            raise ConfigError("--devices", "no device selected")

    def _check_distributed(self) -> None:
        if self.nproc is not None:
            _require_int("--nproc", self.nproc, minimum=1)
        _require_int("--nnodes", self.nnodes, minimum=1)
        _require_int("--node-rank", self.node_rank, minimum=0)
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

    @property
    def distributed(self) -> bool:
        return self.nproc is not None

    @property
    def world_size(self) -> int:
        return (self.nproc or 1) * self.nnodes

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
        data["threads"] = self.resolved_threads
        return data

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        known = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in known}
        kwargs["backends"] = tuple(kwargs.get("backends", ()))
        kwargs["devices"] = tuple(kwargs.get("devices", ()))
        return cls(**kwargs)

    def workload_key(self) -> dict:
        """What must match for two runs' cells to be comparable (used by --resume)."""
        return workload_key(self.to_dict())


#: Config keys that choose what runs, where, or how it is run, not what a cell measures.
_SELECTION_KEYS = ("backends", "devices", "timeout_s", "max_memory_mb", "node_rank", "rdzv_endpoint")


def workload_key(config: dict) -> dict:
    """The comparable part of a recorded config (a report's ``config``), defaults filled in
    for keys older reports lack. Two runs with different keys measured different things."""
    defaults = {f.name: f.default for f in fields(RunConfig)}
    return {k: config.get(k, defaults[k]) for k in defaults if k not in _SELECTION_KEYS}


def _require_int(option: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(option, f"must be a whole number, got {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f"at least {minimum}"
        raise ConfigError(option, f"must be {what}, got {value}")
