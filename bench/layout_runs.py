"""Does one fork server per run hide a layout effect? Runs of one comparison alternating
``--fork-server per-round`` and ``--fork-server per-run``, and each mode's test of whether its runs
agree within their own intervals.

    python bench/layout_runs.py --runs 5 --label layout-tiny -- --backends eager,jit-trace --batch-size 4 \\
        --image-size 8 --steps 5 --warmup 1 --rounds 20 --budget 1
    python bench/layout_runs.py --label layout-tiny --analyse-only -- ...

Every child forked from one server is a copy of its address space, so with one server per run
every cell of the run has one layout (where the libraries, the heap and the stacks lie; ASLR draws
it per process image). If the layout moves a backend's step differently from eager's, that effect
is the same in every round of a run: the interval over rounds can't see it, and runs disagree
by more than their intervals allow (Cochran's Q, ``aa_bias.between_runs``). A new server per
round draws a layout per round, so the effect joins the round-to-round scatter the interval
covers: its runs should agree within their intervals, at the price of a server start per round.

Run ``i`` of each mode goes to ``bench/results/aa-LABEL-MODE-i.json`` (``aa_bias.py --between
LABEL-per-round`` reads them too); the two modes alternate, the first of each pair swapped from
pair to pair, so the machine's drift over the minutes hits both alike. The summary is appended to
``--out``. Run it alone on the machine: another job on the cores moves the figures by 10 % or more.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path

from aa_bias import RESULTS, _wall, between_runs, load_runs, publish, run, t_interval

MODES = ("per-round", "per-run")


def paths(label: str, mode: str, runs: int) -> list[Path]:
    return [RESULTS / f"aa-{label}-{mode}-{i}.json" for i in range(1, runs + 1)]


def summary(label: str, args: list[str], runs: int) -> str:
    lines = [f"## One fork server per run or per round: {label}", "",
             f"`cnncompare --devices cpu {' '.join(args)} --fork-server MODE`, the two modes alternating, run by run.", ""]
    for mode in MODES:
        data = load_runs([p for p in paths(label, mode, runs) if p.exists()])
        if not data:
            continue
        env = data[0]["environment"]
        lines += [f"### `--fork-server {mode}` ({len(data)} runs; {env['cpu']}, {env['threads']} threads, "
                  f"torch {env['torch']})", "",
                  "| run | backend | speedup [95 %] | rounds | wall |", "|---|---|---|---|---|"]
        widths: dict[str, list[float]] = {}
        centres: dict[str, list[float]] = {}
        holds: dict[str, int] = {}
        for i, run_data in enumerate(data, 1):
            for r in run_data["results"]:
                if r["backend"] == "eager" or not r.get("speedup_ci"):
                    continue
                low, high = r["speedup_ci"]
                s = r["speedup_vs_eager"]
                widths.setdefault(r["backend"], []).append((math.log(high) - math.log(low)) / 2)
                centres.setdefault(r["backend"], []).append(math.log(s))
                holds[r["backend"]] = holds.get(r["backend"], 0) + (low <= 1.0 <= high)
                lines.append(f"| {i} | `{r['backend']}` | {s:.3f}x [{low:.3f}, {high:.3f}] | "
                             f"{sum(1 for m in r.get('rounds') or [] if m is not None)} | {_wall(run_data) / 60:.1f} min |")
        lines += ["", "- Do the runs agree within their own intervals (Cochran's Q)?", *between_runs(data),
                  "- Per backend: the runs' mean centre [95 % over runs], the runs' scatter (SD of the log centres), "
                  "the mean half-width of one run's interval (log) and in how many runs the interval holds 1.0 "
                  "(for `eager-control`, the A/A):"]
        for name in centres:
            mean, low, high = t_interval(centres[name])
            sd = statistics.stdev(centres[name]) if len(centres[name]) > 1 else float("nan")
            lines.append(f"  - `{name}`: {math.exp(mean):.3f}x [{math.exp(low):.3f}, {math.exp(high):.3f}], "
                         f"SD over runs {sd:.3f}, one run's half-width {statistics.fmean(widths[name]):.3f}, "
                         f"holds 1.0 in {holds[name]} of {len(centres[name])}")
        lines.append("")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5, help="runs of each mode")
    p.add_argument("--label", required=True, help="names the runs' files: bench/results/aa-LABEL-MODE-i.json")
    p.add_argument("--out", type=Path, default=Path("reports/layout.md"), help="markdown the summary is appended to")
    p.add_argument("--analyse-only", action="store_true", help="run nothing: the existing runs' JSON")
    p.add_argument("extra", nargs="*", help="cnncompare arguments, after --")
    args = p.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if not args.analyse_only:
        for i in range(1, args.runs + 1):
            for mode in (MODES if i % 2 else MODES[::-1]):
                seconds = run(paths(args.label, mode, args.runs)[i - 1], [*args.extra, "--fork-server", mode])
                print(f"{mode} {i}/{args.runs}: {seconds / 60:.1f} min", file=sys.stderr)
    publish(summary(args.label, args.extra, args.runs), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
