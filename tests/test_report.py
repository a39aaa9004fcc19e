import json
import subprocess
import sys
from dataclasses import replace

import pytest

from _tiny import TINY_WORKLOAD
from cnncompare.core.cell import memory
from cnncompare.core.config import RunConfig, malloc_supported
from cnncompare.core.records import Parity, Status
from cnncompare.core.report.data import render_json
from cnncompare.core.report.formatting import md_cell, md_code
from cnncompare.core.report.markdown import render_markdown
from cnncompare.core.results import CellResult, RunReport
from cnncompare.core.stats import StepStats

ENV = {"date": "2026-01-01T00:00:00+00:00", "cnncompare": "0.1.0", "torch": "2.13.0", "cpu": "Test CPU",
       "threads": 2, "gpus": []}
CONFIG = RunConfig(batch_size=4, workload=TINY_WORKLOAD, steps=5, warmup=1, rounds=3)


def _parity(passed=True):
    return Parity(passed=passed, reference="float64 eager, 3 steps", multiplier=5.0, tolerance=1e-2,
                  loss_rel_error=1e-7, grad_rel_error=2e-7, weight_rel_error=3e-4, eager_loss_rel_error=1e-7,
                  eager_grad_rel_error=2e-7, eager_weight_rel_error=3e-4, buffer_rel_error=1e-4,
                  worst_tensor="step3/weight:fc.weight", worst_error=1.2e-3, worst_limit=1e-2, margin=0.12 if passed else 3.0,
                  step=3, tensors=12, check_s=0.5, reference_s=2.0)


def _report(*results):
    return RunReport(environment=dict(ENV), config=CONFIG, results=list(results))


def test_tables_rank_ok_rows_and_show_derived_figures():
    eager = CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=1.0,
                       step_s=StepStats.from_samples([1.0, 1.0, 1.0]), parity=_parity())
    fast = CellResult(backend="fast", device="cpu", status=Status.OK, compile_s=2.0, first_step_s=5.0,
                      step_s=StepStats.from_samples([0.5, 0.5, 0.5]), parity=_parity())
    broken = CellResult(backend="broken", device="cpu", status=Status.FAIL_COMPILE, error="compile: RuntimeError: nope",
                        error_tail="Traceback ...\nRuntimeError: nope")
    md = render_markdown(_report(eager, broken, fast))
    section = md.split("## cpu")[1].split("##")[0]
    table = next(block for block in section.split("\n\n") if block.strip().startswith("|"))
    rows = [line for line in table.splitlines() if line.startswith("| ")][1:]
    assert [r.split("|")[1].strip() for r in rows] == ["fast", "eager", "broken"]
    assert "2.00x" in rows[0] and "pass (0.12)" in rows[0]
    # compile 2 s and a first step 4.5 s beyond a steady one: 6.5 s up front, at 0.5 s saved per step
    assert "pick **fast**, 0.5 s/step against eager's 1, 2.00x eager; its 6.5 s up front are repaid after 13 training steps." in md
    assert "### broken on cpu: fail\\_compile" in md or "### broken on cpu: fail_compile" in md
    assert "RuntimeError: nope" in md


def test_markdown_is_safe_from_what_plugins_print():
    evil = "ev|il\nname `x` <script>alert(1)</script>"
    r = CellResult(backend=evil, device="cpu", status=Status.FAIL_RUN, description="desc | with pipe", error=evil,
                   error_tail="``` closing fence\n<b>bold</b>", notes=["note | pipe\nnewline"])
    md = render_markdown(_report(r))
    assert "<script>" not in md
    assert "ev\\|il name \\`x\\` &lt;script&gt;" in md
    for line in md.splitlines():
        if line.startswith("| ev"):
            assert line.count("|") - line.count("\\|") == 8  # the main table's 7 columns, no extra cell
    assert "````text\n``` closing fence" in md  # the fence outgrows the backticks inside


def test_md_helpers():
    assert md_cell("a|b\r\nc") == "a\\|b c"
    assert md_code("plain").startswith("```text\n")


