"""compare (rank test + gate), merging runs into one report, CSV."""
import csv
import io
import json
import random
import re
from dataclasses import replace

import pytest

from _tiny import TINY_WORKLOAD
from _usage import usage_error
from cnncompare.cli import main
from cnncompare.core.config import RunConfig
from cnncompare.core.records import Status
from cnncompare.core.report.compare import compare_runs, regressions
from cnncompare.core.report.data import CSV_COLUMNS, render_csv, render_json
from cnncompare.core.report.markdown import render_combined
from cnncompare.core.results import CellResult, RunReport
from cnncompare.core.stats import StepStats

ENV = {"date": "d", "cnncompare": "0.1.0", "torch": "2.13.0", "cpu": "CPU A", "threads": 2, "gpus": [], "python": "3.11"}
CONFIG = RunConfig(batch_size=4, workload=TINY_WORKLOAD, steps=20, warmup=1, rounds=3)


def _samples(center, n=20, spread=0.02, seed=0):
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def _run(cells, env=None, rounds=3):
    """A run of ``cells`` over ``rounds`` rounds: each round a process of its own, whose speed
    moves by up to 1 % (the level ``compare`` tests at), its steps by up to 2 % around that."""
    results = []
    for i, (b, d, s, m) in enumerate(cells):
        row = CellResult(backend=b, device=d, status=Status(s), compile_s=0.0, first_step_s=m)
        if s in ("ok", "fail_accuracy"):
            rng = random.Random(100 + i)
            row.round_samples = [_samples(m * (1 + rng.uniform(-0.01, 0.01)), seed=10 * i + k) for k in range(rounds)]
            row.step_s = StepStats.from_samples([x for samples in row.round_samples for x in samples])
        results.append(row)
    return RunReport(environment=dict(env or ENV), config=CONFIG, results=results, started_at="t")


BASE = _run([("eager", "cpu", "ok", 1.0), ("compile", "cpu", "ok", 0.8), ("jit-trace", "cpu", "ok", 1.0), ("broken", "cpu", "crashed", 0)])
NEW = _run([("eager", "cpu", "ok", 1.005), ("compile", "cpu", "ok", 1.0), ("jit-trace", "cpu", "fail_run", 0), ("broken", "cpu", "crashed", 0)])


def test_the_rounds_test_separates_noise_from_a_real_slowdown_in_step_times():
    cells = {c.backend: c for c in compare_runs(BASE, NEW, absolute=True)}
    assert cells["compile"].slowdown == pytest.approx(1.25, rel=0.02)
    assert cells["compile"].beyond_noise(0.05)
    assert not cells["eager"].beyond_noise(0.05)  # +0.5 % inside a 2 % spread
    assert not cells["jit-trace"].comparable and not cells["broken"].comparable
    assert [c.backend for c in regressions(list(cells.values()), 10)] == ["compile"]
    assert regressions(list(cells.values()), 30) == []
    # One round on a side: the steps of one process are not independent repeats, so nothing is tested,
    # and an untested change never fails the gate.
    one = {c.backend: c for c in compare_runs(_run([("compile", "cpu", "ok", 0.8)], rounds=1), NEW, absolute=True)}
    assert one["compile"].slowdown == pytest.approx(1.25, rel=0.02) and one["compile"].p_value is None
    assert one["compile"].beyond_noise(0.05) is None and regressions(list(one.values()), 10) == []


