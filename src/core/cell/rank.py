"""A DDP rank's side of a ``--nproc`` cell (torchrun starts the ranks: ``run/torchrun.py``).

A ``--nproc N`` cell is one ``torch.distributed.run`` job (torchrun's own
launcher and rendezvous; nothing home-made). Each rank runs the ordinary
measurement (``measure.measure``) with a ``Rank``: it trains on its slice of
a global batch of ``N x --batch-size`` images (weak scaling), the backend
compiles the model and DDP wraps the result (the order the issue and
accelerate#4017 prescribe; DDP then sees a module whose gradients arrive
together). After the measured steps every rank's figures are gathered; a
node's local rank 0 writes the cell's row, the slowest rank's steps as the
row's steps, because a synchronous step is only as fast as its slowest rank.

Parity has two parts, both on global rank 0:
- every rank holds bit-identical weights after the first step (rank 0's are
  broadcast, every rank measures its distance, the maximum is reduced);
- those weights match a single-process reference of the same global batch.
  BatchNorm normalises each rank's slice with that slice's statistics (no
  SyncBatchNorm on CPU), so the reference runs each slice through the model
  and averages the gradients, which is what DDP computes.

A rank that fails writes its own result and exits non-zero; torchrun then
stops the other ranks and the parent reads the failing rank's reason.
"""
from __future__ import annotations

import datetime as _dt
import os
from dataclasses import dataclass, fields, replace
from typing import Any, Optional

from .. import stats
from ..records import CellRecord, DistributedFigures, Measured


@dataclass(frozen=True)
class Rank:
    """Where this process sits in the job (torchrun's environment variables)."""

    rank: int
    world: int
    local_rank: int
    local_world: int

    @classmethod
    def from_env(cls) -> Optional["Rank"]:
        """The rank torchrun started, or None outside torchrun."""
        if "TORCHELASTIC_RUN_ID" not in os.environ or "RANK" not in os.environ:
            return None
        env = os.environ
        return cls(int(env["RANK"]), int(env["WORLD_SIZE"]), int(env["LOCAL_RANK"]), int(env["LOCAL_WORLD_SIZE"]))

    @property
    def reports(self) -> bool:
        """Local rank 0 writes the node's row (so every node's parent gets one)."""
        return self.local_rank == 0


def rank_device(slot: str, rank: Rank) -> str:
    """One GPU per rank: ``cuda:k`` gives local rank r ``cuda:(k + r)``; the CPU is shared."""
    kind, _, index = slot.partition(":")
    if kind != "cuda":
        return slot
    return f"cuda:{int(index or 0) + rank.local_rank}"


def init(device: Any, timeout_s: float) -> str:
    """Join the job's process group: nccl on CUDA, gloo on the CPU. Returns the backend's name."""
    import torch.distributed as dist

    backend = "nccl" if device.type == "cuda" else "gloo"
    # A hung peer must end the collective before the parent's own timeout kills everything,
    # so the failing rank's reason, not only "timeout", can reach the report.
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=max(30.0, timeout_s)))
    return backend


def wrap(forward: Any, device: Any) -> Any:
    """DDP around what the backend compiled; gloo rejects ``device_ids``, so CPU passes none."""
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    if not isinstance(forward, nn.Module):
        raise DDPWrapError(f"the backend returned a {type(forward).__name__}, not an nn.Module; "
                           "DistributedDataParallel can only wrap a module")
    try:
        if device.type == "cuda":
            return DDP(forward, device_ids=[device.index], output_device=device.index)
        return DDP(forward)
    except Exception as exc:
        raise DDPWrapError(f"DistributedDataParallel can't wrap the compiled module: {type(exc).__name__}: {exc}") from exc


class DDPWrapError(RuntimeError):
    """The backend's compiled module can't run under DDP (reported as fail_compile)."""


def mean_losses(losses: list) -> list:
    """The global batch's loss at every step: the mean of the ranks' losses (equal slices), in one
    collective."""
    import torch
    import torch.distributed as dist

    total = torch.stack([loss.detach().float() for loss in losses])
    dist.all_reduce(total)
    return list(total / dist.get_world_size())


def weight_spread(params: list) -> float:
    """The largest |weight - rank 0's weight| on any rank (0.0: every rank holds the same weights).

    One parameter at a time, so the extra memory is one parameter, not the model.
    """
    import torch
    import torch.distributed as dist

    worst = torch.zeros((), dtype=torch.float64, device=params[0].device)
    for p in params:
        theirs = p.detach().clone()
        dist.broadcast(theirs, src=0)
        worst = torch.maximum(worst, (p.detach().double() - theirs.double()).abs().max())
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst.item())


def gather(record: CellRecord) -> list[CellRecord]:
    """Every rank's record, in rank order, on every rank."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, record)
    return out


def finish() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def combine(per_rank: list[CellRecord], rank: Rank, pg_backend: str, batch_size: int,
            weight_diff: float) -> CellRecord:
    """One row from every rank's record: the slowest rank's steps, the largest one-off costs
    and memory peaks, and the job's ``DistributedFigures`` (per-rank medians kept).
    ``weight_diff`` is ``weight_spread``'s answer after the first step."""
    medians = [stats.StepStats.from_samples(r.step_samples).median for r in per_rank]
    worst = stats.slowest(medians)

    def most(values: list[Optional[float]]) -> Optional[float]:
        known = [v for v in values if v is not None]
        return max(known) if known else None

    # The one-off costs and the memory figures (every *_mb field: baselines, peaks per phase,
    # compile workers') of the rank that needs the most.
    peaks: dict[str, Any] = {f.name: most([getattr(r, f.name) for r in per_rank])
                             for f in fields(Measured) if f.name.endswith("_mb")}
    return replace(
        per_rank[worst],
        compile_s=most([r.compile_s for r in per_rank]),
        first_step_s=most([r.first_step_s for r in per_rank]),
        **peaks,
        distributed=DistributedFigures(
            nproc=rank.world,
            nnodes=rank.world // rank.local_world,
            nproc_per_node=rank.local_world,
            process_group=pg_backend,
            batch_size_per_rank=batch_size,
            global_batch_size=batch_size * rank.world,
            threads_per_rank=per_rank[0].threads,
            rank_step_median_s=medians,
            slowest_rank=worst,
            slowest_rank_step_median_s=medians[worst],
            peak_rss_mb_per_rank=[r.peak_rss_mb for r in per_rank],
            ranks_identical=weight_diff == 0.0,
            max_rank_weight_diff=weight_diff,
        ),
    )
