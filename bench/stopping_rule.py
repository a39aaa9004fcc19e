"""How often the stopping rule names a wrong pick, and how many rounds it takes to decide.

    python bench/stopping_rule.py [--sims 1000] [--out bench/results/stopping-rule.txt]

A run of warm pairs looks at its verdict after rounds 2, 3, 5, 8, ... and stops once it names a
pick; rounds in between go to the rows still contending (``run/policy.py``). Looking again and
again would make a wrong pick likelier at a fixed level, so the verdict tests at 99.4 % (95 %
over the 8 looks a run may take, ``stats.VERDICT_CONFIDENCE``). This checks that, offline, with
the real rule: the rows are ``CellResult``s fed round by round to the policy, ``stats.derive``
and ``stats.verdict`` exactly as a run feeds them, and only the step pairs are simulated, two ways:

- **resampled**: each round of each row is a real round of step pairs drawn from the committed
  A/A bench runs (``bench/results/aa-seed-*.json``, the default config, 4 step pairs a round),
  centred on its own row's speedup and shifted to the scenario's: the machine's own heavy tails
  and process level, with no model of them;
- **normal**: a round's process effect N(0, 0.032) and each step pair's N(0, 0.075) on the log
  scale, the noise measured on this machine (docs/verdicts.md).

Scenarios (true speedups over eager): a clear winner (1.40x against 1.10x and 0.90x), a tie at
the top (two rows at 1.20x), nothing faster than eager (two rows at 1.00x, with the control),
and a close winner (1.10x against 1.00x). A wrong pick is any pick where the truth has a tie
(a row at the top's speedup) or, for the close winner, anything but it. Each run of the rule
may go up to 34 rounds (the last scheduled look); the budget is not simulated.
"""
from __future__ import annotations

import argparse
import glob
import math
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cnncompare.core import stats  # noqa: E402
from cnncompare.core.config import RunConfig  # noqa: E402
from cnncompare.core.records import Status  # noqa: E402
from cnncompare.core.results import CellResult, RoundInfo, RunReport  # noqa: E402
from cnncompare.core.run.policy import Decide  # noqa: E402

#: One round of one row: (eager's steps, the backend's steps), step pair i the i-th of each.
Round = tuple[list[float], list[float]]
#: Draws a round whose true speedup (eager / backend) is the given one.
Draw = Callable[[random.Random, float], Round]

SCENARIOS = {
    "clear winner": {"a": 1.40, "b": 1.10, "c": 0.90},
    "tie at the top": {"a": 1.20, "b": 1.20, "c": 1.00},
    "nothing beats eager": {"a": 1.00, "b": 1.00},
    "close winner": {"a": 1.10, "b": 1.00},
}


def normal_draw(pairs: int = 4, process: float = 0.032, step: float = 0.075) -> Draw:
    """Rounds with this machine's measured noise (log scale): a process effect per round, a
    step-pair effect per pair, eager's own steps scattering by ``step`` too."""
    def draw(rng: random.Random, speedup: float) -> Round:
        shift = rng.gauss(0.0, process)
        eager = [math.exp(rng.gauss(0.0, step)) for _ in range(pairs)]
        return eager, [e / speedup * math.exp(shift + rng.gauss(0.0, step)) for e in eager]
    return draw


def resampled_draw(paths: list[str]) -> Draw:
    """Rounds drawn from committed runs' paired rows, each row's rounds centred on its own mean
    log ratio (so only their scatter is kept), then set to the asked speedup."""
    pool: list[Round] = []
    for path in paths:
        report = RunReport.from_json(Path(path).read_text())
        for row in report.results:
            paired = stats.paired_of(row)
            if row.status != Status.OK or paired is None:
                continue
            rounds = [(list(e), list(b)) for e, b in paired if e and len(e) == len(b)]
            if len(rounds) < 2:
                continue
            centre = float(np.mean([np.mean(np.log(np.asarray(e) / np.asarray(b))) for e, b in rounds]))
            pool += [(e, [s * math.exp(centre) for s in b]) for e, b in rounds]
    if not pool:
        raise SystemExit(f"no paired rounds in {paths}")

    def draw(rng: random.Random, speedup: float) -> Round:
        eager, backend = rng.choice(pool)
        return list(eager), [s / speedup for s in backend]
    return draw


@dataclass
class Outcome:
    pick: Optional[str]
    rounds: int
    undecided_between: list[str]
    report: RunReport


def _row(name: str) -> CellResult:
    return CellResult(backend=name, device="cpu", status=Status.OK)


