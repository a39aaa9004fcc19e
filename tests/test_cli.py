"""Bad input is refused before any work: one line naming the option, exit 2, no traceback."""
import json
import os

import pytest

from _usage import run_cli as _run
from _usage import usage_error
from cnncompare.cli import main


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["--batch-size", "0"], "--batch-size: must be positive"),
        (["--batch-size", "-4"], "--batch-size: must be positive"),
        (["--batch-size", "many"], "--batch-size: expected a whole number"),
        (["--image-size", "0"], "--image-size: must be positive"),
        (["--image-size", "2.5"], "--image-size: expected a whole number"),
        (["--steps", "0"], "--steps: must be positive"),
        (["--warmup", "-1"], "--warmup: must be at least 0"),
        (["--seed", "-1"], "--seed: must be at least 0"),
        (["--threads", "0"], "--threads: must be positive"),
        (["--timeout", "0"], "--timeout: must be a positive number"),
        (["--timeout", "soon"], "--timeout: expected a number"),
        (["--timeout", "inf"], "--timeout: must be a positive number"),
        (["--max-memory", "10"], "--max-memory: must be at least 64"),
        (["--max-memory", "lots"], "--max-memory: expected a whole number"),
        (["--compile-cache", "hot"], "argument --compile-cache: invalid choice: 'hot'"),
        (["--compile-threads", "0"], "--compile-threads: must be positive"),
        (["--malloc", "jemalloc"], "argument --malloc: invalid choice: 'jemalloc'"),
        (["--seed", "x"], "--seed: expected a whole number"),
        (["--warmup", "1.5"], "--warmup: expected a whole number"),
        (["--backends", "eager,nope"],
         "--backends: unknown backend 'nope'; known: all, eager, eager-fused, channels-last, jit-trace, jit-script, compile, compile-step, "),
        (["--backends", ","], "--backends: no backend given"),
        (["--devices", "tpu"], "--devices: unknown device 'tpu'"),
        (["--devices", ""], "--devices: no device given"),
        (["--nproc", "0"], "--nproc: must be positive"),
        (["--nproc", "two"], "--nproc: expected a whole number"),
        (["--nproc", "2", "--nnodes", "2"], "--nnodes: several nodes need --rdzv-endpoint HOST:PORT"),
        (["--nnodes", "2", "--rdzv-endpoint", "h:1"], "--nnodes: needs --nproc"),
        (["--nproc", "2", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:29500"],
         "--node-rank: must be below --nnodes 2, got 2"),
        (["--nproc", "2", "--rdzv-endpoint", "nohost"], "--rdzv-endpoint: expected HOST:PORT, got 'nohost'"),
        (["--nproc", "2", "--rdzv-endpoint", "h:99999"], "--rdzv-endpoint: expected HOST:PORT"),
        (["--backends", "eager", "--backend-option", "eager:x=1"],
         "--backend-option eager: backend 'eager' takes no options (it has no configure())"),
        (["--backends", "eager", "--backend-option", "dynamo:eager:x=1"],
         "--backend-option dynamo:eager: not among the selected backends (eager)"),
        (["--backend-option", "nokey"], "--backend-option: expected NAME:KEY=VALUE, got 'nokey'"),
        (["--backend-option", "eager:=1"], "--backend-option: expected NAME:KEY=VALUE, got 'eager:=1'"),
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--steps"], "--steps: expected one argument"),
    ],
)
def test_bad_values_are_one_line_and_exit_2(capsys, argv, fragment):
    code, out, err = _run(capsys, *argv)
    assert code == 2
    assert out == ""
    assert fragment in usage_error(err)


def test_unwritable_outputs_are_refused(capsys, tmp_path):
    a_dir = tmp_path / "dir"
    a_dir.mkdir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    cases = [
        (["--output", str(a_dir)], "--output: ", "is a directory"),
        (["--json", str(a_dir)], "--json: ", "is a directory"),
        (["--output", str(a_file / "r.md")], "--output: ", "is not a directory"),
        (["--output", str(tmp_path / "r.md"), "--json", str(tmp_path / "r.md")], "--json: ", "must differ"),
        (["--csv", str(a_dir)], "--csv: ", "is a directory"),
        (["--output", str(tmp_path / "r.md"), "--csv", str(tmp_path / "r.md")], "--csv: ", "must differ"),
        (["--resume", str(a_dir)], "--resume: ", "not a cnncompare JSON report"),
    ]
    if os.geteuid() != 0:  # root writes anywhere
        cases.append((["--output", str(locked / "r.md")], "--output: ", "permission denied"))
    for argv, option, fragment in cases:
        code, out, err = _run(capsys, *argv)
        assert code == 2, argv
        line = usage_error(err)
        assert line.startswith(f"cnncompare: error: {option}") and fragment in line, err
    assert list(a_dir.iterdir()) == []


def test_resume_needs_a_real_report(capsys, tmp_path):
    code, _, err = _run(capsys, "--resume", str(tmp_path / "missing.json"))
    assert code == 2 and "does not exist" in err
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"schema_version": 1}))
    code, _, err = _run(capsys, "--resume", str(bad))
    assert code == 2 and "--resume:" in err and "not a cnncompare JSON report" in err


def test_list_shows_backends_plugins_and_devices(capsys):
    code, out, err = _run(capsys, "--list", "--devices", "cpu,cuda")
    assert code == 0
    for name in ("eager", "jit-trace", "jit-script", "compile", "compile-step"):
        assert name in out
    assert "compile-reduce-overhead" in out and "records CUDA graphs, which need a CUDA device" in out
    assert "cnncompare.backends.torchscript" in out
    assert "cpu: yes" in out


