"""Does the verdict a run stops at agree with a long run's? One long run, then several default ones.

    python bench/fast_verdict.py --label tiny -- --backends eager,jit-trace --batch-size 4 --image-size 8 \
        --steps 5 --warmup 1
    python bench/fast_verdict.py --label tiny --analyse-only -- --backends eager,jit-trace ...

Runs ``cnncompare --devices cpu [args] --rounds 34 --budget 1800`` once (``--long``: every row in
each of 34 rounds, the last look; ``bench/results/fast-LABEL-long.json``),
then ``--runs`` default runs of the same comparison (``fast-LABEL-i.json``), one after the other,
and reports for each short run its verdict (the pick, or whom it was undecided between), its rounds
and wall time, whether it tells the long run's story (the same pick, or undecided between the
same rows) and whether it says anything the long run contradicts (a pick outside the rows the
long run couldn't separate); then the A/A figures over the short runs (as
``aa_bias.py``'s). A short run that names another pick than the long one is the error the stopping
rule bounds (docs/verdicts.md, "When a run stops").

Writes the summary to ``--out`` (markdown, appended). Run it alone on the machine: another job on
the cores moves the figures by 10 % or more.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from aa_bias import RESULTS, _wall, analyse, publish, run, run_all


def verdict_of(data: dict) -> tuple[str | None, list[str]]:
    """The cpu verdict's pick and, without one, whom it was undecided between."""
    v = data["verdict"]["cpu"]
    return v["pick"], v.get("undecided_between") or [v["best"], *v["tied_with"]]


def agrees(short: dict, long: dict) -> bool:
    """Whether a short run tells the long one's story: the same pick, or undecided between the same rows."""
    pick, between = verdict_of(short)
    long_pick, long_between = verdict_of(long)
    return pick == long_pick if pick is not None or long_pick is not None else set(between) == set(long_between)


def consistent(short: dict, long: dict) -> bool:
    """Whether a short run says nothing the long one contradicts: its pick is the long run's, or
    one of the rows the long run couldn't separate; undecided, its rows hold the long run's pick
    or share one with the long run's tie."""
    pick, between = verdict_of(short)
    long_pick, long_between = verdict_of(long)
    if pick is not None:
        return pick == long_pick or (long_pick is None and pick in long_between)
    return long_pick in between if long_pick is not None else bool(set(between) & set(long_between))


def summary(long_path: Path, paths: list[Path], args: list[str], label: str) -> str:
    from cnncompare.core.results import RunReport

    def load(path: Path) -> dict:
        return json.loads(RunReport.from_json(path.read_text()).to_json())

    long = load(long_path)
    pick, between = verdict_of(long)
    v = long["verdict"]["cpu"]
    best = f"{v['best']} at {v['speedup']:.2f}x [{v['speedup_ci'][0]:.2f}, {v['speedup_ci'][1]:.2f}]"
    told = f"pick **{pick}**" if pick else f"undecided between {', '.join(between)} (the best: {best})"
    lines = [f"## A fast verdict against a long one: {label}", "",
             f"`cnncompare --devices cpu {' '.join(args)}`. The long run (`--rounds {long['config']['rounds']} --budget "
             f"{long['config']['budget_s']:g}`): "
             f"{told} after {len(long['round_log']['cpu'])} rounds, {_wall(long) / 60:.1f} min.", "",
             "| run | verdict | rounds | wall | the long run's story | nothing it contradicts |",
             "|---|---|---|---|---|---|"]
    shorts = [load(p) for p in paths]
    for i, data in enumerate(shorts, 1):
        p, b = verdict_of(data)
        lines.append(f"| {i} | {f'pick {p}' if p else 'undecided between ' + ', '.join(b)} | "
                     f"{len(data['round_log']['cpu'])} | {_wall(data) / 60:.1f} min | {'yes' if agrees(data, long) else 'no'} | "
                     f"{'yes' if consistent(data, long) else 'no'} |")
    same = sum(agrees(d, long) for d in shorts)
    walls = sorted(_wall(d) / 60 for d in shorts)
    lines += ["", f"- {same} of {len(shorts)} short runs tell the long run's story (the same pick, or undecided "
              f"between the same rows); {sum(consistent(d, long) for d in shorts)} of {len(shorts)} say nothing it "
              f"contradicts; their wall time {walls[0]:.1f}–{walls[-1]:.1f} min (median {walls[len(walls) // 2]:.1f})."]
    return "\n".join(lines) + "\n\n" + analyse(paths, label, args)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--label", required=True, help="names the runs' files: bench/results/fast-LABEL-*.json")
    p.add_argument("--long", default="--rounds 34 --budget 1800", help="what the long run adds to the arguments")
    p.add_argument("--out", type=Path, default=Path("reports/fast-verdict.md"), help="markdown the summary is appended to")
    p.add_argument("--analyse-only", action="store_true", help="run nothing: the existing runs' JSON")
    p.add_argument("extra", nargs="*", help="cnncompare arguments, after --")
    args = p.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    long_path = RESULTS / f"fast-{args.label}-long.json"
    paths = [RESULTS / f"fast-{args.label}-{i}.json" for i in range(1, args.runs + 1)]
    if not args.analyse_only:
        seconds = run(long_path, [*args.extra, *args.long.split()])
        print(f"long run: {seconds / 60:.1f} min", file=sys.stderr)
        run_all(paths, args.extra)
    publish(summary(long_path, [p for p in paths if p.exists()], args.extra, args.label), args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
