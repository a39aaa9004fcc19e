"""The loop projection against the loop itself: does a row's ``loop.total_s`` say what the loop takes?

    python bench/loop_projection.py [--repeats 2] [--output reports/loop-projection.md]

At the default workload and batch (seed-cnn, batch 128, 28x28, Adam; a step takes about a second on 2 cores), a
loop scaled down to minutes: 2 epochs of 12 steps whose last batch holds 50 samples, and an
evaluation of 3 batches every 6 steps. For eager and ``compile``:

1. **the loop itself**, end to end, in a fresh interpreter with a cold compile cache: plain torch,
   nothing of cnncompare's (the model, Adam, ``torch.compile(model)`` for ``compile``, every step,
   ragged batch and evaluation of the loop); one clock from before the compile to after the last
   step. Its batches are made before the clock, as a data loader hands them over, and what
   cnncompare's fork server imports for its cells (torch's compiler among them) is imported
   before it: the projection covers neither data loading nor imports.
2. **the projection**: ``cnncompare --backends eager,compile --loop ...`` at its defaults, each
   row's ``loop.total_s``.

The two are interleaved, ``--repeats`` loop runs of each backend before the cnncompare run and as
many after, so that the machine's drift over the minutes falls on both sides. Written: a
markdown table (each loop run, their mean, the projection, the difference) and the run's JSON.
Run it alone: another job on the cores moves every figure.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOOP = {"epoch_steps": 12, "last_batch": 50, "eval_every": 6, "eval_steps": 3, "epochs": 2}
BATCH, IMAGE, SEED = 128, 28, 0
BACKENDS = ("eager", "compile")
GOAL_PCT = 5.0


def run_loop(backend: str) -> float:
    """The loop, end to end, in this process: its seconds from before the compile to after the last step."""
    import importlib

    from cnncompare.core.run.forkserver import PRELOAD

    for name in PRELOAD:  # imported before the clock, as a cell has them imported
        importlib.import_module(name)
    import torch
    import torch.nn.functional as F

    from cnncompare.workloads.seed_cnn import SeedCNN

    torch.manual_seed(SEED)
    model = SeedCNN(IMAGE)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    n, epochs, last = LOOP["epoch_steps"], LOOP["epochs"], LOOP["last_batch"]
    gen = torch.Generator().manual_seed(SEED)

    def batch(size: int):
        return torch.randn(size, 3, IMAGE, IMAGE, generator=gen), torch.randint(0, 10, (size,), generator=gen)

    train = [batch(last if i == n else BATCH) for _ in range(epochs) for i in range(1, n + 1)]
    evals = [batch(BATCH) for _ in range(LOOP["eval_steps"])]
    start = time.perf_counter()
    forward = torch.compile(model) if backend == "compile" else model
    for g, (x, y) in enumerate(train, 1):
        optimizer.zero_grad()
        F.nll_loss(forward(x), y).backward()
        optimizer.step()
        if g % LOOP["eval_every"] == 0:
            forward.eval()
            with torch.no_grad():
                for ex, ey in evals:
                    F.nll_loss(forward(ex), ey)
            forward.train()
    return time.perf_counter() - start


def fresh_loop(backend: str, threads: int) -> float:
    """``run_loop`` in a fresh interpreter with a compile cache of its own (cold)."""
    with tempfile.TemporaryDirectory(prefix="loop-projection-") as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor"), "OMP_NUM_THREADS": str(threads)}
        code = (f"import sys, torch; sys.path.insert(0, {str(Path(__file__).parent)!r}); torch.set_num_threads({threads}); "
                f"import loop_projection; print(loop_projection.run_loop({backend!r}))")
        out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True)
        return float(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="loop runs of each backend before the cnncompare run, "
                        "and as many after (default 2)")
    parser.add_argument("--budget", type=int, default=300, help="the cnncompare run's --budget (default 300 s)")
    parser.add_argument("--output", type=Path, default=Path("reports/loop-projection.md"))
    parser.add_argument("--json", type=Path, default=Path("bench/results/loop-projection.json"))
    args = parser.parse_args()
    threads = len(os.sched_getaffinity(0))
    measured: dict[str, list[float]] = {b: [] for b in BACKENDS}

    def loops() -> None:
        for _ in range(args.repeats):
            for b in BACKENDS:
                measured[b].append(fresh_loop(b, threads))
                print(f"loop {b}: {measured[b][-1]:.2f} s", flush=True)

    loops()
    flags = [f"--loop={k}={v}" for k, v in LOOP.items()]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="loop-projection-run-") as scratch:  # its markdown and charts
        subprocess.run([sys.executable, "-m", "cnncompare", "--backends", ",".join(BACKENDS), "--devices", "cpu",
                        "--batch-size", str(BATCH), "--seed", str(SEED), "--budget", str(args.budget), *flags,
                        "--json", str(args.json), "--output", os.path.join(scratch, "run.md")], check=True)
    run_s = time.perf_counter() - started
    loops()

    from cnncompare.core.results import RunReport

    report = RunReport.from_json(args.json.read_text())
    rows = {r.backend: r for r in report.results}
    lines = [
        "# The loop projection against the loop itself",
        "",
        f"Made by `python bench/loop_projection.py --repeats {args.repeats}` on {platform.processor() or platform.machine()}, "
        f"{threads} cores, torch {report.environment.get('torch')}, {time.strftime('%Y-%m-%d')}. The loop: "
        f"{report.config.workload.loop.describe(BATCH)}, seed-cnn at batch {BATCH}, {IMAGE}x{IMAGE}, Adam. "
        f"Each loop run is a fresh interpreter with a cold compile cache, timed from before the compile to after "
        f"the last step; {args.repeats} runs of each backend before the cnncompare run (`{args.json}`, "
        f"{run_s:.0f} s) and {args.repeats} after it. Goal: the projection within {GOAL_PCT:g} % of the loops' mean.",
        "",
        "| backend | loop runs (s) | their mean (s) | projected `loop.total_s` (s) | projected - measured | "
        "loop recompiles | step speedup | loop speedup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    worst = 0.0
    for b in (*BACKENDS, "eager-control"):
        r = rows.get(b)
        f = r.loop if r is not None else None
        runs = measured.get(b, measured["eager"] if b == "eager-control" else [])
        mean = statistics.fmean(runs)
        if f is None or f.total_s is None:
            lines.append(f"| {b} | {', '.join(f'{v:.2f}' for v in runs)} | {mean:.2f} | none ({f.error if f else 'no row'}) | | | | |")
            continue
        diff = 100 * (f.total_s - mean) / mean
        worst = max(worst, abs(diff))
        ci = f.speedup_ci or [f.speedup_vs_eager, f.speedup_vs_eager]
        lines.append(f"| {b}{' (vs the eager loops)' if b == 'eager-control' else ''} | "
                     f"{', '.join(f'{v:.2f}' for v in runs)} | {mean:.2f} | {f.total_s:.2f} | {diff:+.1f} % | "
                     f"{'–' if f.recompiles is None else f.recompiles} | {r.speedup_vs_eager:.2f}x | "
                     f"{f.speedup_vs_eager:.2f}x [{ci[0]:.2f}, {ci[1]:.2f}] |")
    e, c = (statistics.fmean(measured[b]) for b in BACKENDS)
    lines += ["", f"Measured loop speedup of compile (the eager loops' mean ÷ compile's): {e / c:.2f}x. "
              f"Largest difference between projection and loop: {worst:.1f} % "
              f"({'within' if worst <= GOAL_PCT else 'outside'} the {GOAL_PCT:g} % goal).", ""]
    for b in BACKENDS:
        rehearsal = rows[b].loop_rehearsal
        if rehearsal is not None:
            lines.append(f"- {b}'s rehearsal: " + "; ".join(
                f"{ev.name} first {ev.first_s:.3f} s, steady {ev.steady_s:.4f} s, ratio {ev.ratio:.2f}"
                + (f", {ev.compiles} compile(s) first" if ev.compiles else "") for ev in rehearsal.events))
    args.output.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
