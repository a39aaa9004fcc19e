"""Parity's margins: every correct backend passes with room, every wrong one fails.

    python bench/parity_margins.py [--out reports/parity-margins.md] [--only PATTERN,...] [--configs default,small]

Runs, in one round, the correct built-ins, the amp plugin's bf16 rows and every wrong backend of
the test suite (tests/wrong_backends.py: training and inference; the wrong bf16 backends of
plugins/cnncompare-amp/tests/test_amp.py), at the default config (batch 128, 28x28, 3 warm-up + 5
measured steps, training and inference) and at a small one (batch 16, 14x14, 3 warm-up + 8
measured steps, training), and writes each row's status, margin (worst check's error ÷ its
limit), the check nearest its limit, and the precision it measured as computing in.
docs/parity.md quotes these tables.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Optional

from tabulate import tabulate

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "tests", ROOT / "plugins" / "cnncompare-amp" / "tests"):
    sys.path.insert(0, str(extra))  # the wrong backends, importable in the cells too

import test_amp  # noqa: E402

import cnncompare_amp  # noqa: E402
import wrong_backends  # noqa: E402
from cnncompare.core.config import RunConfig, WorkloadSpec  # noqa: E402
from cnncompare.core.results import RunReport  # noqa: E402
from cnncompare.core.run.devices import DeviceSlot  # noqa: E402
from cnncompare.core.run.orchestrate import plan_cells, run_cells  # noqa: E402
from cnncompare.plugins import load_registry  # noqa: E402

TRAIN = ("eager", "eager-fused", "channels-last", "jit-trace", "jit-script", "compile", "compile-step", "amp-bf16",
         "compile-amp-bf16")
INFERENCE = ("eager", "channels-last", "jit-trace", "jit-script", "jit-freeze", "compile", "compile-freezing",
             "export-aot-inductor")


#: The configs measured: name -> (what the table's heading says, RunConfig fields, modes).
CONFIGS = {
    "default": ("the default config: batch 128, 28x28, 3 warm-up + 5 measured steps", dict(steps=5),
             ("train", "inference")),
    "small": ("batch 16, 14x14, 3 warm-up + 8 measured steps",
              dict(batch_size=16, workload=WorkloadSpec("seed-cnn", {"image_size": 14}, "image"), steps=8, warmup=3),
              ("train",)),
}


def run(mode: str, backends: tuple[str, ...], fields: dict) -> RunReport:
    registry = load_registry(extra_plugins=[wrong_backends, cnncompare_amp, test_amp._WrongBf16()], entry_points=False)
    config = RunConfig(backends=backends, devices=("cpu",), mode=mode, rounds=1, **fields)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, on_result=lambda rep: None)
    return report


def table(name: str, only: Optional[str]) -> str:
    """One config's section: its table, and what its reference took."""
    heading, fields, modes = CONFIGS[name]
    plans = [(mode, chosen) for mode, chosen in (
        ("train", TRAIN + tuple(cls.name for cls in wrong_backends.WRONG + test_amp.WRONG_BF16)),
        ("inference", INFERENCE + tuple(cls.name for cls in wrong_backends.WRONG_INFERENCE))) if mode in modes]
    if only:
        patterns = only.split(",")
        plans = [(mode, chosen) for mode, backends in plans
                 if len(chosen := tuple(b for b in backends if b == "eager" or any(fnmatchcase(b, x) for x in patterns))) > 1]
    rows, reference_s = [], {}
    for mode, backends in plans:
        report = run(mode, backends, fields)
        for r in report.results:
            p = r.parity
            if p is not None and p.reference_s:
                reference_s[mode] = p.reference_s
            correct = not r.backend.startswith(("wrong-", "bf16-"))
            rows.append([mode, r.backend, "correct" if correct else "wrong", r.status.value,
                         f"{p.margin:.3g}" if p and p.margin is not None else "–", (p.worst_tensor if p else r.error)
                         or "–", (p.precision or "–") if p else "–",
                         f"{p.check_s:.1f}" if p and p.check_s else "–"])
    text = tabulate(rows, headers=["mode", "backend", "is", "status", "margin", "check nearest its limit",
                                   "computes in", "check (s)"], tablefmt="github")
    took = ", ".join(f"{s:.0f} s in {mode}" for mode, s in reference_s.items())
    return f"## At {heading}\n\nThe reference took {took}.\n\n{text}\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "parity-margins.md")
    parser.add_argument("--only", default=None, metavar="PATTERN[,PATTERN...]",
                        help="run only the backends matching these globs (eager always runs), e.g. '*bf16*'")
    parser.add_argument("--configs", default="default,small", help="which of: " + ", ".join(CONFIGS))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    # bf16 emulated where the CPU has no native bf16: slow, but judged the same (the amp plugin's README).
    os.environ.setdefault(cnncompare_amp.ENV_EMULATED_BF16, "1")
    sections = [table(name, args.only) for name in args.configs.split(",")]
    import torch

    args.out.write_text(
        f"# Parity margins\n\n`python bench/parity_margins.py` on this project's 2-core CPU machine, "
        f"torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"{time.perf_counter() - start:.0f} s, one round per config. Margin: the worst check's error ÷ its limit "
        f"(≤ 1 passes). The reference is float64, fp32 and its perturbed twins, bf16 eager and its perturbed "
        f"twins. check (s) is the cell's parity check.\n\n" + "\n".join(sections))
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
