"""Could eager and the backend be paired inside one process, so each process's own speed cancels?

    python bench/in_process_pairing.py                                   # eager-fused, default config
    python bench/in_process_pairing.py --backends eager-fused --processes 2 --pairs 8 --batch-size 16   # smoke

cnncompare pairs a backend's cell with a separate eager process (``run/pairs.py``), and a
fresh pair of processes differs by its own speed (``bench/noise_levels.py``: 0.032 on the log
scale, the noise floor that only more rounds average down). The alternative is the one PyTorch's
dynamo harness takes: both steps in one process, alternated. This bench measures both sides
of that choice, each in fresh processes (``python -m ... child``), alone on the machine:

- noise: ``--processes`` processes, each building eager and ``--backend`` side by side and
  alternating ``--pairs`` step pairs (random order inside each pair), and as many building two
  eager instances (A/A); split by level as ``noise_levels.py`` does;
- regime: per backend, its median step time and page faults per step alone in a process, and
  again alternated with an eager twin in one process. On the CPU a third of an eager step's time
  is page faults (glibc returning freed blocks to the kernel); if another model in the process
  changes how many a backend's step takes, the in-process ratio is not what either gets alone.

Writes ``bench/results/in-process-pairing.json`` and prints markdown tables.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from noise_levels import levels


def child(names: list[str], pairs: int, warmup: int, seed: int, batch_size: int, image_size: int) -> dict:
    """In this process: build each of ``names`` (one or two), warm them, alternate ``pairs`` rounds of
    one step each (random order); every step's seconds and page faults, per name."""
    import torch

    from cnncompare.core.cell.measure import _prepare
    from cnncompare.core.cell.training import Job
    from cnncompare.core.config import RunConfig, WorkloadSpec
    from cnncompare.plugins import load_registry

    torch.set_num_threads(2)
    config = RunConfig(batch_size=batch_size, workload=WorkloadSpec("seed-cnn", {"image_size": image_size}, "image"),
                       steps=pairs, seed=0)
    registry = load_registry(entry_points=False)
    job = Job(registry.workloads["seed-cnn"], config)
    device = torch.device("cpu")
    pool = list(job.batches(device))
    steps = [_prepare(registry.get(name), job, device)[2] for name in names]
    taken = [[0, []] for _ in names]  # [steps taken, (seconds, faults) of the measured ones]

    def step(i: int, keep: bool) -> None:
        x, y = pool[taken[i][0] % len(pool)]
        taken[i][0] += 1
        faults, start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
        steps[i](x, y)
        if keep:
            taken[i][1].append((time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults))

    rng = random.Random(seed)
    for k in range(warmup + pairs):
        order = list(range(len(names)))
        rng.shuffle(order)
        for i in order:
            step(i, k >= warmup)
    return {"seconds": [[s for s, _ in t[1]] for t in taken], "faults": [[f for _, f in t[1]] for t in taken]}


def spawn(names: list[str], args: argparse.Namespace, seed: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "child", ",".join(names), str(args.pairs), str(args.warmup),
                          str(seed), str(args.batch_size), str(args.image_size)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    if sys.argv[1:2] == ["child"]:
        names, *numbers = sys.argv[2:]
        print(json.dumps(child(names.split(","), *map(int, numbers))))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", default="eager-fused,compile", help="paired with eager, comma-separated; the "
                   "first also gets the noise split")
    p.add_argument("--processes", type=int, default=4, help="fresh processes per pairing (noise split)")
    p.add_argument("--pairs", type=int, default=24, help="measured step pairs per process")
    p.add_argument("--warmup", type=int, default=4, help="step pairs before the measured ones")
    p.add_argument("--block", type=int, default=4, help="step pairs per block, as noise_levels.py")
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--json", type=Path, default=Path(__file__).parent / "results" / "in-process-pairing.json")
    args = p.parse_args()
    backends = args.backends.split(",")
    start = time.perf_counter()

    # Noise split: A/A and eager/backend processes alternate, so neither sees a different hour.
    noise: dict[str, list[list[float]]] = {"eager": [], backends[0]: []}
    for k in range(args.processes):
        for name in noise:
            got = spawn(["eager", name], args, k)
            noise[name].append([math.log(e / b) for e, b in zip(*got["seconds"])])
    split = {name: levels(measured, args.block) for name, measured in noise.items()}

    # Regime: each backend alone, eager alone, and the two in one process, interleaved.
    regime = []
    for name in backends:
        alone = {n: spawn([n], args, 0) for n in ("eager", name)}
        together = spawn(["eager", name], args, 0)
        row = {"backend": name}
        for n, i in (("eager", 0), (name, 1)):
            row[n] = {"alone_s": statistics.median(alone[n]["seconds"][0]),
                      "alone_faults": statistics.median(alone[n]["faults"][0]),
                      "paired_s": statistics.median(together["seconds"][i]),
                      "paired_faults": statistics.median(together["faults"][i])}
        regime.append(row)

    print(f"in-process pairing: {args.processes} processes x {args.pairs} step pairs per pairing, batch "
          f"{args.batch_size}, {args.image_size}x{args.image_size} ({time.perf_counter() - start:.0f} s)\n")
    print("| pairing (one process) | steps | processes | speedup | per process |\n|---|---|---|---|---|")
    for name, found in split.items():
        print(f"| eager / {name} | {found['steps_sd']:.3f} | {found['process_sd']:.3f} | {found['speedup']:.3f} | "
              + ", ".join(f"{s:.3f}" for s in found["process_pair_speedups"]) + " |")
    print("\n| backend | step | alone: s, page faults | with an eager twin: s, page faults | faults changed |\n"
          "|---|---|---|---|---|")
    for row in regime:
        for n in ("eager", row["backend"]):
            r = row[n]
            changed = f"{r['paired_faults'] / r['alone_faults'] - 1:+.0%}" if r["alone_faults"] else "–"
            print(f"| {row['backend']} | {n} | {r['alone_s']:.3f}, {r['alone_faults']:.0f} | {r['paired_s']:.3f}, "
                  f"{r['paired_faults']:.0f} | {changed} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "levels": split,
                                     "regime": regime, "log_ratios": noise}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
