"""Does the verdict hold from one run to the next? Two default runs back to back, compared.

    python bench/verdict_repeatability.py [--out reports/cpu-seed] [-- extra cnncompare args]
    python bench/verdict_repeatability.py --compare-only     # the two runs' JSON again, as derived now

Runs ``cnncompare --backends all --devices cpu`` (what ``make report`` runs, at the default
config: rounds, steps, warm-up) twice in a row, writing run A to ``OUT.md/.json/.csv`` and run
B to ``OUT-repeat.md/.json``, then prints, for every backend ``ok`` in both, its speedup over
eager in each run and the change, the worst change, whether both runs name the same pick (or
the same tie), and each run's wall time. The goal: the same verdict, and every
speedup within 3 % of the other run's. Run it alone on the machine: another job on the cores
moves the figures by 10 % or more.

The goals it checks (warm interleaved pairs, docs/verdicts.md): the A/A row (``eager-control``)
within [0.98, 1.02] with an interval containing 1.0 in each run; the same verdict in both; every
row that reached its ``--target`` in both runs moved by at most 3 %, and no row by more than 5 %.
"""
from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

GOAL_PCT = 3.0
#: A row that didn't reach its target in a run may move this much.
ANY_ROW_PCT = 5.0
AA_RANGE = (0.98, 1.02)


def run(out: Path, extra: list[str], csv: bool) -> tuple[dict, float]:
    cmd = [sys.executable, "-m", "cnncompare", "--backends", "all", "--devices", "cpu",
           "--output", str(out.with_suffix(".md")), *(["--csv", str(out.with_suffix(".csv"))] if csv else []), *extra]
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)  # the report goes to its files; progress to stderr
    return json.loads(out.with_suffix(".json").read_text()), time.perf_counter() - start


def rederived(path: Path) -> dict:
    """A run's JSON with its figures derived by this cnncompare (the interval method may be newer)."""
    from cnncompare.core.results import RunReport

    return json.loads(RunReport.from_json(path.read_text()).to_json())


def _wall(data: dict) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(data["finished_at"]) - datetime.fromisoformat(data["started_at"])).total_seconds()


def _log_half_width(row: dict) -> float:
    """A row's interval half-width on the log scale (the mean of its two sides)."""
    low, high = row["speedup_ci"]
    return math.log(high / low) / 2


def verdict_text(v: dict) -> str:
    return f"pick {v['pick']}" if v["pick"] else f"tie: {v['best']} with {', '.join(v['tied_with'])}"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("reports/cpu-seed"))
    p.add_argument("--compare-only", action="store_true",
                   help="run nothing: compare the two runs' JSON as cnncompare derives them now")
    p.add_argument("extra", nargs="*", help="more cnncompare arguments, after --")
    args = p.parse_args()
    repeat = args.out.with_name(args.out.name + "-repeat")
    if args.compare_only:
        a, b = (rederived(path.with_suffix(".json")) for path in (args.out, repeat))
        wall_a, wall_b = (_wall(run_) for run_ in (a, b))
    else:
        a, wall_a = run(args.out, args.extra, csv=True)
        b, wall_b = run(repeat, args.extra, csv=False)
    rows_a = {r["backend"]: r for r in a["results"] if r["status"] == "ok"}
    rows_b = {r["backend"]: r for r in b["results"] if r["status"] == "ok"}
    config = a["config"]
    lines = [f"config: at least {config['rounds']} rounds of {config['steps']} step pairs, each cell with an eager process of its own "
             f"({config['warmup']} warm-up steps), target ±{config.get('target', 3.0):g} %, budget "
             f"{config.get('budget_s', 540):g} s, batch {config['batch_size']}; torch {a['environment']['torch']}, "
             f"{a['environment']['cpu']} ({a['environment']['threads']} threads)",
             f"run A: {wall_a / 60:.1f} min, {len(a['round_log']['cpu'])} rounds; "
             f"run B: {wall_b / 60:.1f} min, {len(b['round_log']['cpu'])} rounds", "",
             f"{'backend':36s} {'A':>24s} {'B':>24s} {'change':>8s}  (* not at its target)"]
    worst = 0.0
    at_target: list[float] = []
    #: Rows that moved more than their two intervals allow: under 95 % intervals, about 1 in 20.
    beyond = []
    for name in rows_a:
        if name not in rows_b:
            continue
        sa, sb = rows_a[name]["speedup_vs_eager"], rows_b[name]["speedup_vs_eager"]
        change = 100.0 * (sb / sa - 1.0)
        worst = max(worst, abs(change))
        if rows_a[name].get("target_reached") and rows_b[name].get("target_reached"):
            at_target.append(abs(change))
        if name != "eager" and abs(math.log(sb / sa)) > math.hypot(*(_log_half_width(r) for r in (rows_a[name], rows_b[name]))):
            beyond.append(name)
        cells = []
        for row in (rows_a[name], rows_b[name]):
            low, high = row["speedup_ci"]
            cells.append(f"{row['speedup_vs_eager']:6.3f}x [{low:.2f}, {high:.2f}]"
                         + ("*" if row.get("target_reached") is False else " "))
        lines.append(f"{name:36s} {cells[0]:>24s} {cells[1]:>24s} {change:+7.1f}%")
    va, vb = a["verdict"]["cpu"], b["verdict"]["cpu"]
    held = va["pick"] == vb["pick"] and (va["pick"] is not None
                                         or {va["best"], *va["tied_with"]} == {vb["best"], *vb["tied_with"]})
    sentinel = [[round(r["sentinel_s"] * 1000, 1) for r in run_["round_log"]["cpu"]] for run_ in (a, b)]
    aa = []
    for run_ in (rows_a, rows_b):
        control = run_.get("eager-control")
        if control:
            s_, (low, high) = control["speedup_vs_eager"], control["speedup_ci"]
            aa.append(AA_RANGE[0] <= s_ <= AA_RANGE[1] and low <= 1.0 <= high)
    lines += ["", f"A/A (eager-control) within [{AA_RANGE[0]}, {AA_RANGE[1]}] with 1.0 in its interval: "
              + ", ".join("yes" if ok else "no" for ok in aa),
              (f"worst change among rows at their target in both runs ({len(at_target)}): {max(at_target):.1f}% "
               f"(goal: within {GOAL_PCT:g}%)" if at_target else "rows at their target in both runs: none"),
              f"rows that moved more than their two 95 % intervals allow (about 1 in 20 would by chance): "
              f"{len(beyond)} of {len(rows_a) - 1}" + (f" ({', '.join(beyond)})" if beyond else ""),
              f"worst change in speedup, any row: {worst:.1f}% (goal: within {ANY_ROW_PCT:g}%)",
              f"verdict A: {verdict_text(va)}; B: {verdict_text(vb)}; held: {'yes' if held else 'no'}",
              f"drift sentinel (ms) per round: A {sentinel[0]}, B {sentinel[1]}"]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
