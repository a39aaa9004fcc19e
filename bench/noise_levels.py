"""Where does a paired speedup's noise live: in the steps, in time, or in the processes?

    python bench/noise_levels.py                                   # eager against eager (A/A), default config
    python bench/noise_levels.py --backend eager-fused --processes 3 --pairs 24
    python bench/noise_levels.py --batch-size 8 --image-size 8 --processes 2 --pairs 8   # a smoke run

Starts ``--processes`` fresh pairs of cells (``eager`` and ``--backend``, children of the fork
server as in a run, both warm and serving), and interleaves ``--pairs`` step pairs in each, in a
random order inside each pair: the method ``cnncompare``'s rounds use (``run/pairs.py``), run
for longer. Each step pair gives a log ratio. The log ratios are then split by level, as an
analysis of variance does:

- steps: the scatter of step pairs around their block's mean (a block is ``--block`` step pairs
  in a row, as many as a round measures);
- time: how much more the blocks of one process pair scatter than their steps predict (the
  machine changing over tens of seconds, with the same two processes);
- processes: how much more the process pairs' means scatter than their blocks predict (each
  process's own speed).

A round of ``cnncompare`` is one block in a fresh process pair, so the noise of a round's mean
is ``steps**2 / block + time**2 + processes**2``; the report's interval is over rounds. Run it
alone on the machine. Writes ``bench/results/noise-levels-<backend>.json``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.run.environment import capture
from cnncompare.core.run.launch import SERVER, Child
from cnncompare.core.run.pairs import interleave
from cnncompare.plugins import load_registry


def one_process_pair(config: RunConfig, backend: str, pairs: int, rng: random.Random, where: str) -> list[float]:
    """``pairs`` step pairs of fresh ``eager`` and ``backend`` cells: log(eager / backend) per pair."""
    registry = load_registry(entry_points=False)
    workload = registry.workloads[config.workload.name]
    cells = [Child(registry.get(name), workload, "cpu", config, os.path.join(where, f"{i}-{name}"),
                   os.path.join(where, f"{i}-{name}-cache"), None, lambda *a: None, judge=False, serve=True)
             for i, name in enumerate(("eager", backend))]
    try:
        eager, other = (c.wait_ready() for c in cells)
        if eager is None or other is None:
            raise RuntimeError(f"a cell of the pair did not start (eager: {eager is not None}, {backend}: {other is not None})")
        other_s, eager_s = interleave(other, eager, pairs, rng, timeout_s=300)
        for c in cells:
            c.finish()
        return [math.log(e / b) for e, b in zip(eager_s, other_s)]
    finally:
        for c in cells:
            c.close()


def levels(processes: list[list[float]], block: int) -> dict:
    """The log ratios' standard deviation at each level (method of moments, floored at 0)."""
    blocks = [p[i:i + block] for p in processes for i in range(0, len(p) - block + 1, block)]
    steps_var = statistics.fmean(statistics.variance(b) for b in blocks)
    per_process = [[statistics.fmean(p[i:i + block]) for i in range(0, len(p) - block + 1, block)] for p in processes]
    blocks_var = statistics.fmean(statistics.variance(m) for m in per_process if len(m) > 1)
    time_var = max(0.0, blocks_var - steps_var / block)
    means = [statistics.fmean(m) for m in per_process]
    process_var = (max(0.0, statistics.variance(means) - blocks_var / statistics.fmean(len(m) for m in per_process))
                   if len(means) > 1 else float("nan"))
    round_sd = math.sqrt(steps_var / block + time_var + (process_var if process_var == process_var else 0.0))
    return {"steps_sd": math.sqrt(steps_var), "time_sd": math.sqrt(time_var), "process_sd": math.sqrt(process_var),
            "round_mean_sd": round_sd, "process_pair_speedups": [math.exp(m) for m in means],
            "speedup": math.exp(statistics.fmean(x for p in processes for x in p))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="eager", help="paired with eager (default eager: the A/A check)")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--processes", type=int, default=3, help="fresh process pairs")
    p.add_argument("--pairs", type=int, default=24, help="step pairs per process pair")
    p.add_argument("--block", type=int, default=4, help="step pairs per block (a round's, by default)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    if args.pairs < 2 * args.block:
        p.error("--pairs must be at least twice --block")
    config = RunConfig(batch_size=args.batch_size, workload=WorkloadSpec("seed-cnn", {"image_size": args.image_size}, "image"),
                       steps=args.pairs, seed=args.seed)
    rng = random.Random(f"noise:{args.backend}:{args.seed}")
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as where:
            measured = [one_process_pair(config, args.backend, args.pairs, rng, os.path.join(where, f"pair{k}"))
                        for k in range(args.processes)]
    finally:
        SERVER.close()
    found = levels(measured, args.block)
    print(f"eager / {args.backend}: {args.processes} process pairs x {args.pairs} step pairs, blocks of {args.block} "
          f"(batch {args.batch_size}, {args.image_size}x{args.image_size}; {time.perf_counter() - start:.0f} s)\n")
    print("| level | SD of log ratio |\n|---|---|")
    for key in ("steps_sd", "time_sd", "process_sd", "round_mean_sd"):
        print(f"| {key.removesuffix('_sd').replace('_', ' ')} | {found[key]:.3f} |")
    print(f"\nspeedup {found['speedup']:.3f}; per process pair: "
          + ", ".join(f"{s:.3f}" for s in found["process_pair_speedups"]))
    path = args.json or Path(__file__).parent / "results" / f"noise-levels-{args.backend}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": capture(config.resolved_threads), "args": vars(args) | {"json": str(path)},
                                "levels": found, "log_ratios": measured}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
