"""--nproc: each cell a torchrun job of two gloo ranks on the tiny config."""
import pytest

import fault_backends
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def ddp_report():
    from _tiny import TINY
    from cnncompare.core.config import RunConfig

    # aot-eager: dynamo under DDP (DDPOptimizer splits the graph at bucket boundaries) without
    # inductor's C++ builds, which cost a minute on 2 cores for two ranks and the single process.
    # The default cell timeout: alone this takes about 40 s (80 s on torch 2.6), but beside the
    # other xdist worker two gloo ranks on 2 cores took over 240 s there.
    config = RunConfig(backends=("eager", "aot-eager", "raise-rank1", "kill-rank1"), devices=("cpu",), nproc=2,
                       timeout_s=600, **TINY)
    registry = load_registry(extra_plugins=[fault_backends], entry_points=False)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, lambda rep: None)
    return {r.backend: r for r in report.results}


@pytest.mark.parametrize("backend", ["eager", "aot-eager"])
def test_ranks_agree_and_match_the_single_process_reference(ddp_report, backend):
    r = ddp_report[backend]
    assert r.status is Status.OK, (r.error, r.error_tail)
    assert r.parity.passed and "2 slices" in r.parity.reference
    assert 0 < r.parity.grad_rel_error < 1e-3  # a real comparison: fp32 ranks against float64
    d = r.distributed
    assert d.nproc == 2 and d.nproc_per_node == 2 and d.nnodes == 1 and d.process_group == "gloo"
    assert d.batch_size_per_rank == 4 and d.global_batch_size == 8 and d.threads_per_rank == 1
    assert d.ranks_identical is True and d.max_rank_weight_diff == 0.0
    assert len(d.rank_step_median_s) == 2
    assert d.slowest_rank_step_median_s == max(d.rank_step_median_s) == r.step_s.median
    assert d.global_images_per_s == pytest.approx(8 / r.step_s.median)
    assert d.single_process_status == "ok" and d.single_process_threads == 1
    assert d.scaling_efficiency == pytest.approx(d.single_process_step_median_s / r.step_s.median)
    assert r.threads == 1


def test_dynamo_under_ddp_reports_its_graphs(ddp_report):
    assert ddp_report["aot-eager"].dynamo.graphs >= 1


def test_a_rank_that_raises_fails_its_cell_only(ddp_report):
    r = ddp_report["raise-rank1"]
    assert r.status is Status.FAIL_RUN, (r.error, r.error_tail)
    assert r.error.startswith("rank 1: warmup: RuntimeError: deliberate failure on rank 1")


def test_a_rank_that_dies_ends_its_cell(ddp_report):
    r = ddp_report["kill-rank1"]
    assert r.status is Status.CRASHED, (r.error, r.error_tail)
    assert "torchrun" in r.error and "SIGKILL" in (r.error_tail or "")


def test_no_rank_outlives_its_cell(ddp_report):
    from _leftovers import leftover_cell_processes

    assert leftover_cell_processes() == []


def test_reference_for_two_slices_is_not_the_one_process_batch(tiny_config):
    """BatchNorm normalises each rank's slice alone, so DDP's step differs from one process
    training the global batch; the reference must be DDP's."""
    from dataclasses import replace

    import torch

    from cnncompare.core.cell.reference import trajectory
    from cnncompare.core.cell.training import Job
    from cnncompare.workloads.seed_cnn import SeedCNNWorkload

    config = tiny_config()
    at = frozenset({1, 3})
    sliced, _ = trajectory(Job(SeedCNNWorkload(), config), torch.device("cpu"), torch.float64, 3, at, shards=2)
    whole, _ = trajectory(Job(SeedCNNWorkload(), replace(config, batch_size=8)), torch.device("cpu"), torch.float64, 3, at)
    for key in ("step1/grad:features.0.weight", "step3/weight:features.0.weight"):
        assert not torch.allclose(sliced[key], whole[key], rtol=1e-6, atol=0)
    # DDP broadcasts rank 0's buffers: the running statistics are rank 0's slice's, not the batch's.
    key = "step1/buffer:features.1.running_mean"
    assert not torch.allclose(sliced[key], whole[key], rtol=1e-6, atol=0)


def test_two_nodes_meet_through_torchruns_rendezvous(tmp_path):
    """Two 'nodes' on this machine (one rank each) meet at a c10d rendezvous: the report of the
    node holding global rank 0 has the parity verdict, the other's says where it is; both have
    the job's figures."""
    import json
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen(
        [sys.executable, "-m", "cnncompare", "--backends", "eager", "--devices", "cpu", "--batch-size", "4",
         "--image-size", "8", "--steps", "3", "--warmup", "0", "--rounds", "1", "--round-time", "0", "--threads", "1", "--timeout", "180",
         "--nproc", "1", "--nnodes", "2", "--node-rank", str(rank), "--rdzv-endpoint", f"127.0.0.1:{port}",
         "--output", str(tmp_path / f"node{rank}.md")],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    errors = [p.communicate(timeout=400)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    node0, node1 = (json.loads((tmp_path / f"node{rank}.json").read_text())["results"][0] for rank in (0, 1))
    for row in (node0, node1):
        assert row["status"] == "ok", (row["error"], row["error_tail"])
        d = row["distributed"]
        assert d["nproc"] == 2 and d["nnodes"] == 2 and d["nproc_per_node"] == 1 and d["ranks_identical"] is True
        assert d["scaling_efficiency"] > 0
    # c10d numbers ranks by arrival, so either node may hold global rank 0
    judged, other = (node0, node1) if node0["parity"] else (node1, node0)
    assert judged["parity"]["passed"] and "2 slices" in judged["parity"]["reference"]
    assert other["parity"] is None and any("holds global rank 0" in n for n in other["notes"])
