"""Does every correct built-in pass parity at every size? Every built-in backend on every built-in
workload, in training and in inference, at batch 2, 8 and 32.

    python bench/parity_sizes.py [--out reports/parity-sizes.md] [--batches 2,8,32] [--workloads ...] [--merge]

A red row on a correct compiler is as wrong as a green row on a wrong one. Small batches are
where a correct change of rounding moves a tensor most (a gradient summed over few values
cancels; after a few Adam steps a near-zero gradient's sign decides a weight's direction), so
this runs the smallest sizes a user may try. Each (workload, mode, batch) is one run of every
backend that applies, one round, the default steps; the table gives each row's status and
parity margin (worst ÷ limit), the check nearest its limit, and how many tensors the size
leaves unresolvable. Timing is not the point: it may share the machine. The suite runs the
ResNet at batch 2 in training, where the risk is largest (tests/test_bring_your_own.py).
"""
from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

from tabulate import tabulate

from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry

#: Each workload at a reduced size (the batch is what this varies; a model's size changes how long
#: its 18 runs of a dozen compiling cells take on 2 cores, not where rounding cancels).
WORKLOADS = {
    "seed-cnn": WorkloadSpec("seed-cnn", {"image_size": 14}, "image"),
    "resnet": WorkloadSpec("resnet", {"image_size": 16, "width": 8}, "image"),
    "transformer": WorkloadSpec("transformer", {"seq_len": 32, "d_model": 64, "ff": 128}, "sequence", "token", 32),
}
#: Measured steps per cell: enough for the trajectory check to run past the parity step.
STEPS = 2


def builtin_backends(mode: str) -> tuple[str, ...]:
    from cnncompare.backends import base

    registry = load_registry(entry_points=False)
    return tuple(name for name, backend in registry.backends.items()
                 if registry.origin.get(name, "").startswith("cnncompare.") and base.in_all(backend)
                 and base.mode_reason(backend, mode) is None)


def share_kernel_cache(path: str) -> None:
    """Every cell compiles into one inductor cache (as the suite does): a kernel an earlier cell
    built is loaded, not rebuilt. The compile is not what this measures."""
    from cnncompare.core.run import launch

    own = launch.child_env

    def child_env(cache_dir, config):
        return {**own(cache_dir, config), "TORCHINDUCTOR_CACHE_DIR": path}

    launch.child_env = child_env


def run(workload: str, mode: str, batch: int) -> RunReport:
    config = RunConfig(backends=builtin_backends(mode), devices=("cpu",), workload=WORKLOADS[workload], batch_size=batch,
                       mode=mode, rounds=1, steps=STEPS, compile_threads=1)
    registry = load_registry(entry_points=False)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, on_result=lambda rep: None)
    return report


def _earlier_rows(out: Path, args) -> tuple[list[list[str]], str | None]:
    """``out``'s table rows for the runs this invocation won't make, and what the earlier run said of itself."""
    if not out.exists():
        return [], None
    text = out.read_text()
    ours = {(w, m, str(b)) for w in args.workloads.split(",") for m in args.modes.split(",") for b in args.batches.split(",")}
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) == 9 and cells[0] in WORKLOADS and (cells[0], cells[1], cells[2]) not in ours:
            rows.append(cells)
    when = re.search(r"torch [^,]+, (\d{4}-\d\d-\d\d \d\d:\d\d UTC)", text)
    return rows, when.group(1) if when else "an earlier run"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("reports/parity-sizes.md"))
    parser.add_argument("--batches", default="2,8,32")
    parser.add_argument("--workloads", default=",".join(WORKLOADS))
    parser.add_argument("--modes", default="train,inference")
    parser.add_argument("--merge", action="store_true",
                        help="keep --out's rows for the (workload, mode, batch) runs this invocation doesn't make")
    args = parser.parse_args(argv)
    kept, kept_from = _earlier_rows(args.out, args) if args.merge else ([], None)
    share_kernel_cache(tempfile.mkdtemp(prefix="parity-sizes-inductor-"))
    rows, failures, start = [], 0, time.perf_counter()
    import torch

    def write() -> str:
        """The table so far (written after every run: a long bench cut short keeps what it measured)."""
        table = tabulate(kept + rows, headers=["workload", "mode", "batch", "backend", "status", "margin", "worst check",
                                        "judged / not resolvable", "computes in"], tablefmt="github")
        text = (f"# Parity of every built-in at small batches\n\n`python bench/parity_sizes.py` on this project's "
                f"2-core CPU machine, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
                f"{time.perf_counter() - start:.0f} s. Each (workload, mode, batch) is one run of every built-in that "
                f"applies (workloads at a reduced size: " + "; ".join(
                    f"{name} " + ", ".join(f"{k} {v}" for k, v in spec.options.items())
                    for name, spec in WORKLOADS.items())
                + f"; default warm-up, {STEPS} measured steps, one round). A row that is not `ok` (or `skipped`, with "
                f"its reason) is a correct backend the check failed: {failures} here"
                + (f" ({len(kept)} rows kept from earlier runs of this bench, the latest at {kept_from})" if kept else "")
                + f".\n\n{table}\n")
        args.out.write_text(text)
        return text

    for workload in args.workloads.split(","):
        for mode in args.modes.split(","):
            for batch in (int(b) for b in args.batches.split(",")):
                report = run(workload, mode, batch)
                for r in report.results:
                    p = r.parity
                    failures += r.status not in (Status.OK, Status.SKIPPED)
                    rows.append([workload, mode, batch, r.backend, r.status.value,
                                 f"{p.margin:.2f}" if p and p.margin is not None else "–",
                                 (p.worst_tensor or "–") if p else (r.error or "")[:80],
                                 f"{p.tensors} / {len(p.not_judged)}" if p else "–",
                                 (p.precision or "–") if p else "–"])
                print(f"{workload} {mode} batch {batch}: "
                      + ", ".join(f"{r.backend} {r.status.value}" for r in report.results), file=sys.stderr)
                write()
    print(write())
    return 1 if failures else 0

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
