"""The bridge to torch.compile's own backend registry."""
import pytest
import torch

from cnncompare.backends.dynamo_bridge import DynamoBackend, dynamo_backend_names
from cnncompare.core.records import Status
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import run_cell


def test_every_listed_torch_backend_is_offered_but_not_in_all():
    names = dynamo_backend_names()
    assert {"aot_eager", "inductor"} <= set(names)
    assert not any("TESTING_ONLY" in n for n in names)
    assert DynamoBackend("aot_eager").in_all is False


def test_missing_dependency_is_a_reason():
    reason = DynamoBackend("tvm").unavailable_reason(torch.device("cpu"))
    try:
        import tvm  # noqa: F401
    except Exception:
        assert "needs the 'tvm' package" in reason
    if not torch.cuda.is_available():
        assert "CUDA devices only" in DynamoBackend("cudagraphs").unavailable_reason(torch.device("cpu"))


@pytest.mark.e2e
def test_a_bridged_backend_runs_and_matches(tiny_config):
    # dynamo's own "eager" backend: the bridge end to end at the least compile cost
    # (aot_eager runs in the built-in aot-eager test).
    r = run_cell(DynamoBackend("eager"), "cnncompare.backends.dynamo_bridge", DeviceSlot("cpu"), tiny_config())
    assert r.status is Status.OK and r.parity.passed, (r.error, r.error_tail)


def test_backend_options_reach_torch_compile_and_the_description(monkeypatch):
    seen = {}
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: seen.update(kwargs) or model)
    bridged = DynamoBackend("openvino")
    bridged.compile(torch.nn.Identity(), None, torch.device("cpu"))
    assert seen == {"backend": "openvino", "options": None}  # torch.compile's own default
    bridged.configure({"aot_autograd": True})
    bridged.compile(torch.nn.Identity(), None, torch.device("cpu"))
    assert seen["options"] == {"aot_autograd": True}
    assert "options={'aot_autograd': True}" in bridged.description


@pytest.mark.e2e
def test_a_backend_option_reaches_the_cell(tiny_config):
    # tests/fault_backends' `scaled` multiplies its outputs by its option `factor` (1 by default,
    # correct): 1.05 given as a backend option must arrive in the cell and fail parity there.
    import fault_backends

    config = tiny_config(mode="inference", backend_options={"scaled": {"factor": 1.05}})
    r = run_cell(fault_backends.Scaled(), "fault_backends", DeviceSlot("cpu"), config)
    assert r.status is Status.FAIL_ACCURACY and "parity" in r.error, (r.error, r.error_tail)
