"""Parity's margins at the default config: every correct backend passes with room, every wrong one fails.

    python bench/parity_margins.py [--out reports/parity-margins.md] [--only PATTERN,...]

Runs, at the default (seed) config with 5 measured steps in one round, the correct built-ins,
the amp plugin's bf16 rows and every wrong backend of the test suite (tests/wrong_backends.py:
training and inference; the wrong bf16 backends of plugins/cnncompare-amp/tests/test_amp.py),
and writes each row's status, margin (worst check's error ÷ its limit), the check nearest its
limit, and the precision it measured as computing in. docs/parity.md quotes this table.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "tests", ROOT / "plugins" / "cnncompare-amp" / "tests"):
    sys.path.insert(0, str(extra))  # the wrong backends, importable in the cells too

import test_amp  # noqa: E402

import cnncompare_amp  # noqa: E402
import wrong_backends  # noqa: E402
from cnncompare.core.config import RunConfig  # noqa: E402
from cnncompare.core.results import RunReport  # noqa: E402
from cnncompare.core.run.devices import DeviceSlot  # noqa: E402
from cnncompare.core.run.orchestrate import plan_cells, run_cells  # noqa: E402
from cnncompare.plugins import load_registry  # noqa: E402

TRAIN = ("eager", "eager-fused", "channels-last", "jit-trace", "jit-script", "compile", "compile-step", "amp-bf16",
         "compile-amp-bf16")
INFERENCE = ("eager", "channels-last", "jit-trace", "jit-script", "jit-freeze", "compile", "compile-freezing",
             "export-aot-inductor")


def run(mode: str, backends: tuple[str, ...]) -> RunReport:
    registry = load_registry(extra_plugins=[wrong_backends, cnncompare_amp, test_amp._WrongBf16()], entry_points=False)
    config = RunConfig(backends=backends, devices=("cpu",), mode=mode, rounds=1, steps=5)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, on_result=lambda rep: None)
    return report


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "parity-margins.md")
    parser.add_argument("--only", default=None, metavar="PATTERN[,PATTERN...]",
                        help="run only the backends matching these globs (eager always runs), e.g. '*bf16*'")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    plans = [("train", TRAIN + tuple(cls.name for cls in wrong_backends.WRONG + test_amp.WRONG_BF16)),
             ("inference", INFERENCE + tuple(cls.name for cls in wrong_backends.WRONG_INFERENCE))]
    if args.only:
        from fnmatch import fnmatchcase

        patterns = args.only.split(",")
        plans = [(mode, chosen) for mode, backends in plans
                 if len(chosen := tuple(b for b in backends if b == "eager" or any(fnmatchcase(b, x) for x in patterns))) > 1]
    rows, reference_s = [], {}
    for mode, backends in plans:
        report = run(mode, backends)
        for r in report.results:
            p = r.parity
            if p is not None and p.reference_s:
                reference_s[mode] = p.reference_s
            correct = not r.backend.startswith(("wrong-", "bf16-"))
            rows.append([mode, r.backend, "correct" if correct else "wrong", r.status.value,
                         f"{p.margin:.3g}" if p and p.margin is not None else "–", (p.worst_tensor if p else r.error)
                         or "–", (p.precision or "–") if p else "–",
                         f"{p.check_s:.1f}" if p and p.check_s else "–"])
    table = tabulate(rows, headers=["mode", "backend", "is", "status", "margin", "check nearest its limit",
                                    "computes in", "check (s)"], tablefmt="github")
    import torch

    args.out.write_text(
        f"# Parity margins at the default config\n\n`python bench/parity_margins.py` on this project's 2-core CPU machine, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{time.perf_counter() - start:.0f} s: batch 128, 28x28, 3 warm-up + 5 measured steps, one round. The "
        f"reference (float64, fp32 and its perturbed twins, bf16 twice) took "
        + ", ".join(f"{s:.0f} s in {mode}" for mode, s in reference_s.items())
        + ". Margin: the worst check's error ÷ its limit (≤ 1 passes).\n\n" + table + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
