"""Does the cell time what the user's own training loop gets? The two interleaved, as pairs.

    python bench/harness_overhead.py                          # batch 32 and 128, seed-cnn
    python bench/harness_overhead.py --batch-size 8 --image-size 8 --rounds 2 --pairs 3   # a smoke run

A plain training loop (``plain_loop.py``: seed-cnn, Adam, ``zero_grad``, a new batch every
step, ``perf_counter`` around each step) and cnncompare's eager cell (a child of its fork
server, as in a run) are both started warm and alternated step by step, in a random order
inside each pair, the method ``cnncompare`` uses for its speedups (``run/pairs.py``). Several
fresh process pairs per batch size; the ratio cell / loop is the geometric mean of the step
pairs' ratios, with the same interval (Student's t over the process pairs, ``stats.paired_speedup``). The goal:
the ratio inside [0.98, 1.02] at batch 32 and 128. Run it alone on the machine.

Writes ``bench/results/harness-overhead.json`` and prints a markdown table.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.run.environment import capture
from cnncompare.core.run.launch import SERVER, Child
from cnncompare.core.run.pairs import Listener, interleave
from cnncompare.core.stats import paired_speedup
from cnncompare.plugins import load_registry

GOAL = (0.98, 1.02)


def plain_loop(config: RunConfig, image_size: int, preload: bool) -> tuple[subprocess.Popen, Listener]:
    listener = Listener()
    env = {**os.environ, "OMP_NUM_THREADS": str(config.resolved_threads)}
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("plain_loop.py")), listener.path,
                             str(config.batch_size), str(image_size), str(config.resolved_threads), str(config.seed),
                             *(["preload"] if preload else [])], env=env)
    return proc, listener


def one_pair(config: RunConfig, image_size: int, pairs: int, rng: random.Random, where: str, preload: bool):
    """One process pair: the loop's and the cell's step seconds, pair by pair."""
    registry = load_registry(entry_points=False)
    workload = registry.workloads[config.workload.name]
    proc, listener = plain_loop(config, image_size, preload)
    cell = Child(registry.get("eager"), workload, "cpu", config, where, os.path.join(where, "cache"), None,
                 lambda *a: None, judge=False, serve=True)
    try:
        peer = cell.wait_ready()
        loop = None
        deadline = time.monotonic() + 120
        while loop is None and time.monotonic() < deadline and proc.poll() is None:
            loop = listener.accept()
            time.sleep(0.05)
        if peer is None or loop is None:
            raise RuntimeError(f"a process of the pair did not start (cell: {peer is not None}, loop: {loop is not None})")
        cell_s, loop_s = interleave(peer, loop, pairs, rng, timeout_s=120)
        loop.stop()
        cell.finish()
        return loop_s, cell_s
    finally:
        cell.close()
        proc.kill()
        proc.wait()
        listener.close()


def measure(batch: int, image_size: int, rounds: int, pairs: int, seed: int, preload: bool = False) -> dict:
    config = RunConfig(batch_size=batch, workload=WorkloadSpec("seed-cnn", {"image_size": image_size}, "image"),
                       steps=pairs, seed=seed)
    rng = random.Random(f"harness:{batch}")
    measured = []
    with tempfile.TemporaryDirectory() as where:
        for k in range(rounds):
            measured.append(one_pair(config, image_size, pairs, rng, os.path.join(where, f"pair{k}"), preload))
    # paired_speedup's "eager" side is the loop: loop / cell, whose inverse is the cell's cost.
    speedup, low, high = paired_speedup(tuple((tuple(a), tuple(b)) for a, b in measured))
    per_round = [paired_speedup(((tuple(a), tuple(b)),))[0] for a, b in measured]
    ratio, ci = 1 / speedup, [1 / high, 1 / low]
    return {"batch_size": batch, "image_size": image_size, "rounds": rounds, "step_pairs": pairs, "loop_preload": preload,
            "cell_over_loop": ratio, "ci": ci, "per_round": [1 / s for s in per_round],
            "loop_median_s": sorted(s for a, _ in measured for s in a)[len(measured) * pairs // 2],
            "cell_median_s": sorted(s for _, b in measured for s in b)[len(measured) * pairs // 2],
            "within_goal": GOAL[0] <= ratio <= GOAL[1], "samples": measured}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, nargs="+", default=[32, 128])
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--rounds", type=int, default=4, help="fresh process pairs per batch size")
    p.add_argument("--pairs", type=int, default=15, help="step pairs per process pair")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--loop-preload", action="store_true",
                   help="the loop imports torch._dynamo and inductor's compiler first, as cnncompare's cells have")
    p.add_argument("--json", type=Path, default=None,
                   help="default: results/harness-overhead.json (-loop-preload.json with --loop-preload)")
    args = p.parse_args()
    if args.json is None:
        args.json = Path(__file__).parent / "results" / (
            "harness-overhead" + ("-loop-preload" if args.loop_preload else "") + ".json")
    start = time.perf_counter()
    try:
        rows = [measure(b, args.image_size, args.rounds, args.pairs, args.seed, args.loop_preload)
                for b in args.batch_size]
    finally:
        SERVER.close()
    print(f"Cell / plain training loop, interleaved step by step ({args.rounds} process pairs x {args.pairs} step "
          f"pairs per batch size; {time.perf_counter() - start:.0f} s)\n")
    print("| batch | loop median (s) | cell median (s) | cell / loop [95 % interval] | per process pair | in [0.98, 1.02] |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['batch_size']} | {r['loop_median_s']:.4g} | {r['cell_median_s']:.4g} | {r['cell_over_loop']:.3f} "
              f"[{r['ci'][0]:.3f}, {r['ci'][1]:.3f}] | {', '.join(f'{v:.3f}' for v in r['per_round'])} | "
              f"{'yes' if r['within_goal'] else 'no'} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"environment": capture(RunConfig().resolved_threads), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
