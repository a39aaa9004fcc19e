"""Every torch cnncompare claims, tested: one venv per torch minor, every backend end to end, the suite.

    python bench/torch_versions.py                       # 2.6 … 2.15, then reports/torch-versions.md
    python bench/torch_versions.py --versions 2.6 2.11   # some of them (the others' rows are kept)
    python bench/torch_versions.py --table-only          # rewrite the table from the results file

For each torch minor it makes a fresh venv under ``--workdir``, installs the newest patch of that
minor from the registry (its Linux builds carry CUDA libraries and run on the CPU here), then
cnncompare and the plugins under plugins/ as ``make`` does (``.[test,plot]``) from a copy of the commit
checked out (``git archive HEAD``: edits made while it runs don't leak in), and runs:

1. every backend in ``--backends all`` end to end on the CPU at a tiny config (one round), and
2. the test suite as ``make test`` runs it (two pytest-xdist workers), less its default-config
   test (``PYTEST``),

and writes one row per release to ``bench/results/torch-versions.json`` (kept between runs, so
one release can be rerun alone) and the table to ``reports/torch-versions.md``. Each venv holds
a few GB: free disk is checked first and the venv is removed after its run (``--keep`` keeps it).

This machine's pip is capped at torch 2.14.1 by a constraint file (/etc/xdg/pip); the script lifts
the cap for its own installs only (``PIP_CONSTRAINT=/dev/null`` in their environment). Not for CI:
it downloads several GB and runs for over an hour on 2 cores. Run it where nothing else is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "torch-versions.json"
TABLE = ROOT / "reports" / "torch-versions.md"
VERSIONS = [f"2.{minor}" for minor in range(6, 16)]
MIN_FREE_GB = 12.0  # a CUDA build of torch in a venv is about 5.5 GB, plus pip's unpacking
#: The suite CI runs, less its one default-config test (2-3 minutes of full-size parity runs, the
#: same on every torch; CI runs it): ten releases must fit in one session on 2 cores.
PYTEST = ["-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile", "--durations", "30", "--deselect",
          "tests/test_parity_catches.py::test_wrong_backends_fail_and_correct_ones_pass_with_margin_at_the_seed_config"]
TINY = ["--backends", "all", "--devices", "cpu", "--batch-size", "4", "--image-size", "8",
        "--steps", "3", "--warmup", "1", "--rounds", "1", "--timeout", "600"]


def sh(cmd: list[str], log: Path, env: dict, timeout: float, cwd: Path) -> tuple[int, float]:
    """Run ``cmd``, its output appended to ``log``; (exit code, seconds). 124 when it timed out."""
    start = time.perf_counter()
    with log.open("a") as out:
        out.write(f"\n$ {' '.join(cmd)}\n")
        out.flush()
        try:
            code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                  timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, round(time.perf_counter() - start, 1)


def tail(log: Path, lines: int = 3) -> str:
    text = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return " / ".join(text[-lines:])[-400:]


def snapshot(workdir: Path) -> tuple[Path, str]:
    """A copy of the committed tree to install from, and its commit."""
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()
    tree = workdir / f"cnncompare-{commit}"
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "archive", "HEAD"], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree, commit


def test_release(minor: str, workdir: Path, tree: Path, commit: str, keep: bool, tests: bool = True) -> dict:
    """One row: what was installed from ``tree`` (``commit``), each backend's status, the suite's
    summary line."""
    row: dict = {"minor": minor, "python": platform.python_version(), "commit": commit,
                 "date": time.strftime("%Y-%m-%d", time.gmtime())}
    free_gb = shutil.disk_usage(workdir).free / 2**30
    if free_gb < MIN_FREE_GB:
        return {**row, "error": f"not run: {free_gb:.1f} GB free under {workdir}, {MIN_FREE_GB:.0f} GB needed"}
    venv = workdir / f"torch-{minor}"
    log = workdir / f"torch-{minor}.log"
    log.write_text("")
    shutil.rmtree(venv, ignore_errors=True)
    env = {**os.environ, "PIP_CONSTRAINT": "/dev/null", "PIP_NO_CACHE_DIR": "1",
           "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("VIRTUAL_ENV", None)
    py = str(venv / "bin" / "python")
    try:
        code, row["install_s"] = sh([sys.executable, "-m", "venv", str(venv)], log, env, 300, tree)
        if code == 0:
            code, seconds = sh([py, "-m", "pip", "install", "-q", f"torch=={minor}.*", "numpy"], log, env, 1800, tree)
            row["install_s"] += seconds
        if code == 0:
            code, seconds = sh([py, "-m", "pip", "install", "-q", "-e", ".[test,plot]", "-e", "plugins/cnncompare-amp",
                                "-e", "plugins/cnncompare-onnxruntime"],
                               log, env, 900, tree)
            row["install_s"] += seconds
        if code != 0:
            return {**row, "error": f"install failed ({code}): {tail(log)}"}
        row["torch"] = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                      text=True, env=env).stdout.strip()
        report = workdir / f"torch-{minor}.json"
        report.unlink(missing_ok=True)
        code, row["backends_s"] = sh([py, "-m", "cnncompare", *TINY, "--json", str(report),
                                     "--output", str(workdir / f"torch-{minor}.md")], log, env, 3600, tree)
        row["backends_exit"] = code
        read_report(row, report)
        if not tests:
            row["tests"] = "not run (--no-tests)"
            return row
        code, row["tests_s"] = sh([py, "-m", "pytest", *PYTEST], log, env, 3600, tree)
        row["tests_exit"] = code
        summary = [line for line in log.read_text(errors="replace").splitlines()
                   if re.search(r"\d+ (passed|failed|error)", line)]
        row["tests"] = summary[-1].strip("= ") if summary else f"no summary (exit {code}): {tail(log)}"
        row["failed_tests"] = sorted(set(re.findall(r"^FAILED (\S+)", log.read_text(errors="replace"), re.M)))
        return row
    finally:
        if not keep:
            shutil.rmtree(venv, ignore_errors=True)


def read_report(row: dict, report: Path) -> None:
    """Each backend's status from the tiny run's JSON, built-ins apart from the plugins' rows."""
    if not report.exists():
        return
    data = json.loads(report.read_text())
    row["cpu"] = data.get("environment", {}).get("cpu")  # older torch meets each CPU's own code paths
    results = data["results"]
    builtin = [r for r in results if (r.get("plugin") or "").startswith("cnncompare.")]
    row["backends"] = {r["backend"]: _row_status(r) for r in builtin}
    row["plugin_backends"] = {r["backend"]: _row_status(r) for r in results if r not in builtin}