def test_json_has_the_documented_keys_and_no_nan():
    r = CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=1.0,
                   step_s=StepStats.from_samples([1.0, 2.0]), parity=_parity())
    r.parity.worst_error = float("nan")
    data = json.loads(render_json(_report(r)))
    assert {"environment", "config", "results", "interrupted", "schema_version"} <= set(data)
    row = data["results"][0]
    for key in ("backend", "device", "status", "compile_s", "first_step_s", "step_s", "images_per_s",
                "speedup_vs_eager", "break_even_steps", "peak_rss_mb", "cuda_peak_allocated_mb",
                "cuda_peak_reserved_mb", "parity", "error"):
        assert key in row
    assert set(row["step_s"]) >= {"median", "q1", "q3", "min", "max", "n", "samples"}
    assert row["parity"]["passed"] is True and row["parity"]["worst_error"] is None


def test_interrupted_report_says_so():
    rep = _report()
    rep.interrupted = True
    assert "**interrupted**" in render_markdown(rep)


def test_diagnostics_show_the_os_share_of_a_step():
    eager = CellResult(backend="eager", device="cpu", status=Status.OK, step_s=StepStats.from_samples([1.0]), parity=_parity(),
                       cpu_user_s_per_step=1.2, cpu_sys_s_per_step=0.531, page_faults_per_step=179266.0)
    fused = CellResult(backend="eager-fused", device="cpu", status=Status.OK, step_s=StepStats.from_samples([0.8]), parity=_parity(),
                       cpu_sys_s_per_step=0.0012, page_faults_per_step=12.0)
    md = render_markdown(_report(eager, fused))
    assert "page faults / step" in md and "kernel CPU s / step" in md
    diagnostics = md.split("Why (cpu)")[1].split("Parity (cpu)")[0]
    row = {line.split("|")[1].strip(): line for line in diagnostics.splitlines() if line.startswith("| eager")}
    assert "179k" in row["eager"] and "0.531" in row["eager"]
    assert "| 12 " in row["eager-fused"] and "0.0012" in row["eager-fused"]
    assert "31% of eager's CPU time is in the kernel" in md and "`--malloc reuse`" in md
    reused = _report(eager, fused)
    reused.config = replace(reused.config, malloc="reuse")  # the hint is for runs that still pay the faults
    assert "CPU time is in the kernel" not in render_markdown(reused)
    on_gpu = CellResult(backend="eager", device="cuda:0", status=Status.OK, step_s=StepStats.from_samples([0.01]), parity=_parity(),
                        cpu_user_s_per_step=0.01, cpu_sys_s_per_step=0.01)
    assert "CPU time is in the kernel" not in render_markdown(_report(on_gpu))  # the driver's, not faults


def test_os_usage_per_step_counts_fresh_pages():
    import mmap

    from cnncompare.core.cell.memory import per_step_usage, process_usage

    # A fresh anonymous mapping, each page touched once: the kernel maps and zeroes every one.
    # (Not a tensor: what backs an allocation depends on the process's history, and once, in a
    # pytest-xdist worker, a 64 MB tensor took no fault at all.)
    before = process_usage()
    pages = mmap.mmap(-1, 64 * 1024 * 1024)
    for offset in range(0, len(pages), mmap.PAGESIZE):
        pages[offset] = 1
    user_s, sys_s, faults = per_step_usage(before, process_usage(), 2)
    pages.close()
    assert faults > 0 and user_s + sys_s > 0  # (as few as 32 faults where huge pages back the mapping)


_ALLOCATED = """
import sys, torch
from cnncompare.core.cell.memory import allocated_peak_mb
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
optimizer = torch.optim.Adam(model.parameters())
def step():
    optimizer.zero_grad()
    held = torch.ones(16 * 1024 * 1024) if sys.argv[1] == "temporary" else None  # 64 MB through the step
    model(torch.randn(64, 512)).logsumexp(1).mean().backward()
    optimizer.step()
    del held
for _ in range(3):
    step()
print(allocated_peak_mb(step))
"""


@pytest.mark.skipif(not memory.heap_in_use_known(), reason="the allocated peak needs glibc 2.33+")
def test_the_allocated_peak_is_the_same_in_every_process_and_counts_a_steps_tensors():
    def peak(variant):
        return float(subprocess.run([sys.executable, "-c", _ALLOCATED, variant], capture_output=True, text=True,
                                    check=True).stdout.split()[-1])

    plain = [peak("plain") for _ in range(2)]
    assert plain[0] > 1 and abs(plain[0] - plain[1]) < 0.05  # no heap in it: the same in both processes
    assert peak("temporary") - plain[0] == pytest.approx(64, abs=1)