def simulate(truth: dict[str, float], draw: Draw, rng: random.Random, max_rounds: int = 34,
             first: int = 2, control: bool = True, round_s: float = 10.0) -> Outcome:
    """One run of the stopping rule: every row for ``first`` rounds, then the rounds the policy
    names (``Decide``), until it names none or ``max_rounds``. ``truth``: each backend's true
    speedup over eager (the control's is 1); ``round_s``: each row's seconds a round, for the
    report's round log."""
    speeds = {**truth, **({stats.CONTROL: 1.0} if control else {})}
    eager = _row("eager")
    rows = {name: _row(name) for name in speeds}
    for r in rows.values():
        r.round_samples, r.round_eager_samples = [], []
    eager.round_samples = []
    report = RunReport(environment={}, config=RunConfig(rounds=first, batch_size=1), results=[eager, *rows.values()])
    policy = Decide(first)
    due = list(speeds)
    k = 1
    while True:
        eager_steps: list[float] = []
        for name, r in rows.items():
            e, b = draw(rng, speeds[name]) if name in due else ([], [])
            assert r.round_samples is not None and r.round_eager_samples is not None
            r.round_samples.append(b)
            r.round_eager_samples.append(e)
            eager_steps += e
        assert eager.round_samples is not None
        eager.round_samples.append(eager_steps)
        log = report.round_log.setdefault("cpu", [])
        log.append(RoundInfo(order=list(due), ended_s=(log[-1].ended_s or 0.0 if log else 0.0) + round_s * len(due)))
        for r in [eager, *rows.values()]:
            assert r.round_samples is not None
            r.rounds = [float(np.median(s)) if s else None for s in r.round_samples]
            r.step_s = stats.StepStats.from_samples([s for samples in r.round_samples for s in samples])
        report.rederive()
        v = report.verdicts["cpu"]
        if k >= max_rounds:
            break
        k += 1
        due = policy.next_round(k, report.rows("cpu"), v, math.inf, lambda name: 1.0) if k > first else list(speeds)
        if not due:
            k -= 1
            break
    return Outcome(v.pick, k, v.undecided_between, report)


def wrong(truth: dict[str, float], pick: Optional[str]) -> bool:
    """Whether ``pick`` is wrong: any pick where the top is tied, else anything but the top."""
    if pick is None:
        return False
    speeds = {"eager": 1.0, **truth}
    top = max(speeds.values())
    best = [n for n, s in speeds.items() if s == top]
    return len(best) > 1 or pick != best[0]


def run(sims: int, draw: Draw, seed: int = 0) -> list[str]:
    lines = ["| scenario (true speedups) | runs | wrong pick [95 %] | right pick | undecided at 34 rounds "
             "| rounds when decided: median (max) |",
             "|---|---|---|---|---|---|"]
    for label, truth in SCENARIOS.items():
        rng = random.Random(f"{seed}:{label}")
        outcomes = [simulate(truth, draw, rng) for _ in range(sims)]
        bad = sum(wrong(truth, o.pick) for o in outcomes)
        right = sum(o.pick is not None and not wrong(truth, o.pick) for o in outcomes)
        decided = [o.rounds for o in outcomes if o.pick is not None]
        ci = sps.binomtest(bad, sims).proportion_ci(0.95)
        speeds = ", ".join(f"{n} {s:.2f}x" for n, s in truth.items())
        lines.append(f"| {label} ({speeds}) | {sims} | {bad / sims:.1%} [{ci.low:.1%}, {ci.high:.1%}] | "
                     f"{right / sims:.0%} | {sum(o.pick is None for o in outcomes) / sims:.0%} | "
                     + (f"{int(np.median(decided))} ({max(decided)})" if decided else "–") + " |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    started = time.monotonic()
    paths = sorted(glob.glob(str(ROOT / "bench" / "results" / "aa-seed-*.json")))
    out = [f"# The stopping rule, simulated ({args.sims} runs per scenario; every test at "
           f"{stats.VERDICT_CONFIDENCE:.2%}, looks after rounds {', '.join(map(str, stats.LOOKS))})", ""]
    out += [f"## Resampled: real rounds of the A/A bench's default runs ({len(paths)} runs)", ""]
    out += run(args.sims, resampled_draw(paths))
    out += ["", "## Normal: process 0.032, step pair 0.075 (log), 4 step pairs a round", ""]
    out += run(args.sims, normal_draw())
    out += ["", f"({time.monotonic() - started:.0f} s)"]
    text = "\n".join(out) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
