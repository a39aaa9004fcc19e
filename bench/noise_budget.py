"""What can any design reach in one run's budget, given this machine's measured noise?

    python bench/noise_budget.py                     # reports/cpu-seed-pairs.json, bench/results/noise-levels-*.json
    python bench/noise_budget.py --report reports/cpu-seed-repeat.json

Takes a default run's report (what its cells cost: the parity reference, each row's compile,
first step and warm-up, its step time) and ``noise_levels.py``'s split of the noise (steps,
processes), and works out two designs' precision per row:

- **this design** as the report ran it: each row's rounds, each a fresh process pair of that
  many step pairs, so a row's mean log speedup scatters by √(process² / rounds + steps² / pairs);
- **the best two-process design**: the same budget, but each row's later rounds as cheap as they
  can be (the process start itself free; only the backend's warm first step and warm-up paid
  again, as the report measured them) and the step pairs per round and the rounds chosen to
  give the smallest scatter: an upper bound for what any pairing of separate processes reaches;
- **a perfect design**: every second the budget has left after what no design can skip (the
  parity reference, each row's cold compile, first step and warm-up, once) spent on step
  pairs, with no process start, no warm-up again and no process level at all (as if each
  process's own speed cancelled), shared evenly between the paired rows.

From each row's scatter it gives the chance that two runs agree as ``verdict_repeatability.py``
asks (no row moving more than 5 %; the A/A row inside [0.98, 1.02] in both), assuming normal
errors, and how many step pairs a ±3 % half-width needs. An upper bound for what a design can
reach here, not a measurement of one.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

from scipy.stats import norm

HERE = Path(__file__).parent


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--report", type=Path, default=HERE.parent / "reports" / "cpu-seed-pairs.json")
    p.add_argument("--levels", type=Path, nargs="+", default=sorted((HERE / "results").glob("noise-levels-*.json")))
    p.add_argument("--target", type=float, default=3.0, help="half-width goal, %%")
    p.add_argument("--move", type=float, default=5.0, help="largest move between two runs, %%")
    args = p.parse_args()

    found = [json.loads(path.read_text())["levels"] for path in args.levels]
    steps_sd = statistics.fmean(f["steps_sd"] for f in found)
    process_sd = statistics.fmean(f["process_sd"] for f in found)
    report = json.loads(args.report.read_text())
    budget = report["config"]["budget_s"]
    rows = [r for r in report["results"] if r["status"] == "ok"]
    eager = next(r for r in rows if r["backend"] == "eager")
    paired = [r for r in rows if r["backend"] != "eager"]
    reference_s = sum((r.get("parity") or {}).get("reference_s") or 0.0 for r in rows)
    once = reference_s + sum(r["compile_s"] + r["first_step_s"] + sum(r["warmup_s"]) for r in rows)
    pair_s = [eager["step_s"]["median"] + r["step_s"]["median"] for r in paired]
    left = budget - once
    pairs_each = max(0.0, left) / sum(pair_s)

    def run_to_run(sd: float) -> float:
        """P(|a - b| <= move) for two runs' log speedups, each scattering by ``sd``."""
        return 1 - 2 * norm.sf(math.log1p(args.move / 100) / (math.sqrt(2) * sd))

    def aa(sd: float) -> float:
        """P(the A/A row's centre is inside [0.98, 1.02]) in one run."""
        return 1 - 2 * norm.sf(math.log(1.02) / sd)

    ours = {}
    for r in paired:
        rounds = [s for s in r["round_samples"] if s]
        n = sum(len(s) for s in rounds)
        ours[r["backend"]] = math.sqrt(process_sd ** 2 / len(rounds) + steps_sd ** 2 / n)
    def best_two_process(r: dict, pair: float) -> float:
        """The smallest scatter ``rounds`` x ``n`` step pairs reach in the row's share of the time,
        where every round after the first pays the row's warm first step and warm-up again."""
        again = min(s for s in r["round_first_step_s"][1:] or [r["first_step_s"]]) + sum(r["warmup_s"])
        best = float("inf")
        for n in range(1, 200):
            rounds = math.floor((left / len(paired) + again) / (again + n * pair))
            if rounds >= 1:
                best = min(best, math.sqrt(process_sd ** 2 / rounds + steps_sd ** 2 / (n * rounds)))
        return best

    two = {r["backend"]: best_two_process(r, t) for r, t in zip(paired, pair_s)}
    perfect = steps_sd / math.sqrt(pairs_each) if pairs_each else float("inf")
    needed = math.ceil((norm.ppf(0.975) * steps_sd / math.log1p(args.target / 100)) ** 2)

    print(f"{args.report.name}: budget {budget:g} s; noise: steps {steps_sd:.3f}, processes {process_sd:.3f} "
          f"(log ratio SD, {len(found)} noise-levels runs)\n")
    print(f"- what no design skips: {once:.0f} s (parity reference {reference_s:.0f} s; each row's compile, first "
          f"step and warm-up once)")
    print(f"- left for step pairs: {left:.0f} s, {pairs_each:.1f} step pairs for each of {len(paired)} paired rows "
          f"(a pair {statistics.fmean(pair_s):.2f} s on average)")
    print(f"- a ±{args.target:g} % half-width needs {needed} step pairs per row with no process level at all: "
          f"{needed * sum(pair_s) + once:.0f} s for the run\n")
    print("| design | a row's SD (log) | P(no row moves > 5 %) | P(A/A inside [0.98, 1.02] in both runs) |")
    print("|---|---|---|---|")
    control = ours.get("eager-control", statistics.fmean(ours.values()))
    print(f"| this design, as run ({statistics.fmean(len([s for s in r['round_samples'] if s]) for r in paired):.1f} "
          f"rounds a row) | {min(ours.values()):.3f}–{max(ours.values()):.3f} | "
          f"{math.prod(run_to_run(sd) for sd in ours.values()):.0%} | {aa(control) ** 2:.0%} |")
    print(f"| best two-process (later rounds cost only their warm-up) | {min(two.values()):.3f}–"
          f"{max(two.values()):.3f} | {math.prod(run_to_run(sd) for sd in two.values()):.0%} | "
          f"{aa(two.get('eager-control', statistics.fmean(two.values()))) ** 2:.0%} |")
    print(f"| perfect (all of the time left on step pairs, no process level) | {perfect:.3f} | "
          f"{run_to_run(perfect) ** len(paired):.0%} | {aa(perfect) ** 2:.0%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
