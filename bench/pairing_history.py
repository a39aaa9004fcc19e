"""Where the A/A bias came from: one eager process shared by a round's cells, against a fresh one per cell.

    python bench/pairing_history.py --rounds 14                       # the tiny config (a ~40 ms step)
    python bench/pairing_history.py --rounds 6 --batch-size 128 --image-size 28 --warmup 3

Each round measures eager against eager (A/A) two ways, in a shuffled order:

- shared: one eager process, started first and warm, paired in turn with two fresh eager
  processes (positions 1 and 2), as the rounds were measured before: the shared process has
  served one cell's pairs by the time the second cell's pairs start;
- twins: each of two fresh eager processes, once warm, paired with a fresh eager process started
  for it and warmed up as long, as the rounds are measured now.

For each, the mean over rounds of the pairs' mean log ratio (shared or twin process ÷ the cell:
below 0 means the cell measured slower), with its 95 % t-interval, and each pairing's step medians
in blocks of a third of its pairs (``--trace``): whether one side speeds up as it serves. Writes
``bench/results/pairing-history-<batch>.json``. Run it alone on the machine.
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
from cnncompare.core.run.pairs import interleave, round_size
from cnncompare.plugins import load_registry


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=14)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--image-size", type=int, default=8)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--trace", action="store_true", help="print each pairing's step medians, block by block")
    args = p.parse_args()
    config = RunConfig(batch_size=args.batch_size, workload=WorkloadSpec("seed-cnn", {"image_size": args.image_size}, "image"),
                       steps=4, warmup=args.warmup, seed=0)
    registry = load_registry(entry_points=False)
    workload, eager = registry.workloads["seed-cnn"], registry.get("eager")
    rng = random.Random(args.seed)
    results: dict[str, list[float]] = {}
    traces: list[dict] = []

    def child(where: str, name: str) -> Child:
        return Child(eager, workload, "cpu", config, os.path.join(where, name), os.path.join(where, name + "-cache"),
                     None, lambda *a: None, judge=False, serve=True)

    def pair(key: str, reference, cell, pairs: int, chunk: int) -> None:
        """``pairs`` step pairs; log(reference / cell) averaged, kept under ``key``."""
        mine, theirs = interleave(cell, reference, pairs, rng, 300, chunk)
        results.setdefault(key, []).append(statistics.fmean(math.log(e / b) for e, b in zip(theirs, mine)))
        third = max(1, pairs // 3)
        blocks = [(statistics.median(theirs[i:i + third]), statistics.median(mine[i:i + third]))
                  for i in range(0, third * 3, third)]
        traces.append({"key": key, "blocks_s": blocks})
        if args.trace:
            print(f"  {key}: {results[key][-1]:+.3f}; reference / cell ms per block: "
                  + ", ".join(f"{a * 1e3:.1f}/{b * 1e3:.1f}" for a, b in blocks), file=sys.stderr)

    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as where:
            probe = child(where, "probe")
            peer = probe.wait_ready()
            assert peer is not None
            step_s = statistics.median(peer.steps(5, 300))
            probe.finish()
            pairs, chunk = round_size(step_s, config.steps, 2.0)
            for k in range(args.rounds):
                ways = ["shared", "twins"]
                rng.shuffle(ways)
                for way in ways:
                    with tempfile.TemporaryDirectory() as round_dir:
                        if way == "shared":
                            shared = child(round_dir, "shared")
                            reference = shared.wait_ready()
                            for position in (1, 2):
                                cell = child(round_dir, f"cell{position}")
                                pair(f"shared, position {position}", reference, cell.wait_ready(), pairs, chunk)
                                cell.finish()
                            shared.finish()
                        else:
                            for position in (1, 2):
                                cell = child(round_dir, f"cell{position}")
                                cell_peer = cell.wait_ready()
                                twin = child(round_dir, f"twin{position}")
                                pair(f"twins, position {position}", twin.wait_ready(), cell_peer, pairs, chunk)
                                cell.finish()
                                twin.finish()
                print(f"round {k + 1}/{args.rounds} ({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    finally:
        SERVER.close()
    print(f"eager against eager, batch {args.batch_size}, {args.image_size}x{args.image_size}: {args.rounds} rounds, "
          f"{pairs} step pairs each ({step_s * 1e3:.1f} ms a step), {time.perf_counter() - start:.0f} s\n")
    print("| pairing | mean log ratio (reference ÷ cell) | 95 % interval over rounds |\n|---|---|---|")
    summary = {}
    for key in sorted(results):
        values = results[key]
        mean = statistics.fmean(values)
        half = 1.96 * statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0
        summary[key] = {"mean": mean, "half_width": half, "rounds": values}
        print(f"| {key} | {mean:+.3f} | [{mean - half:+.3f}, {mean + half:+.3f}] |")
    out = Path(__file__).parent / "results" / f"pairing-history-{args.batch_size}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"environment": capture(config.resolved_threads), "args": vars(args), "pairs": pairs,
                               "step_s": step_s, "summary": summary, "traces": traces}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
