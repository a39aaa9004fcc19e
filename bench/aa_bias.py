"""Is the A/A control unbiased? Several runs of one comparison, back to back, and a bias test over runs.

    python bench/aa_bias.py --runs 5 --label seed                      # default runs (the default config)
    python bench/aa_bias.py --runs 5 --label tiny -- --backends eager,jit-trace --batch-size 4 --image-size 8 \\
        --steps 5 --warmup 1
    python bench/aa_bias.py --analyse-only --label tiny                # the runs' JSON again, as derived now
    python bench/aa_bias.py --between tiny seed tiny-05                # only: do each label's runs agree?

Runs ``cnncompare --devices cpu [args]`` ``--runs`` times in a row (each writes
``bench/results/aa-<label>-<i>.json``), then reports, with the figures of every run:

- each run's ``eager-control`` speedup (eager against itself) and whether its 95 % interval holds 1.0;
- the mean over runs of the A/A's log centre with its 95 % t-interval over runs: one run's
  interval can hold 1 by luck, the runs' mean can't hide a bias that every run shares;
- whether a row's place in its round moves its figure: each round's mean log ratio of each row,
  less that row's mean over its rounds, grouped by the row's position in the round (``round_log``),
  with a t-interval per position (the cause of the bias the old design had: one eager process
  served every row of a round and got faster with the steps it had served);
- each run's verdict and wall time;
- whether the runs agree on each backend's figure as closely as their own intervals say they
  should (``between_runs``): a row whose runs scatter more than that moves with the machine's
  state from one run to the next, which no run's interval can see.

Appends the summary to ``--out`` (markdown). Run it alone on the machine: another job on the
cores moves the figures by 10 % or more.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scipy import stats as scipy_stats

from cnncompare.core.results import RunReport

RESULTS = Path(__file__).parent / "results"


def run(path: Path, extra: list[str]) -> float:
    """One run, its JSON at ``path`` (its markdown and charts: ``cnncompare report`` draws them again)."""
    import tempfile

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as where:
        subprocess.run([sys.executable, "-m", "cnncompare", "--devices", "cpu", *extra, "--json", str(path),
                        "--output", str(Path(where) / "run.md")], check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def run_all(paths: list[Path], extra: list[str]) -> None:
    """One run per path, one after the other, each one's minutes on stderr."""
    for i, path in enumerate(paths, 1):
        seconds = run(path, extra)
        print(f"run {i}/{len(paths)}: {seconds / 60:.1f} min", file=sys.stderr)


def publish(text: str, out: Path) -> None:
    """The summary on stdout and appended to ``out``."""
    print(text)
    with out.open("a", encoding="utf-8") as f:
        f.write("\n" + text)


def t_interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and its 95 % Student's t interval (the mean alone with fewer than two values)."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, mean, mean
    half = scipy_stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
    return mean, mean - half, mean + half


def round_logs(row: dict) -> dict[int, float]:
    """A paired row's mean log ratio (eager / row) per round it measured."""
    out = {}
    for k, (eager, mine) in enumerate(zip(row.get("round_eager_samples") or [], row.get("round_samples") or [])):
        if eager and mine and len(eager) == len(mine):
            out[k] = statistics.fmean(math.log(e / b) for e, b in zip(eager, mine))
    return out


def positions(data: dict) -> dict[int, list[float]]:
    """Each paired row's round figure less its mean over rounds, by its place among the round's
    paired rows (1: paired first)."""
    rows = {r["backend"]: r for r in data["results"] if r["device"] == "cpu" and r["status"] == "ok"}
    by: dict[int, list[float]] = {}
    for name, row in rows.items():
        logs = round_logs(row)
        if len(logs) < 2:
            continue
        mean = statistics.fmean(logs.values())
        for k, value in logs.items():
            order = [n for n in data["round_log"]["cpu"][k]["order"]
                     if n != "eager" and k in round_logs(rows.get(n, {}))]
            if name in order:
                by.setdefault(order.index(name) + 1, []).append(value - mean)
    return by


def between_runs(runs: list[dict]) -> list[str]:
    """Per backend (eager apart): each run's log centre, weighted by its interval's inverse variance
    (the 95 % interval's half-width on the log scale / 1.96 as its standard error), the weighted
    mean over runs, and Cochran's Q test of whether the runs differ by more than their intervals
    allow (chi-square, runs - 1 degrees of freedom; a small p: they do)."""
    by: dict[str, list[tuple[float, float]]] = {}
    for data in runs:
        for r in data["results"]:
            if r["device"] == "cpu" and r["backend"] != "eager" and r.get("speedup_vs_eager") and r.get("speedup_ci"):
                low, high = r["speedup_ci"]
                se = (math.log(high) - math.log(low)) / (2 * scipy_stats.norm.ppf(0.975))
                if se > 0:
                    by.setdefault(r["backend"], []).append((math.log(r["speedup_vs_eager"]), se))
    lines = []
    for name, points in by.items():
        if len(points) < 2:
            continue
        weights = [1 / se**2 for _, se in points]
        mean = sum(w * x for w, (x, _) in zip(weights, points)) / sum(weights)
        q = sum(w * (x - mean) ** 2 for w, (x, _) in zip(weights, points))
        p = float(scipy_stats.chi2.sf(q, len(points) - 1))
        centres = ", ".join(f"{math.exp(x):.3f}" for x, _ in points)
        lines.append(f"  - `{name}`: {centres}; Q = {q:.1f} on {len(points) - 1} df, p = {p:.3g} "
                     f"({'the runs differ beyond their intervals' if p < 0.05 else 'consistent with one figure'})")
    return lines


