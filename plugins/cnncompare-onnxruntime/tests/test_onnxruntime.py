"""cnncompare-onnxruntime through cnncompare's public API: registration, modes, parity, the entry point."""
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch

import cnncompare_onnxruntime
from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import run_cell
from cnncompare.plugins import load_registry

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

TINY = dict(batch_size=4, workload=WorkloadSpec("seed-cnn", {"image_size": 8}, "image"), steps=3, warmup=1,
            threads=1, rounds=1)


def _registry():
    return load_registry(extra_plugins=[cnncompare_onnxruntime], entry_points=False)


def test_onnxruntime_runs_the_seed_cnn_in_inference_with_parity_passed():
    backend = _registry().get("onnxruntime")
    r = run_cell(backend, "onnxruntime", DeviceSlot("cpu"), RunConfig(mode="inference", **TINY))
    if tuple(int(v) for v in torch.__version__.split(".")[:2]) < (2, 7):  # torch 2.6's exporter: BatchNorm fails
        assert r.status is Status.FAIL_COMPILE and "ConversionError" in r.error, (r.status, r.error)
        return
    assert r.status is Status.OK, (r.error, r.error_tail)
    assert r.parity.passed and r.parity.margin < 0.5 and r.parity.output_rel_error < 1e-5
    assert r.compile_s > 0  # the export and the session's creation


def test_token_ids_go_through_onnxruntime_too():
    workload = WorkloadSpec("transformer", {"seq_len": 8, "vocab": 50, "d_model": 16, "heads": 2, "layers": 1,
                                            "ff": 32}, "sequence", "token", 8)
    r = run_cell(_registry().get("onnxruntime"), "onnxruntime", DeviceSlot("cpu"),
                 RunConfig(mode="inference", **{**TINY, "workload": workload}))
    assert r.status is Status.OK and r.parity.passed, (r.error, r.error_tail)


def test_training_is_skipped_with_the_reason():
    r = run_cell(_registry().get("onnxruntime"), "onnxruntime", DeviceSlot("cpu"), RunConfig(**TINY))
    assert r.status is Status.SKIPPED and r.error == "onnxruntime runs in inference mode only, not train"


def test_installed_entry_point_registers_the_backend():
    try:
        version("cnncompare-onnxruntime")
    except PackageNotFoundError:
        pytest.skip("cnncompare-onnxruntime is not installed (pip install -e plugins/cnncompare-onnxruntime)")
    registry = load_registry()
    assert registry.origin["onnxruntime"] == "onnxruntime"
