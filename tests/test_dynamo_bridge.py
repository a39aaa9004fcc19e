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
