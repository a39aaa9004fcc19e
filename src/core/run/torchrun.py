"""The parent's side of a ``--nproc`` cell: the torchrun command, and where DDP can't run.

A ``--nproc N`` cell is one ``python -m torch.distributed.run`` job
(torchrun's own launcher and rendezvous); each rank runs
``cnncompare.core.cell.main`` (see ``cell/rank.py`` for the ranks' side).
"""
from __future__ import annotations

import sys
from typing import Optional

from ..config import RunConfig
from .devices import cuda_count


def unavailable(slot: str, nproc: int) -> Optional[str]:
    """Why ``nproc`` ranks can't run on ``slot`` here (CUDA needs one GPU per rank), else None."""
    kind, _, index = slot.partition(":")
    if kind == "mps":
        return "DDP has no MPS process-group backend (gloo is CPU, nccl is CUDA)"
    if kind != "cuda":
        return None
    first, count = int(index or 0), cuda_count()
    if first + nproc > count:
        return f"--nproc {nproc} needs GPUs cuda:{first}..cuda:{first + nproc - 1}, this machine has {count}"
    return None


def launch_command(config: RunConfig, order_path: str, run_id: str) -> list[str]:
    """The torchrun command for one cell.

    One node: ``--standalone`` (a local rendezvous on a free port). Several:
    torchrun's c10d rendezvous at ``--rdzv-endpoint``; every node runs the same
    cells in the same order, so each cell's ``run_id`` meets its peers.
    """
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={config.nproc}",
           f"--nnodes={config.nnodes}", "--max-restarts=0", "--monitor-interval=0.2"]
    if config.rdzv_endpoint:
        cmd += [f"--node-rank={config.node_rank}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={config.rdzv_endpoint}", f"--rdzv-id={run_id}"]
    else:
        cmd += ["--standalone"]
    return cmd + ["-m", "cnncompare.core.cell.main", order_path]


def run_id(backend: str, device: str) -> str:
    """A rendezvous id every node derives alike for the same cell."""
    return "cnncompare-" + "".join(c if c.isalnum() else "-" for c in f"{backend}-{device}")
