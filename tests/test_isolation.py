"""Faults: each misbehaving backend costs its own cell only, with the right status."""

import pytest

import fault_backends
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry

pytestmark = pytest.mark.e2e

FAULTS = ["raise-compile", "raise-step4", "hang", "abort", "segfault", "nan-loss", "wrong-numbers", "memory-hog",
          "swell-in-steps", "minimal"]


@pytest.fixture(scope="module")
def fault_report():
    from _tiny import TINY
    from cnncompare.core.config import RunConfig

    config = RunConfig(backends=("eager", *FAULTS), devices=("cpu",), timeout_s=12, max_memory_mb=1500, **TINY)
    registry = load_registry(extra_plugins=[fault_backends], entry_points=False)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, lambda rep: None)
    return {r.backend: r for r in report.results}


@pytest.mark.parametrize("backend, status, fragment", [
    ("raise-compile", Status.FAIL_COMPILE, "compile: RuntimeError: deliberate failure in compile"),
    ("raise-step4", Status.FAIL_RUN, "steps: RuntimeError: deliberate failure in step 4"),  # 1 first, 2-3 warm-up
    ("hang", Status.TIMEOUT, "timed out after 12 s"),
    ("abort", Status.CRASHED, "SIGABRT"),
    ("segfault", Status.CRASHED, "SIGSEGV"),
    ("nan-loss", Status.FAIL_ACCURACY, "non-finite loss at step 1"),
    ("wrong-numbers", Status.FAIL_ACCURACY, "parity: "),
    ("memory-hog", Status.OOM, "--max-memory 1500 MB"),
    # In its measured steps, while the parent drives the warm pairs, not watches the child.
    ("swell-in-steps", Status.OOM, "--max-memory 1500 MB"),
])
def test_fault_gets_its_status_and_a_one_line_reason(fault_report, backend, status, fragment):
    r = fault_report[backend]
    assert r.status is status, (r.error, r.error_tail)
    assert fragment in r.error
    assert r.speedup_vs_eager is None


def test_plugin_name_is_in_a_compile_failure(fault_report):
    assert fault_report["raise-compile"].error.startswith("plugin 'fault_backends': ")
    tail = fault_report["raise-compile"].error_tail
    assert "fault_backends.py" in tail and tail.endswith("RuntimeError: deliberate failure in compile")


def test_wrong_numbers_still_have_timings_and_a_failed_parity(fault_report):
    r = fault_report["wrong-numbers"]
    assert r.step_s is not None and r.parity is not None and not r.parity.passed
    assert r.parity.loss_rel_error > 1e-3


def test_other_cells_are_intact(fault_report):
    for name in ("eager", "minimal"):
        r = fault_report[name]
        assert r.status is Status.OK and r.parity.passed, r.error
        assert r.step_s.n == 5
    assert fault_report["minimal"].speedup_vs_eager > 0


def test_no_child_outlives_its_cell(fault_report):
    from _leftovers import leftover_cell_processes

    # the hanging, aborting and memory-hogging cells' processes were killed
    assert leftover_cell_processes() == []


def test_unpicklable_backend_is_found_again_through_the_plugins(tiny_config):
    from cnncompare.core.run.orchestrate import run_cell

    # The child reloads plugins from entry points, where this in-process one does not exist:
    # the cell must fail cleanly, naming the problem, not hang or crash the run.
    backend = fault_backends.Unpicklable()
    r = run_cell(backend, "test", DeviceSlot("cpu"), tiny_config(backends=("unpicklable",)))
    assert r.status is Status.FAIL_COMPILE
    assert "'unpicklable' can't be pickled" in r.error and "lambda" in r.error


def test_memory_watch_survives_a_cell_that_exits_between_two_looks(monkeypatch):
    """A forked cell is reaped by the fork server, not by us: it can vanish between our
    ``poll()`` and the look at its tree (psutil raised NoSuchProcess there in CI)."""
    import os
    import subprocess
    import sys

    import psutil

    from cnncompare.core.run import launch

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert launch.tree_rss_mb(gone.pid) == 0.0

    def vanished(self, recursive=False):
        raise psutil.NoSuchProcess(self.pid)

    monkeypatch.setattr(psutil.Process, "children", vanished)
    assert launch.tree_rss_mb(os.getpid()) == 0.0


def test_the_fork_server_imports_torch_under_each_cells_import_time_settings(tmp_path):
    """torch reads TORCHINDUCTOR_FX_GRAPH_CACHE (and the like) when the server imports it, not in
    the forked child: a cell asking for another value gets a server started with it; one that
    differs only in what torch reads when used (its cache directory) shares the running one."""
    import os
    import time

    from cnncompare.core.run.forkserver import ForkServer

    server = ForkServer()

    def start(**extra) -> None:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "cache"), **extra}
        pid = server.start_child(str(tmp_path / "no-order.pkl"), env, str(tmp_path), str(tmp_path / "log"))
        while server.poll(pid) is None:  # the child fails on the missing order, soon
            time.sleep(0.05)

    def server_env() -> str:
        with open(f"/proc/{server.pid}/environ", "rb") as f:
            return f.read().decode(errors="replace")

    try:
        start()
        first = server.pid
        start(TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "other"))
        assert server.pid == first
        start(TORCHINDUCTOR_FX_GRAPH_CACHE="0")
        assert server.pid != first and "TORCHINDUCTOR_FX_GRAPH_CACHE=0" in server_env().split("\0")
    finally:
        server.close()


def test_a_renewed_fork_server_is_a_new_process_image():
    """``--fork-server per-round``'s premise: a forked child is a copy of its server's address
    space, so every child of one server has its layout (ASLR: where the C library and the heap
    lie); ``renew`` starts a new server, whose layout is drawn anew."""
    import os

    from cnncompare.core.run.forkserver import ForkServer

    with open("/proc/sys/kernel/randomize_va_space") as f:
        if f.read().strip() == "0":
            pytest.skip("address-space layout randomization is off on this machine")
    server = ForkServer()

    def layout() -> list[str]:
        with open(f"/proc/{server.pid}/maps") as f:
            return sorted(line.split()[0] for line in f if "libc" in line or "[heap]" in line)

    try:
        assert server.renew(dict(os.environ)) > 0
        first, where = server.pid, layout()
        assert where and server.renew(dict(os.environ)) > 0
        assert server.pid != first and layout() != where
    finally:
        server.close()
