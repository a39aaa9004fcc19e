"""Would a robust estimator of a round's speedup narrow the intervals without biasing them?

    python bench/robust_estimator.py [RUN.json ...] [--out bench/results/robust-estimator.txt]

A speedup's interval is Student's t over rounds, each round's figure the mean of its step pairs'
log ratios ``log(eager / backend)`` (``stats.intervals``). The pairs' log ratios are
heavy-tailed, so a trimmed or Huber mean per round might scatter less from round to round. This
re-derives, from committed runs' own step pairs (no new measurement), each row's round figures
under each estimator and reports:

- the round-to-round variance of a round's figure, pooled over every row of every run, as a
  share of the mean's (what an interval's width goes as: its square root);
- the A/A row (``eager-control``): each run's centre and the 95 % interval of the runs' mean
  centre, per estimator (a biased estimator moves it off 1.00);
- how far each estimator moves the other rows' speedups from the mean's (a robust estimator
  estimates another quantity where the steps are skewed: it discounts the slow steps a user pays).

Default input: the A/A bench's runs (bench/results/aa-*.json, ``bench/aa_bias.py``).
"""
from __future__ import annotations

import argparse
import glob
import math
import sys
from pathlib import Path

import numpy as np
from scipy import stats as sps

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from cnncompare.core.results import RunReport  # noqa: E402
from cnncompare.core.stats.figures import paired_of  # noqa: E402
from cnncompare.core.stats.intervals import _round_logs  # noqa: E402

CONTROL = "eager-control"


def huber(x: np.ndarray, k: float = 1.345, iterations: int = 50) -> float:
    """Huber's M-estimate of location, its scale the MAD's (normal-consistent)."""
    mu = float(np.median(x))
    scale = 1.4826 * float(np.median(np.abs(x - mu))) or float(np.std(x)) or 1.0
    for _ in range(iterations):
        r = (x - mu) / scale
        w = np.minimum(1.0, k / np.maximum(np.abs(r), 1e-12))
        new = float(np.sum(w * x) / np.sum(w))
        if abs(new - mu) < 1e-12:
            break
        mu = new
    return mu


ESTIMATORS = {
    "mean": lambda x: float(np.mean(x)),
    "trimmed 10%": lambda x: float(sps.trim_mean(x, 0.1)),
    "trimmed 20%": lambda x: float(sps.trim_mean(x, 0.2)),
    "huber": huber,
    "median": lambda x: float(np.median(x)),
}


def rounds_of_run(path: str) -> dict[str, list[np.ndarray]]:
    """Per row (not eager), its rounds' step-pair log ratios."""
    report = RunReport.from_json(Path(path).read_text())
    out = {}
    for r in report.results:
        paired = paired_of(r) if r.backend != "eager" else None
        if paired is not None:
            logs = list(_round_logs(paired).values())
            if len(logs) >= 2:
                out[r.backend] = logs
    return out


def table(group: str, runs: dict[str, dict[str, list[np.ndarray]]]) -> list[str]:
    """One group of runs' table: per estimator, the pooled round-to-round variance, the A/A centre,
    and the shift of the other rows' speedups."""
    lines = [f"## {group} ({len(runs)} runs)", "",
             "| estimator | round-to-round variance ÷ the mean's | A/A centre over runs [95 %] | "
             "A/A runs holding 1.0 (own rounds' t) | mean shift of the other rows' speedups vs the mean's (%) |",
             "|---|---|---|---|---|"]
    base_var = None
    for name, estimate in ESTIMATORS.items():
        num = den = 0.0
        centres, shifts, holds = [], [], 0
        for rows in runs.values():
            for backend, logs in rows.items():
                figures = np.array([estimate(lg) for lg in logs])
                num += float(np.var(figures, ddof=1)) * (len(figures) - 1)
                den += len(figures) - 1
                if backend == CONTROL:
                    centre = float(figures.mean())
                    centres.append(centre)
                    half = sps.t.ppf(0.975, len(figures) - 1) * np.std(figures, ddof=1) / math.sqrt(len(figures))
                    holds += centre - half <= 0.0 <= centre + half
                else:
                    mean_centre = float(np.mean([lg.mean() for lg in logs]))
                    shifts.append(100 * (math.exp(float(figures.mean()) - mean_centre) - 1))
        variance = num / den
        base_var = base_var or variance
        c = np.array(centres)
        half = sps.t.ppf(0.975, len(c) - 1) * c.std(ddof=1) / math.sqrt(len(c)) if len(c) > 1 else float("nan")
        shift = f"{np.mean(shifts):+.2f} (range {min(shifts):+.2f} to {max(shifts):+.2f})" if shifts else "–"
        lines.append(f"| {name} | {variance / base_var:.3f} | {math.exp(c.mean()):.3f} "
                     f"[{math.exp(c.mean() - half):.3f}, {math.exp(c.mean() + half):.3f}] | {holds} of {len(c)} | "
                     f"{shift} |")
    return lines + [""]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*")
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "robust-estimator.txt")
    args = parser.parse_args(argv)
    paths = args.runs or sorted(glob.glob(str(ROOT / "bench" / "results" / "aa-*.json")))
    runs = {Path(p).stem: rounds_of_run(p) for p in paths}
    lines = [f"# Robust estimators of a round's speedup, re-derived from {len(runs)} committed runs' step pairs",
             "", "Runs: " + ", ".join(runs), ""]
    pairs = np.concatenate([np.concatenate(logs) for rows in runs.values() for logs in rows.values()])
    centred = np.concatenate([lg - lg.mean() for rows in runs.values() for logs in rows.values() for lg in logs])
    lines += [f"Step pairs: {len(pairs)}; within-round log ratios: SD {np.std(centred):.4f}, "
              f"MAD-based SD {1.4826 * np.median(np.abs(centred - np.median(centred))):.4f}, "
              f"excess kurtosis {sps.kurtosis(centred):.2f}, skew {sps.skew(centred):.2f}", ""]
    groups = {"all": runs}
    for stem in runs:  # one group per config: the stem less its run number (aa-seed-3 -> aa-seed)
        groups.setdefault(stem.rsplit("-", 1)[0], {})[stem] = runs[stem]
    for group, chosen in groups.items():
        lines += table(group, chosen)
    text = "\n".join(lines) + "\n"
    args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