def _paired_run(slowdown: float, rounds: int = 4, seed: int = 0, step: float = 0.02):
    """A paired run: eager, its A/A control and ``work`` (eager's step x ``slowdown``), each row's
    rounds paired step by step with a warm eager process whose speed moves 3 % from round to round,
    the steps 8 % apart (this machine's measured levels at the default config)."""
    rng = random.Random(seed)
    results = [CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=step)]
    results[0].round_samples = [[step * rng.lognormvariate(0, 0.08) for _ in range(24)] for _ in range(rounds)]
    results[0].step_s = StepStats.from_samples([x for r in results[0].round_samples for x in r])
    for name, factor in (("eager-control", 1.0), ("work", slowdown)):
        row = CellResult(backend=name, device="cpu", status=Status.OK, compile_s=0.0, first_step_s=step * factor)
        row.round_samples, row.round_eager_samples = [], []
        for _ in range(rounds):
            level = step * rng.lognormvariate(0, 0.03)
            row.round_eager_samples.append([level * rng.lognormvariate(0, 0.08) for _ in range(24)])
            row.round_samples.append([level * factor * rng.lognormvariate(0, 0.08) for _ in range(24)])
        row.step_s = StepStats.from_samples([x for r in row.round_samples for x in r])
        results.append(row)
    return RunReport(environment=dict(ENV), config=CONFIG, results=results, started_at="t")


@pytest.mark.parametrize("seed", range(5))
def test_the_gate_on_speedups_fails_a_planted_slowdown_and_passes_a_repeat(seed):
    base, repeat, slowed = _paired_run(1.0, seed=seed), _paired_run(1.0, seed=seed + 100), _paired_run(1.3, seed=seed + 200)
    assert regressions(compare_runs(base, repeat), 5) == []  # the same code twice: noise, not a regression
    cells = {c.backend: c for c in compare_runs(base, slowed)}
    assert [c.backend for c in regressions(list(cells.values()), 5)] == ["work"]
    assert cells["work"].slowdown == pytest.approx(1.3, rel=0.08) and cells["work"].interval[0] > 1
    assert cells["eager"].baseline and not cells["eager-control"].beyond_noise(0.05)
    assert regressions(list(cells.values()), 50) == []  # slower, but not by more than the threshold


