"""Nothing lost: Ctrl-C / SIGTERM keep finished cells, kill the running child, and --resume continues."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.e2e

DRIVER = Path(__file__).parent / "run_cli_with_test_plugins.py"
TINY_ARGS = ["--devices", "cpu", "--batch-size", "4", "--image-size", "8", "--steps", "3", "--warmup", "0", "--rounds", "1",
             "--round-time", "0", "--threads", "1",
             "--no-control"]


def _start(tmp_path, backends, *extra, env=None):
    return subprocess.Popen(
        [sys.executable, str(DRIVER), "--backends", backends, *TINY_ARGS,
         "--output", str(tmp_path / "run.md"), "--json", str(tmp_path / "run.json"), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )


def _gone(pid):
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited; nobody reaped it yet
    except psutil.NoSuchProcess:
        return True


def _wait_for(predicate, timeout=120):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signal_keeps_finished_cells_and_kills_the_running_child(tmp_path, sig, code):
    pid_file = tmp_path / "hang.pid"
    proc = _start(tmp_path, "eager,hang", env={"CNNCOMPARE_TEST_PID_FILE": str(pid_file)})
    _wait_for(pid_file.exists)  # eager finished, the hanging cell is running
    child_pid = int(pid_file.read_text())
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "interrupted" in err and "--resume" in err
    data = json.loads((tmp_path / "run.json").read_text())
    assert data["interrupted"] is True
    assert [(r["backend"], r["status"]) for r in data["results"]] == [("eager", "ok")]
    assert "**interrupted**" in (tmp_path / "run.md").read_text()
    assert _gone(child_pid)


@pytest.mark.parametrize("extra", [[], ["--nproc", "2"]], ids=["forked", "torchrun"])
def test_a_run_killed_with_sigkill_leaves_no_cell_behind(tmp_path, extra):
    """SIGKILL reaches no handler: the cells must die by themselves (PR_SET_PDEATHSIG), the fork
    server, torchrun and its ranks included."""
    from _leftovers import leftover_cell_processes

    pid_file = tmp_path / "hang.pid"
    proc = _start(tmp_path, "hang", *extra, env={"CNNCOMPARE_TEST_PID_FILE": str(pid_file)})
    _wait_for(pid_file.exists)  # the cell is running (under torchrun: a rank is)
    child_pid = int(pid_file.read_text())
    assert psutil.pid_exists(child_pid)
    proc.kill()
    proc.communicate(timeout=30)
    _wait_for(lambda: _gone(child_pid), timeout=30)  # SIGKILLed: its memory is torn down, then it is gone
    _wait_for(lambda: leftover_cell_processes() == [], timeout=30)


def test_resume_keeps_finished_cells_and_runs_the_rest(tmp_path):
    first = {"backend": "eager", "wall_s": None}
    proc = _start(tmp_path, "eager")
    proc.communicate(timeout=300)
    assert proc.returncode == 0
    data = json.loads((tmp_path / "run.json").read_text())
    first["wall_s"] = data["results"][0]["wall_s"]
    data["interrupted"] = True  # as an interrupted run would leave it
    (tmp_path / "run.json").write_text(json.dumps(data))

    proc = subprocess.run(
        [sys.executable, str(DRIVER), "--backends", "eager,minimal", *TINY_ARGS, "--resume", str(tmp_path / "run.json")],
        capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "eager on cpu" not in proc.stderr  # not run again
    data = json.loads((tmp_path / "run.json").read_text())
    assert [r["backend"] for r in data["results"]] == ["eager", "minimal"]
    assert data["results"][0]["wall_s"] == first["wall_s"]
    assert data["interrupted"] is False
    assert data["results"][1]["speedup_vs_eager"] is not None
    assert (tmp_path / "run.md").exists()


def test_resume_refuses_a_changed_config(tmp_path):
    from _tiny import TINY_WORKLOAD
    from cnncompare.core.config import RunConfig
    from cnncompare.core.report.data import render_json
    from cnncompare.core.results import RunReport
    from cnncompare.core.run.environment import capture

    config = RunConfig(backends=("eager",), batch_size=4, workload=TINY_WORKLOAD, steps=3, warmup=0, threads=1)
    saved = tmp_path / "run.json"
    saved.write_text(render_json(RunReport(environment=capture(1), config=config, interrupted=True)))
    changed = [*TINY_ARGS[:-2], "2", "--no-control"]  # --threads 2
    proc = subprocess.run(
        [sys.executable, str(DRIVER), "--backends", "eager", *changed, "--resume", str(saved)],
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    assert "--resume: refused" in proc.stderr and "threads: 1 → 2" in proc.stderr
    assert json.loads(saved.read_text())["results"] == []  # nothing was run or written


def test_failed_cells_are_results_and_the_run_exits_0_unless_fail_on_names_their_status(tmp_path):
    proc = _start(tmp_path, "eager,raise-compile")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    data = json.loads((tmp_path / "run.json").read_text())
    assert [(r["backend"], r["status"]) for r in data["results"]] == [("eager", "ok"), ("raise-compile", "fail_compile")]
    report = (tmp_path / "run.md").read_text()
    assert "deliberate failure in compile" in report
    # stdout is the summary; the whole report is in the file (--print-report prints it)
    assert "## Summary" in report and "**cpu**" in out and "How to read this" not in out and "How to read this" in report
    # The same finished run, resumed (nothing left to run) with a CI gate: exit 1, naming the cell.
    gate = _start(tmp_path, "eager,raise-compile", "--resume", str(tmp_path / "run.json"), "--fail-on", "failed")
    _, err = gate.communicate(timeout=300)
    assert gate.returncode == 1, err
    assert "--fail-on: 1 cell(s) ended in a failing status: raise-compile on cpu: fail_compile" in err
