"""cnncompare-amp through cnncompare's public API: registration, devices, parity, the installed entry point."""
import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch

import cnncompare_amp
from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import run_cell
from cnncompare.plugins import load_registry

TINY = dict(batch_size=4, workload=WorkloadSpec("seed-cnn", {"image_size": 8}, "image"), steps=3, warmup=1, threads=1)
#: Where bf16's parity is judged: at 8x8, batch 4 the model fits its batch in two steps and
#: bf16's gradients of the near-zero loss are noise (see the plugin's docstring).
SMALL = dict(TINY, batch_size=32, workload=WorkloadSpec("seed-cnn", {"image_size": 14}, "image"), threads=2)


@pytest.fixture(autouse=True)
def _emulated_bf16_allowed(monkeypatch):
    """At 8x8, batch 4, emulated bf16 costs seconds: run it on any CPU (children inherit the variable)."""
    monkeypatch.setenv(cnncompare_amp.ENV_EMULATED_BF16, "1")


def test_emulated_bf16_is_skipped_by_default_with_the_reason(monkeypatch):
    monkeypatch.delenv(cnncompare_amp.ENV_EMULATED_BF16)
    reason = cnncompare_amp.AmpBf16().unavailable_reason(torch.device("cpu"))
    if cnncompare_amp.cpu_has_native_bf16():
        assert reason is None
    else:
        assert "no native bfloat16" in reason and cnncompare_amp.ENV_EMULATED_BF16 in reason


def test_registers_four_backends_in_process():
    reg = load_registry(extra_plugins=[cnncompare_amp], entry_points=False)
    names = [n for n, origin in reg.origin.items() if origin == "cnncompare_amp"]
    assert names == ["amp-bf16", "compile-amp-bf16", "amp-fp16", "compile-amp-fp16"]
    for name in names:
        assert "parity tolerance" in reg.get(name).description


def test_fp16_is_cuda_only_with_a_reason():
    assert "CUDA-only" in cnncompare_amp.AmpFp16().unavailable_reason(torch.device("cpu"))
    assert cnncompare_amp.AmpBf16().unavailable_reason(torch.device("cpu")) is None


def test_skipped_cell_says_why():
    r = run_cell(cnncompare_amp.AmpFp16(), "amp", DeviceSlot("cpu"), RunConfig(**TINY))
    assert r.status is Status.SKIPPED and "CUDA-only" in r.error


def test_bf16_passes_parity_by_its_own_tolerance_and_would_fail_the_default():
    r = run_cell(cnncompare_amp.AmpBf16(), "amp", DeviceSlot("cpu"), RunConfig(**SMALL))
    assert r.status is Status.OK, (r.error, r.error_tail)
    assert r.parity.passed and r.parity.tolerance == cnncompare_amp.BF16_TOLERANCE
    assert r.parity.margin <= 0.5, (r.parity.worst_tensor, r.parity.margin)
    # bf16 really is less accurate than fp32: judged by the default tolerance it would fail
    from cnncompare.backends.base import DEFAULT_PARITY_RTOL

    assert r.parity.worst_error > 5 * DEFAULT_PARITY_RTOL
    assert r.parity.grad_rel_error > 10 * r.parity.eager_grad_rel_error


class _SkipFirstUpdateBf16(cnncompare_amp.AmpBf16):
    name = "bf16-skip-first-update"

    def make_train_step(self, forward, optimizer, loss_fn):
        from cnncompare.core.cell.training import make_train_step

        real, calls = make_train_step(forward, optimizer, loss_fn), []

        def step(x, y):
            calls.append(1)
            if len(calls) == 1:  # gradients computed, the update skipped
                loss = loss_fn(forward(x), y)
                optimizer.zero_grad()
                loss.backward()
                return loss.detach()
            return real(x, y)

        return step


class _FrozenBatchNormBf16(cnncompare_amp.AmpBf16):
    name = "bf16-frozen-bn"

    def compile(self, model, example, device):
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.momentum = 0.0
        return super().compile(model, example, device)


@pytest.mark.parametrize("wrong", [_SkipFirstUpdateBf16, _FrozenBatchNormBf16])
def test_the_tolerance_still_catches_a_skipped_update_and_frozen_statistics(wrong):
    """(Not a gradient 10 % too large, nor log-probabilities 5 % off: bf16's own error is that size.)"""
    r = run_cell(wrong(), "amp", DeviceSlot("cpu"), RunConfig(**SMALL))
    assert r.status is Status.FAIL_ACCURACY, r.error


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fp16_with_grad_scaler_on_cuda():
    r = run_cell(cnncompare_amp.AmpFp16(), "amp", DeviceSlot("cuda:0"), RunConfig(**TINY))
    assert r.status is Status.OK and r.parity.passed, (r.error, r.error_tail)


def _installed():
    try:
        return version("cnncompare-amp")
    except PackageNotFoundError:
        return None


@pytest.mark.skipif(_installed() is None, reason="cnncompare-amp is not installed (pip install -e plugins/cnncompare-amp)")
def test_installed_entry_point_is_listed_and_can_be_hidden():
    def plugins(**env):
        base = {k: v for k, v in os.environ.items() if k != "CNNCOMPARE_PLUGINS"}
        proc = subprocess.run([sys.executable, "-m", "cnncompare", "plugins", "--json"],
                              capture_output=True, text=True, env={**base, **env}, check=True)
        return {p["name"]: p for p in json.loads(proc.stdout)}

    amp = plugins()["amp"]
    assert (amp["distribution"], amp["version"], amp["source"]) == ("cnncompare-amp", _installed(), "entry point")
    assert amp["backends"] == ["amp-bf16", "compile-amp-bf16", "amp-fp16", "compile-amp-fp16"]
    assert "amp" not in plugins(CNNCOMPARE_PLUGINS="")
    assert "amp" in plugins(CNNCOMPARE_PLUGINS="amp")
