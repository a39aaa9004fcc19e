"""The CUDA half end to end: only with a GPU (the declared ``cuda`` marker); skipped cleanly without.

Run by bench/gpu_check.sh on a GPU machine. CI has no GPU: there every test here skips.
"""
import pytest
import torch

from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry

pytestmark = [pytest.mark.cuda, pytest.mark.e2e,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def cuda_report():
    from _tiny import TINY
    from cnncompare.core.config import RunConfig

    config = RunConfig(backends=("eager", "compile", "compile-reduce-overhead"), devices=("cuda",), **TINY)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cuda:0")]), config, load_registry(entry_points=False), report)
    return report


def test_eager_compile_and_cuda_graphs_are_ok_with_parity_passed(cuda_report):
    rows = {r.backend: r for r in cuda_report.results}
    assert set(rows) == {"eager", "compile", "compile-reduce-overhead"}
    for r in rows.values():
        assert r.status is Status.OK, (r.backend, r.error, r.error_tail)
        assert r.parity.passed, (r.backend, r.parity.detail)
        assert r.device.startswith("cuda") and r.step_s.median > 0
        assert r.cuda_peak_allocated_mb and r.cuda_peak_allocated_mb > 0
        assert r.peak_gflops and 0 < r.pct_of_peak < 100, (r.backend, r.pct_of_peak, r.peak_precision)


def test_the_cuda_graph_mode_really_recorded_graphs(cuda_report):
    rows = {r.backend: r for r in cuda_report.results}
    dynamo = rows["compile-reduce-overhead"].dynamo
    assert dynamo.cudagraphs_recorded and dynamo.cudagraphs_recorded >= 1, dynamo
    assert rows["compile"].dynamo.cudagraphs_recorded == 0  # the default mode records none
