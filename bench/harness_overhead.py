"""How much does cnncompare itself cost? The same eager train step, timed three ways in one run.

1. a bare hand-written loop (perf_counter around each step, in this process);
2. torch.utils.benchmark.Timer, with num_threads set to the real thread count
   (its default of 1 silently changes CPU results, pytorch/pytorch#58585);
3. cnncompare's own cell (a child forked from its fork server, as in a real run;
   two cells sharing a run directory, the second being what every later cell
   of a run costs: the server is started and the parity reference and roofline
   are computed by the first).

The bare loop runs first and last, so machine drift shows as a gap between its
two runs. Prints a markdown table and writes JSON; figures go into README.

    python bench/harness_overhead.py                   # the seed config (batch 128, 28x28)
    python bench/harness_overhead.py --batch-size 4 --image-size 8 --steps 5   # a smoke run
    python bench/harness_overhead.py --malloc reuse    # all three with freed memory kept (glibc):
                                                       # without page faults the noise floor drops

Goals: cnncompare's median within 2 % of the bare loop's; fixed overhead per
cell (process start, imports, everything but the steps) under 2 s.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from cnncompare.core.cell.memory import use_malloc
from cnncompare.core.cell.training import Job, make_optimizer, make_train_step
from cnncompare.core.config import MALLOC_POLICIES, RunConfig, WorkloadSpec
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.environment import capture
from cnncompare.core.run.orchestrate import run_cell
from cnncompare.plugins import load_registry
from cnncompare.workloads.seed_cnn import SeedCNNWorkload


def _step(config: RunConfig):
    """The same step as the cell's, over the same pool of batches: a new one every step."""
    job = Job(SeedCNNWorkload(), config)
    model = job.build_model(torch.device("cpu"))
    pool = job.batches(torch.device("cpu"))
    return make_train_step(model, make_optimizer(model.parameters(), config.lr), job.loss), pool


def bare_loop(config: RunConfig) -> list[float]:
    step, pool = _step(config)
    for k in range(config.warmup + 1):
        step(*pool[k % len(pool)])
    samples = []
    for k in range(config.warmup + 1, config.warmup + 1 + config.steps):
        x, y = pool[k % len(pool)]
        start = time.perf_counter()
        step(x, y)
        samples.append(time.perf_counter() - start)
    return samples


def torch_timer(config: RunConfig) -> list[float]:
    from torch.utils.benchmark import Timer

    step, pool = _step(config)
    for k in range(config.warmup + 1):
        step(*pool[k % len(pool)])
    batches = iter(pool[k % len(pool)] for k in range(config.warmup + 1, config.warmup + 1 + config.steps))
    timer = Timer("step(*next(batches))", globals={"step": step, "batches": batches},
                  num_threads=torch.get_num_threads())
    return [timer.timeit(1).mean for _ in range(config.steps)]


def import_seconds() -> float:
    """What the fork server saves each cell: a fresh interpreter importing what a cell imports."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import cnncompare.core.cell.main, cnncompare.core.cell.measure, "
                    "torch._dynamo"], check=True)
    return time.perf_counter() - start


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--image-size", type=int, default=28)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--malloc", choices=MALLOC_POLICIES, default="system",
                   help="the allocator policy of all three (this process and the cell), as cnncompare --malloc")
    p.add_argument("--json", type=Path, default=None,
                   help="default: results/harness-overhead.json, or harness-overhead-malloc-<policy>.json")
    args = p.parse_args()
    if args.json is None:
        suffix = "" if args.malloc == "system" else f"-malloc-{args.malloc}"
        args.json = Path(__file__).parent / "results" / f"harness-overhead{suffix}.json"
    workload = WorkloadSpec("seed-cnn", {"image_size": args.image_size}, "image")
    config = RunConfig(batch_size=args.batch_size, workload=workload, steps=args.steps, warmup=args.warmup,
                       malloc=args.malloc)
    torch.set_num_threads(config.resolved_threads)
    use_malloc(config.malloc)  # before the first tensor, as a cell does

    bare_first = bare_loop(config)
    timer = torch_timer(config)
    registry = load_registry(entry_points=False)
    with tempfile.TemporaryDirectory() as run_dir:
        first, cell = (run_cell(registry.get("eager"), "builtin", DeviceSlot("cpu"), config, run_dir) for _ in range(2))
    for c in (first, cell):
        if c.status.value != "ok":
            print(f"the cnncompare cell failed: {c.error}", file=sys.stderr)
            return 1
    bare_last = bare_loop(config)
    imports = statistics.median(import_seconds() for _ in range(3))

    bare = bare_first + bare_last
    medians = {
        "bare loop": statistics.median(bare),
        "torch.utils.benchmark.Timer": statistics.median(timer),
        "cnncompare": cell.step_s.median,
    }
    def in_steps_s(c) -> float:
        return (c.compile_s or 0) + (c.first_step_s or 0) + sum(c.warmup_s) + sum(c.step_s.samples)

    in_steps = in_steps_s(cell)
    result = {
        "environment": capture(config.resolved_threads),
        "config": config.to_dict(),
        "median_s": medians,
        "ratio_to_bare": {k: v / medians["bare loop"] for k, v in medians.items()},
        "bare_drift": statistics.median(bare_last) / statistics.median(bare_first),
        "cell_wall_s": cell.wall_s,
        "cell_in_steps_s": in_steps,
        "cell_overhead_s": cell.wall_s - in_steps,
        "first_cell_overhead_s": first.wall_s - in_steps_s(first),
        "fresh_interpreter_import_s": imports,
    }
    print(f"Harness overhead, batch {config.batch_size}, {args.image_size}x{args.image_size}, "
          f"{config.steps} steps, {config.resolved_threads} threads, --malloc {config.malloc}, "
          f"torch {torch.__version__}\n")
    print("| timed by | median s/step | ÷ bare loop |\n|---|---|---|")
    for name, median in medians.items():
        print(f"| {name} | {median:.4f} | {result['ratio_to_bare'][name]:.3f} |")
    print(f"\nbare loop drift (last ÷ first run): {result['bare_drift']:.3f}")
    print(f"cnncompare cell: {cell.wall_s:.1f} s wall, {in_steps:.1f} s in compile and steps; "
          f"overhead {result['cell_overhead_s']:.2f} s per cell (fork, model build, the first-step snapshot, "
          f"the parity check); the run's first cell {result['first_cell_overhead_s']:.1f} s (it starts the fork "
          f"server and computes the parity reference and roofline). A fresh interpreter's imports, which the "
          f"fork server saves each cell: {imports:.1f} s")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