def test_version(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("cnncompare ")


def test_backend_patterns_and_all_is_the_curated_set():
    from cnncompare.cli.select import backends as _select_backends
    from cnncompare.plugins import load_registry

    reg = load_registry(entry_points=False)
    from test_plugins import BUILTINS, DEPLOY_BUILTINS, TRAIN_BUILTINS

    assert _select_backends("all", reg) == TRAIN_BUILTINS
    assert _select_backends("all", reg, "inference") == [
        b for b in BUILTINS if b not in ("eager-fused", "compile-step")]
    # by name a backend is kept in any mode: its row says why it was skipped
    assert _select_backends("jit-freeze,eager-fused", reg) == ["jit-freeze", "eager-fused"]
    assert set(DEPLOY_BUILTINS) <= set(_select_backends("*", reg))
    bridged = _select_backends("dynamo:*", reg)
    assert "dynamo:aot_eager" in bridged and all(n.startswith("dynamo:") for n in bridged)
    assert _select_backends("compile,all,dynamo:aot_eager", reg) == ["compile"] + [b for b in TRAIN_BUILTINS if b != "compile"] + ["dynamo:aot_eager"]
    assert _select_backends("compile-max*", reg) == ["compile-max-autotune", "compile-max-autotune-no-cudagraphs"]


def test_plugins_command_lists_builtins_with_distribution(capsys):
    code, out, _ = _run(capsys, "plugins")
    assert code == 0
    assert "cnncompare.backends.torchscript" in out and "jit-trace, jit-script" in out
    import cnncompare

    assert f"cnncompare {cnncompare.__version__}" in out
    code, out, _ = _run(capsys, "plugins", "--json")
    assert code == 0 and '"hooks": [\n      "cnncompare_register_backends"' in out
    code, _, err = _run(capsys, "plugins", "--bogus")
    assert code == 2 and "unrecognized arguments: --bogus" in usage_error(err, "cnncompare list")


def test_the_commands_are_subcommands_and_a_bare_command_line_is_run(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert all(command in out for command in ("run", "list", "compare", "report", "docs"))
    code, out, _ = _run(capsys, "list", "backends", "--devices", "cpu")
    assert code == 0 and "compile-step" in out and "workload" not in out.splitlines()[0]
    code, out, _ = _run(capsys, "list", "workloads")
    assert code == 0 and out.startswith("seed-cnn (cnncompare.workloads.seed_cnn, the default): image_size=28")
    code, out, _ = _run(capsys, "list", "--json", "--devices", "cpu")
    listed = json.loads(out)
    assert {"backends", "workloads", "plugins"} == set(listed)
    assert next(b for b in listed["backends"] if b["name"] == "eager")["unavailable"] == {"cpu": None}
    code, _, err = _run(capsys, "run", "--seed", "x")  # the same run options, named or not
    assert code == 2 and "argument --seed: expected a whole number, got 'x'" in usage_error(err)


def test_dry_run_prints_the_plan_and_an_estimate_from_an_earlier_run_and_runs_nothing(capsys, tmp_path):
    from cnncompare.core.config import RunConfig, WorkloadSpec
    from cnncompare.core.records import Status
    from cnncompare.core.report.data import render_json
    from cnncompare.core.results import CellResult, RunReport

    # batch 3: no committed report under reports/ (where the estimate also looks) is of this job
    argv = ["--devices", "cpu", "--backends", "eager,compile-reduce-overhead", "--image-size", "8", "--batch-size", "3",
            "--dry-run", "--output", str(tmp_path / "runs" / "r.md")]
    code, out, _ = _run(capsys, *argv)
    assert code == 0 and "cpu: 2 cells x 2 rounds: eager, eager-control" in out
    assert "skipped compile-reduce-overhead (mode='reduce-overhead' records CUDA graphs" in out
    assert "Estimated time: unknown" in out and not (tmp_path / "runs").exists()
    workload = WorkloadSpec("seed-cnn", {"image_size": 8, "in_channels": 3, "num_classes": 10}, "image")
    earlier = RunReport(environment={"cpu": "CPU A"}, config=RunConfig(batch_size=3, workload=workload, rounds=1),
                        started_at="2026-12-06T08:00:00+00:00", finished_at="2026-12-06T08:02:00+00:00")
    earlier.results = [CellResult(backend=name, device="cpu", status=Status.OK) for name in ("eager", "compile")]
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "earlier.json").write_text(render_json(earlier))
    code, out, _ = _run(capsys, *argv)
    # 2 cell-rounds took 2 min: 2 cells x 2 rounds now (rounds beyond them stop at the budget)
    assert code == 0 and "Estimated time: about 4 min" in out
    assert "earlier.json: 2 cell-rounds took 2.0 min on CPU A" in out


def test_a_harness_failure_exits_3_and_keeps_the_report(capsys, tmp_path, monkeypatch):
    from cnncompare.core.run import orchestrate

    def broken(*args, **kwargs):
        raise RuntimeError("a bug in the harness")

    monkeypatch.setattr(orchestrate, "run_cells", broken)
    code, out, err = _run(capsys, "--devices", "cpu", "--backends", "eager", "--output", str(tmp_path / "r.md"))
    assert code == 3 and "a bug in the harness" in err
    assert "the harness failed: RuntimeError: a bug in the harness" in (tmp_path / "r.md").read_text()


def test_docs_prints_the_manual_by_topic(capsys):
    code, out, _ = _run(capsys, "docs")
    assert code == 0 and any(line.startswith("cli ") for line in out.splitlines())
    code, out, _ = _run(capsys, "docs", "cli")
    assert code == 0 and out.startswith("# The command line")
    code, _, err = _run(capsys, "docs", "nope")
    assert code == 2 and "unknown topic 'nope'" in usage_error(err, "cnncompare docs")
