"""How long should a round of a small model's step pairs be? Runs at two --round-time values, interleaved.

    python bench/round_time.py -- --backends eager,jit-trace --batch-size 4 --image-size 8 --steps 5 --warmup 1
    python bench/round_time.py --times 2.0 0.5 --runs 3 -- ...
    python bench/round_time.py --analyse-only -- ...
    python bench/round_time.py --model 60          # what the noise model predicts, before measuring

A round's mean log ratio scatters by √(process² + step² / pairs): the process level, which only
more rounds average out, and the step pairs' own noise, which more pairs a round do. Where a small
model's step pairs are milliseconds the process level dominates, so a round that covers 2 s of
eager's steps buys little precision over one that covers 0.5 s for four times the pairs. This
runs the same comparison ``--runs`` times at each ``--times`` value, alternating (time 1, time 2,
time 1, ...: no setting gets the quieter minutes), each to its own decision or its ``--budget``,
and reports each run's verdict, rounds and wall time, then the A/A figures per setting
(``aa_bias.analyse``). Writes ``bench/results/round-time-<T>-<i>.json`` and appends the summary to
``--out``. Run it alone on the machine.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

from aa_bias import RESULTS, _wall, analyse, publish, round_logs, run
from fast_verdict import verdict_of


def figure(row: dict) -> str:
    """A row's speedup over eager and its interval."""
    ci = row.get("speedup_ci") or [float("nan")] * 2
    return f"{row.get('speedup_vs_eager') or float('nan'):.3f}x [{ci[0]:.3f}, {ci[1]:.3f}]"


def scatter(row: dict) -> str:
    """The SD of the row's rounds' mean log ratios (eager / row): what the interval is over."""
    means = list(round_logs(row).values())
    return f"{statistics.stdev(means):.3f}" if len(means) > 1 else "–"


def _name(seconds: float) -> str:
    return f"{seconds:g}".replace(".", "p")


def summary(paths: dict[float, list[Path]], args: list[str]) -> str:
    from cnncompare.core.results import RunReport

    lines = ["## Round length for small steps", "",
             f"`cnncompare --devices cpu {' '.join(args)} --round-time T`, the settings alternating run by run.", "",
             "| --round-time | run | step pairs a round | verdict | best | control | a round's scatter: best, control | rounds | wall |",
             "|---|---|---|---|---|---|---|---|---|"]
    text = ""
    trends: list[str] = []
    for seconds, files in paths.items():
        walls = []
        for i, path in enumerate(files, 1):
            data = json.loads(RunReport.from_json(path.read_text()).to_json())
            pick, between = verdict_of(data)
            v = data["verdict"]["cpu"]
            rows = {r["backend"]: r for r in data["results"]}
            control = rows.get("eager-control", {})
            # A paired row's later rounds (eager's own later rounds hold every process it paired with).
            pairs = max((len(s) for r in rows.values() if r.get("round_eager_samples")
                         for s in (r.get("round_samples") or [])[1:]), default=0)

            walls.append(_wall(data) / 60)
            lines.append(f"| {seconds:g} | {i} | {pairs} | {f'pick {pick}' if pick else 'undecided: ' + ', '.join(between)} "
                         f"| {v['best']} {figure(rows[v['best']])} | {figure(control)} | {scatter(rows[v['best']])}, {scatter(control)} | "
                         f"{len(data['round_log']['cpu'])} | {walls[-1]:.1f} min |")
        lines.append(f"| {seconds:g} | median | | | | | | | {statistics.median(walls):.1f} min |")
        trends.append(f"- `--round-time {seconds:g}`: " + within(files))
        text += "\n" + analyse(files, f"--round-time {seconds:g}", args)
    lines += ["", "Within a round, against the round's own mean (log ratio eager / row, later rounds of the paired "
              "rows; 0: no change as the round goes on), with 95 % intervals:", "", *trends]
    return "\n".join(lines) + "\n" + text