def test_the_committed_repeat_of_the_default_run_passes_the_gate(capsys):
    from pathlib import Path

    reports = Path(__file__).resolve().parents[1] / "reports"
    argv = ["compare", str(reports / "cpu-seed-pairs.json"), str(reports / "cpu-seed-repeat.json"), "--fail-above", "5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Gate (--fail-above 5 %: slower by more than that, beyond noise)**: passed." in out
    rows = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ") and "x " in line]
    from cnncompare.core.report.tables import ranked
    from cnncompare.core.results import RunReport

    new = RunReport.from_json((reports / "cpu-seed-repeat.json").read_text())
    assert rows[:3] == [r.backend for r in ranked(new.rows("cpu"))][:3]  # ordered as the new run's report


def _write(tmp_path, name, report):
    path = tmp_path / name
    path.write_text(render_json(report))
    return str(path)


def test_compare_cli_prints_tables_and_gates(tmp_path, capsys):
    base, new = _write(tmp_path, "base.json", BASE), _write(tmp_path, "new.json", NEW)
    assert main(["compare", base, new]) == 0
    out = capsys.readouterr().out
    assert "| compile" in out and "slower" in out and "the baseline" in out and "Each row's speedup over eager" in out
    assert "not comparable (base ok, new fail_run)" in out
    assert main(["compare", base, new, "--fail-above", "10"]) == 1  # EXIT_FOUND: a regression, not a failure
    assert "failed: compile on cpu (+2" in capsys.readouterr().out
    assert main(["compare", base, new, "--fail-above", "50"]) == 0
    assert "passed" in capsys.readouterr().out
    assert main(["compare", base, new, "--absolute"]) == 0
    out = capsys.readouterr().out
    assert "**unpaired**" in out and "Welch's t-test on the rounds' log medians" in out and "within noise" in out


def test_compare_shows_a_changed_environment(tmp_path, capsys):
    other = _run([("eager", "cpu", "ok", 1.0)], env={**ENV, "torch": "2.11.0", "cpu": "CPU B"})
    assert main(["compare", _write(tmp_path, "a.json", BASE), _write(tmp_path, "b.json", other)]) == 0
    out = capsys.readouterr().out
    assert "environment or the workload changed" in out and "torch: '2.13.0' → '2.11.0'" in out


def test_compare_shows_a_changed_workload(tmp_path, capsys):
    other = _run([("eager", "cpu", "ok", 0.8)])
    other.config = replace(other.config, malloc="reuse")  # faster because of the allocator, not the code
    assert main(["compare", _write(tmp_path, "a.json", BASE), _write(tmp_path, "b.json", other)]) == 0
    assert "malloc: 'system' → 'reuse'" in capsys.readouterr().out


@pytest.mark.parametrize("argv, fragment", [
    (["compare", "missing.json", "missing2.json"], "BASE.json: 'missing.json' does not exist"),
    (["compare", "x.json"], "the following arguments are required: NEW.json"),
    (["compare", "a", "b", "--fail-above", "-1"], "--fail-above: must be a percentage >= 0"),
    (["compare", "a", "b", "--alpha", "2"], "--alpha: must be between 0 and 1"),
    (["report"], "the following arguments are required: RUN.json"),
])
def test_subcommand_bad_input(capsys, argv, fragment):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in usage_error(err, f"cnncompare {argv[0]}")


def test_merged_report_has_every_run_and_environment(tmp_path, capsys):
    gpu = _run([("eager", "cuda:0", "ok", 0.05), ("compile", "cuda:0", "ok", 0.02)],
               env={**ENV, "cpu": "CPU B", "gpus": [{"device": "cuda:0", "name": "H200", "memory_gb": 139.8, "capability": "9.0"}]})
    out = tmp_path / "combined.md"
    assert main(["report", _write(tmp_path, "a.json", BASE), _write(tmp_path, "b.json", gpu), "--output", str(out)]) == 0
    md = out.read_text()
    assert "## Run 1: cpu (CPU A)" in md and "## Run 2: cuda:0 (CPU B)" in md
    assert re.search(r"\*\*run 2, cuda:0\*\*: pick \*\*compile\*\*, 0\.0\d+ \[[\d.]+, [\d.]+\] s/step against eager's "
                     r"0\.0\d+, 2\.[45]\dx \[[\d.]+, [\d.]+\] eager", md)
    env_rows = [line for line in md.split("## Environments")[1].splitlines() if line.startswith("| cpu ")]
    assert "CPU A" in env_rows[0] and "CPU B" in env_rows[0]
    assert "H200 (139.8 GB, sm 9.0)" in md
    assert md == render_combined([RunReport.from_dict(json.loads(render_json(BASE))),
                                  RunReport.from_dict(json.loads(render_json(gpu)))])


def test_report_of_one_run_re_renders_that_runs_own_report(tmp_path, capsys):
    """One JSON re-renders the run's own report (how committed reports are regenerated), not a merge."""
    from cnncompare.core.report.markdown import render_markdown

    assert main(["report", _write(tmp_path, "a.json", BASE)]) == 0
    printed = capsys.readouterr().out
    assert printed == render_markdown(RunReport.from_dict(json.loads(render_json(BASE))), [])
    assert printed.startswith("# cnncompare report\n") and "## Configuration" in printed and "combined" not in printed


def test_csv_has_json_key_headers_and_one_row_per_result():
    rows = list(csv.DictReader(io.StringIO(render_csv(BASE))))
    assert list(rows[0]) == list(CSV_COLUMNS)
    assert [r["backend"] for r in rows] == ["eager", "compile", "jit-trace", "broken"]
    compile_row = rows[1]
    assert float(compile_row["step_s.median"]) == pytest.approx(BASE.results[1].step_s.median)
    assert float(compile_row["speedup_vs_eager"]) == pytest.approx(BASE.results[1].speedup_vs_eager)
    assert BASE.results[1].speedup_vs_eager > 1.2
    assert rows[3]["status"] == "crashed" and rows[3]["step_s.median"] == ""
