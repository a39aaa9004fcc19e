import pytest
import torch

from cnncompare.core.run.devices import DeviceError, DeviceSlot, parse_devices, resolve_devices


@pytest.mark.parametrize("spec", ["tpu", "cpu,tpu", "cuda:x", "cpu:0", "", " , "])
def test_unknown_or_malformed_devices_are_usage_errors(spec):
    with pytest.raises(DeviceError):
        parse_devices(spec)


def test_all_is_cpu_plus_every_gpu():
    slots = resolve_devices(parse_devices("all"))
    assert slots[0] == DeviceSlot("cpu")
    assert [s.name for s in slots if s.name.startswith("cuda")] == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    assert all(s.unavailable is None for s in slots)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour")
def test_absent_known_kind_becomes_a_slot_with_a_reason():
    slots = resolve_devices(parse_devices("cpu,cuda,cuda:3,cpu"))
    assert [s.name for s in slots] == ["cpu", "cuda", "cuda:3"]
    assert slots[1].unavailable == "no CUDA device on this machine"
    assert "not present" in slots[2].unavailable
