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


def test_a_cuda_cell_forked_after_cuda_was_initialised_says_so_in_one_line(monkeypatch):
    from cnncompare.core.cell.main import cuda_unusable_after_fork

    assert cuda_unusable_after_fork("cuda:0") is None  # this process never initialised CUDA
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    reason = cuda_unusable_after_fork("cuda:0")
    assert "forked from a process that had initialised CUDA" in reason and "\n" not in reason
    assert cuda_unusable_after_fork("cpu") is None


def test_the_fork_server_preloads_nothing_that_initialises_cuda():
    import subprocess
    import sys

    from cnncompare.core.run.forkserver import PRELOAD

    code = ("import importlib, torch\n"
            f"for name in {PRELOAD!r}: importlib.import_module(name)\n"
            "print(torch.cuda.is_initialized())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_each_precision_has_its_own_peak_and_fp32_on_cuda_is_held_against_what_its_flops_run_in():
    """cuDNN's convolutions allow TF32 by default, matmuls don't: an fp32 row's peak is the
    FLOP-weighted mix of the two probes (checked without a GPU: only torch's flags are read)."""
    from cnncompare.core.cell.roofline import peak_for, peak_precision

    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    assert peak_precision("fp32", cpu, 0.3) == "fp32" and peak_precision("bf16", cpu, 0.3) == "bf16"
    # torch's switches are module properties (monkeypatch can't put them back): set and restore.
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    try:
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = True  # torch's defaults
        label = peak_precision("fp32", cuda, 0.25)
        assert label == "tf32 conv + fp32 matmul" and peak_precision("fp16", cuda, 0.25) == "fp16"
        # a quarter of the FLOPs at 400, three quarters at 50: time adds, not rate
        assert peak_for(label, {"tf32": 400.0, "fp32": 50.0}, 0.25) == pytest.approx(1 / (0.25 / 400 + 0.75 / 50))
        assert peak_precision("fp32", cuda, 0.0) == "fp32"  # a transformer: matmuls only
        assert peak_precision("fp32", cuda, 1.0) == "tf32"
        torch.set_float32_matmul_precision("high")  # matmuls in TF32 too
        assert peak_precision("fp32", cuda, 0.25) == "tf32"
        torch.set_float32_matmul_precision("highest")
        torch.backends.cudnn.allow_tf32 = False
        assert peak_precision("fp32", cuda, 0.25) == "fp32"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def test_the_bf16_peak_is_probed_in_bf16_and_cached_beside_fp32s(tmp_path):
    from _tiny import TINY
    from cnncompare.core.cell.roofline import roofline
    from cnncompare.core.cell.training import Job
    from cnncompare.core.config import RunConfig
    from cnncompare.workloads.seed_cnn import SeedCNNWorkload

    job = Job(SeedCNNWorkload(), RunConfig(**TINY))
    cache = str(tmp_path / "roofline.json")
    gflop, fp32, label = roofline(job, torch.device("cpu"), cache)
    assert label == "fp32" and fp32 > 0 and gflop > 0
    _, bf16, label = roofline(job, torch.device("cpu"), cache, "bf16")
    assert label == "bf16" and bf16 > 0
    import json

    data = json.loads((tmp_path / "roofline.json").read_text())
    assert data["peaks"] == {"fp32": fp32, "bf16": bf16}
    assert 0.05 < data["conv_share"] < 0.95  # seed-cnn: convolutions and two linear layers


def test_compile_workers_memory_is_sampled_from_the_process_tree():
    import subprocess
    import sys

    from cnncompare.core.cell.memory import DescendantsPeak

    watch = DescendantsPeak(interval_s=0.02).start()
    child = subprocess.Popen([sys.executable, "-c", "x = bytearray(60 * 2**20); import time; time.sleep(1)"])
    child.wait()
    assert watch.stop() > 60
    # no descendant: unknown, not zero (in a process of its own: this one keeps the fork server)
    alone = subprocess.run([sys.executable, "-c", "from cnncompare.core.cell.memory import DescendantsPeak; "
                            "print(DescendantsPeak().start().stop())"], capture_output=True, text=True, timeout=60)
    assert alone.stdout.strip() == "None", alone.stderr