def _wall(data: dict) -> float:
    from datetime import datetime

    return (datetime.fromisoformat(data["finished_at"]) - datetime.fromisoformat(data["started_at"])).total_seconds()


def load_runs(paths: list[Path]) -> list[dict]:
    """Each run's JSON as derived now (read back through ``RunReport``)."""
    return [json.loads(RunReport.from_json(p.read_text()).to_json()) for p in paths]


def label_paths(label: str) -> list[Path]:
    """``aa-LABEL-1.json``, ``aa-LABEL-2.json``, ... up to the first missing."""
    return list(itertools.takewhile(Path.exists, (RESULTS / f"aa-{label}-{i}.json" for i in itertools.count(1))))


def analyse(paths: list[Path], label: str, args: list[str]) -> str:
    runs = load_runs(paths)
    env = runs[0]["environment"]
    lines = [f"## A/A over {len(runs)} runs: {label}", "",
             f"`cnncompare --devices cpu {' '.join(args)}`; {env['cpu']}, {env['threads']} threads, torch {env['torch']}; "
             f"{runs[0]['config']['batch_size']} per batch, budget {runs[0]['config']['budget_s']:g} s, "
             f"rounds of {runs[0]['config'].get('round_s') or 'the default'} s.", "",
             "| run | A/A (eager-control) | holds 1.0 | verdict | rounds | wall |", "|---|---|---|---|---|---|"]
    centres, holds, verdicts = [], 0, []
    pooled: dict[int, list[float]] = {}
    for i, data in enumerate(runs, 1):
        control = next(r for r in data["results"] if r["backend"] == "eager-control")
        s, (low, high) = control["speedup_vs_eager"], control["speedup_ci"]
        centres.append(math.log(s))
        holds += low <= 1.0 <= high
        v = data["verdict"]["cpu"]
        verdict = f"pick {v['pick']}" if v["pick"] else f"no pick (best {v['best']}" + (
            f", tied with {', '.join(v['tied_with'])})" if v["tied_with"] else ")")
        verdicts.append(verdict)
        lines.append(f"| {i} | {s:.3f}x [{low:.3f}, {high:.3f}] | {'yes' if low <= 1.0 <= high else 'no'} | {verdict} "
                     f"| {len(data['round_log']['cpu'])} | {_wall(data) / 60:.1f} min |")
        for position, values in positions(data).items():
            pooled.setdefault(position, []).extend(values)
    mean, low, high = t_interval(centres)
    lines += ["", f"- A/A interval holds 1.0 in {holds} of {len(runs)} runs.",
              f"- Mean A/A centre over the runs: {math.exp(mean):.3f}x, 95 % interval over runs "
              f"[{math.exp(low):.3f}, {math.exp(high):.3f}] ({'holds' if low <= 0 <= high else 'does not hold'} 1.00).",
              f"- Verdicts: {'the same in every run' if len(set(verdicts)) == 1 else 'differ'} ({'; '.join(verdicts)}).",
              "- A row's round figure against its own mean over rounds, by its place in the round "
              "(log ratio; 0 is no effect):", ""]
    for position in sorted(pooled):
        m, lo, hi = t_interval(pooled[position])
        lines.append(f"  - position {position}: {m:+.3f} [{lo:+.3f}, {hi:+.3f}] over {len(pooled[position])} row-rounds")
    lines += ["", "- Each backend's figure run by run, and whether the runs agree within their own intervals "
              "(Cochran's Q):", "", *between_runs(runs)]
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--label", help="names the runs' files: bench/results/aa-LABEL-i.json")
    p.add_argument("--out", type=Path, default=Path("reports/aa-bias.md"), help="markdown the summary is appended to")
    p.add_argument("--analyse-only", action="store_true", help="run nothing: the existing runs' JSON")
    p.add_argument("--between", nargs="+", metavar="LABEL",
                   help="run nothing: append only each label's between-runs test (Cochran's Q)")
    p.add_argument("extra", nargs="*", help="cnncompare arguments, after --")
    args = p.parse_args()
    if args.between:
        text = ["## Do the runs agree within their own intervals?", "",
                "Each backend's speedup over eager, run by run, and Cochran's Q test over the runs (each run's",
                "log centre weighted by its 95 % interval's inverse variance): a small p says the runs differ",
                "by more than their own intervals allow, the machine's state moving the figure from one run",
                "to the next.", ""]
        for label in args.between:
            runs = load_runs(label_paths(label))
            text += [f"- {label} ({len(runs)} runs):", *between_runs(runs)]
        publish("\n".join(text) + "\n", args.out)
        return 0
    if not args.label:
        p.error("--label is required (or --between LABEL ...)")
    RESULTS.mkdir(parents=True, exist_ok=True)
    paths = [RESULTS / f"aa-{args.label}-{i}.json" for i in range(1, args.runs + 1)]
    if not args.analyse_only:
        run_all(paths, args.extra)
    publish(analyse([p for p in paths if p.exists()], args.label, args.extra), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