def within(files: list[Path]) -> str:
    """How a round's step pairs move inside it: its first pair, and its first and second half
    (the first pair left out), each less the round's mean."""
    first: list[float] = []
    halves: tuple[list[float], list[float]] = ([], [])
    for path in files:
        for row in json.loads(path.read_text())["results"]:
            for bs, es in zip((row.get("round_samples") or [])[1:], (row.get("round_eager_samples") or [])[1:]):
                if len(bs) < 4 or len(bs) != len(es):
                    continue
                logs = [math.log(e / b) for b, e in zip(bs, es)]
                mean, half = statistics.mean(logs), len(logs) // 2
                first.append(logs[0] - mean)
                halves[0].append(statistics.mean(logs[1:half]) - mean)
                halves[1].append(statistics.mean(logs[half:]) - mean)

    def ci(values: list[float]) -> str:
        m, h = statistics.mean(values), 1.96 * statistics.stdev(values) / math.sqrt(len(values))
        return f"{m:+.3f} [{m - h:+.3f}, {m + h:+.3f}]"

    if len(first) < 2:
        return "too few rounds"
    return (f"first pair {ci(first)}, first half {ci(halves[0])}, second half {ci(halves[1])} "
            f"over {len(first)} row-rounds")


def model(sims: int, step_s: float = 0.029, overhead_s: float = 0.8, step_sd: float = 0.22,
          process: tuple[float, float] = (0.083, 0.039), lead: float = 1.078) -> str:
    """What the noise model says, before measuring: the stopping rule's own simulator
    (``stopping_rule.simulate``) on one backend ``lead`` times eager and the control, each round's
    mean scattering by its row's ``process`` level plus ``step_sd`` per step pair, at several
    round lengths; a round costs each row ``overhead_s`` (its processes' start and warm-up) and
    its pairs. The defaults are the tiny config's, from reports/cpu-tiny.json."""
    import random

    import stopping_rule

    def draw_for(pairs: int):
        def draw(rng: random.Random, speedup: float):
            shift = rng.gauss(0.0, process[0] if abs(speedup - 1.0) > 1e-9 else process[1])
            eager = [math.exp(rng.gauss(0.0, step_sd / math.sqrt(2))) for _ in range(pairs)]
            return eager, [e / speedup * math.exp(shift + rng.gauss(0.0, step_sd / math.sqrt(2))) for e in eager]
        return draw

    lines = ["| --round-time | step pairs | a round (s) | picked | rounds: median | time after round 1: median, 80th percentile |",
             "|---|---|---|---|---|---|"]
    for seconds in (0.25, 0.5, 1.0, 2.0):
        pairs = math.ceil(seconds / step_s)
        cost = 2 * (overhead_s + pairs * 2 * step_s)
        rng = random.Random(1)
        outcomes = [stopping_rule.simulate({"b": lead}, draw_for(pairs), rng, max_rounds=50) for _ in range(sims)]
        times = sorted((o.rounds - 1) * cost for o in outcomes)
        lines.append(f"| {seconds:g} | {pairs} | {cost:.1f} | {sum(o.pick == 'b' for o in outcomes)}/{sims} | "
                     f"{statistics.median(o.rounds for o in outcomes):g} | {statistics.median(times) / 60:.1f} min, "
                     f"{times[int(0.8 * len(times))] / 60:.1f} min |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--times", type=float, nargs="+", default=[2.0, 0.5], help="--round-time values, alternated")
    p.add_argument("--runs", type=int, default=3, help="runs at each value")
    p.add_argument("--out", type=Path, default=Path("reports/round-time.md"), help="markdown the summary is appended to")
    p.add_argument("--analyse-only", action="store_true", help="run nothing: the existing runs' JSON")
    p.add_argument("--model", type=int, metavar="SIMS", help="run nothing: the noise model's answer over SIMS "
                   "simulated runs at several round lengths (the tiny config's figures)")
    p.add_argument("extra", nargs="*", help="cnncompare arguments, after --")
    args = p.parse_args()
    if args.model:
        print(model(args.model))
        return 0
    RESULTS.mkdir(parents=True, exist_ok=True)
    paths = {t: [RESULTS / f"round-time-{_name(t)}-{i}.json" for i in range(1, args.runs + 1)] for t in args.times}
    if not args.analyse_only:
        for i in range(args.runs):
            for t in args.times:
                seconds = run(paths[t][i], [*args.extra, "--round-time", f"{t:g}"])
                print(f"--round-time {t:g}, run {i + 1}: {seconds / 60:.1f} min", file=sys.stderr)
    publish(summary({t: [p for p in files if p.exists()] for t, files in paths.items()}, args.extra), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