_REALLOCATE = """
import resource, sys, torch
from cnncompare.core.cell.memory import use_malloc
use_malloc(sys.argv[1])
for _ in range(8):  # the heap grows until freed blocks coalesce into one that fits the aligned request
    torch.ones(16 * 1024 * 1024)
faults = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 * 1024 * 1024)  # 64 MB, freed at once: above glibc's largest mmap threshold
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(sorted(faults)[2])  # the median: the heap may still grow once (seen in CI), as a loop's first steps do
"""


@pytest.mark.skipif(malloc_supported("reuse") is not None, reason="--malloc reuse needs glibc")
def test_malloc_reuse_keeps_freed_memory_so_a_reallocation_costs_no_page_faults():
    # A subprocess: mallopt changes the whole process, and pytest's must stay as users' is.
    faults = {policy: float(subprocess.run([sys.executable, "-c", _REALLOCATE, policy], capture_output=True,
                                           text=True, check=True).stdout)
              for policy in ("system", "reuse")}
    pages = 64 * 1024 * 1024 // 4096
    assert faults["system"] > 0.9 * pages  # mapped and zeroed anew each time
    assert faults["reuse"] < 0.05 * pages  # the freed block is handed out again


def test_malloc_policy_is_checked_against_this_machine(monkeypatch):
    from cnncompare.core.config import ConfigError

    RunConfig(malloc="system").check_here()  # the C library as it is: always possible
    monkeypatch.setattr("cnncompare.core.config.sys.platform", "darwin")
    with pytest.raises(ConfigError, match="--malloc: reuse: needs Linux with glibc"):
        RunConfig(malloc="reuse").check_here()
    memory.use_malloc("system")  # nothing to do


def test_up_front_costs_within_a_step_of_eagers_are_nothing_to_repay():
    eager = CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=1.0,
                       step_s=StepStats.from_samples([1.0, 1.0, 1.0]), parity=_parity())
    quick = CellResult(backend="quick", device="cpu", status=Status.OK, compile_s=0.2, first_step_s=0.5,
                       step_s=StepStats.from_samples([0.5, 0.5, 0.5]), parity=_parity())
    md = render_markdown(_report(eager, quick))
    assert "2.00x eager, with no extra up-front cost." in md and "| none to repay " in md
    quick.compile_s = 1.2  # beyond one of eager's steps: 1.2 s at 0.5 s saved per step
    assert "its 1.2 s up front are repaid after 3 training steps." in render_markdown(_report(eager, quick))


def test_an_inference_report_speaks_of_forwards_and_shows_a_tiny_margin():
    eager = CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=1.0,
                       step_s=StepStats.from_samples([1.0, 1.0, 1.0]), parity=replace(_parity(), margin=3.4e-6))
    quick = CellResult(backend="quick", device="cpu", status=Status.OK, compile_s=1.2, first_step_s=0.5,
                       step_s=StepStats.from_samples([0.5, 0.5, 0.5]), parity=_parity())
    report = RunReport(environment=dict(ENV), config=replace(CONFIG, mode="inference", batch_size=1),
                       results=[eager, quick])
    md = render_markdown(report)
    assert "- **batch**: 1 image\n" in md and "repaid after 3 forwards." in md
    legend = md.split("## How to read this")[1].split("## Environment")[0]
    assert "training" not in legend.split("**scaling efficiency**")[0]  # step, first step, break-even
    assert "one forward of the batch" in legend and "the backend's forward against float64 eager's" in legend
    assert "pass (3.4e-06)" in md  # not "0.00", which reads as no error at all
    train = render_markdown(_report(eager, quick))
    assert "one training step (forward" in train and "the backend's training against float64" in train


def test_the_table_says_what_each_row_computes_in_and_the_summary_ranks_another_precision_apart():
    from dataclasses import replace

    eager = CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=1.0,
                       step_s=StepStats.from_samples([1.0, 1.0, 1.0]),
                       parity=replace(_parity(), precision="fp32", declared_precision="fp32"))
    silent = CellResult(backend="silent", device="cpu", status=Status.OK, compile_s=1.0, first_step_s=1.0,
                        step_s=StepStats.from_samples([0.4, 0.4, 0.4]),
                        parity=replace(_parity(), precision="bf16", declared_precision="fp32", random=True))
    md = render_markdown(_report(eager, silent))
    assert "| computes in" in md and "bf16 (declares fp32)" in md
    assert "At another precision than eager's (fp32): **silent** at 2.50x" in md
    assert "draws random numbers" in md  # a workload with dropout says how it was judged and timed