def _row_status(r: dict) -> str:
    """'ok' for a row that ran with parity passed; else its status and the first line of why."""
    status = r["status"]
    if status == "ok":
        parity = r.get("parity") or {}
        return "ok" if parity.get("passed", True) else "ok, parity failed"
    reason = (r.get("error") or "").strip().splitlines()
    return f"{status}: {reason[-1][:160]}" if reason else status


def table(rows: dict[str, dict]) -> str:
    lines = [
        "# cnncompare on every torch it claims",
        "",
        "Written by `python bench/torch_versions.py` (a fresh venv per torch minor, the newest patch of",
        "each from the registry; Linux builds with CUDA libraries, run on the CPU of a 2-core x86-64 machine).",
        "**Backends**: `cnncompare --backends all --devices cpu` at a tiny config (batch 4, 8x8 images,",
        "3 steps, 1 warm-up, 1 round), the plugins under plugins/ installed; `ok` counts rows that ran with",
        "parity passed, built-ins apart from the plugins' rows. **Tests**: the suite as `make test` runs it",
        "(`pytest -q -n 2 --dist loadfile`),",
        "with that torch, less its one default-config test (full-size parity runs; CI runs it on 2.13).",
        "CUDA-only rows are skipped on a CPU and are not counted. Each row names the commit it tested;",
        "a row of an earlier commit ran that commit's suite and backends. The machine's CPU is named where",
        "the row recorded it (inductor's CPU code differs by instruction set, and so can its bugs).",
        "",
        "| torch | python | cpu | commit | date | built-ins ok | built-ins not ok | plugins ok | tests | "
        "install / backends / tests (s) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for minor in sorted(rows, key=lambda m: tuple(int(x) for x in m.split("."))):
        row = rows[minor]
        if "error" in row:
            lines.append(f"| {minor} | {row['python']} | {row.get('cpu') or '–'} | {row.get('commit', '')} | "
                         f"{row['date']} | – | {row['error']} | – | – | – |")
            continue
        statuses = row.get("backends", {})
        ran = {b: s for b, s in statuses.items() if not s.startswith("skipped")}
        bad = [f"`{b}` {s}" for b, s in ran.items() if s != "ok"]
        if not statuses:
            bad = [f"no report (exit {row.get('backends_exit')})"]
        plugin = {b: s for b, s in row.get("plugin_backends", {}).items() if not s.startswith("skipped")}
        plugin_text = f"{sum(s == 'ok' for s in plugin.values())}/{len(plugin)}" + "".join(
            f"; `{b}` {s}" for b, s in plugin.items() if s != "ok")
        tests = row.get("tests", "")
        if row.get("failed_tests"):
            tests += ": " + ", ".join(f"`{t}`" for t in row["failed_tests"][:6])
        lines.append(f"| {row.get('torch', minor)} | {row['python']} | {row.get('cpu') or '–'} | "
                     f"{row.get('commit', '')} | {row['date']} | "
                     f"{sum(s == 'ok' for s in ran.values())}/{len(ran)} | {'; '.join(bad) or '–'} | "
                     f"{plugin_text} | {tests} | {row.get('install_s', 0):.0f} / {row.get('backends_s', 0):.0f} / "
                     f"{row.get('tests_s', 0):.0f} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--versions", nargs="+", default=VERSIONS, help="torch minors, e.g. 2.6 2.15")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/cnnc-torch-versions"))
    p.add_argument("--keep", action="store_true", help="keep each venv (a few GB each)")
    p.add_argument("--no-tests", action="store_true", help="the backends only, not the suite (minutes, not ten)")
    p.add_argument("--table-only", action="store_true", help="run nothing; rewrite the table from the results")
    args = p.parse_args()
    rows: dict[str, dict] = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    if args.table_only:  # each release's tiny report read again where it is still there
        for minor, row in rows.items():
            read_report(row, args.workdir / f"torch-{minor}.json")
        RESULTS.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
    else:
        args.workdir.mkdir(parents=True, exist_ok=True)
        tree, commit = snapshot(args.workdir)  # once: every release's row tests the same commit
        for minor in args.versions:
            print(f"torch {minor} …", file=sys.stderr, flush=True)
            rows[minor] = test_release(minor, args.workdir, tree, commit, args.keep, tests=not args.no_tests)
            RESULTS.write_text(json.dumps(rows, indent=1, sort_keys=True) + "\n")
            TABLE.write_text(table(rows))
            print(f"torch {minor}: {rows[minor].get('tests') or rows[minor].get('error')}", file=sys.stderr)
    TABLE.write_text(table(rows))
    print(TABLE.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
