"""cnncompare-amp through cnncompare's public API: registration, devices, parity, the installed entry point."""
import json
import os
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version

import pytest
import torch

import cnncompare
import cnncompare_amp
from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cell, run_cells
from cnncompare.plugins import load_registry

TINY = dict(batch_size=4, workload=WorkloadSpec("seed-cnn", {"image_size": 8}, "image"), steps=3, warmup=1, threads=1)
#: Where bf16's parity is judged: at 8x8, batch 4 the model fits its batch in two steps and
#: bf16's gradients of the near-zero loss are noise (see the plugin's docstring).
SMALL = dict(TINY, batch_size=16, workload=WorkloadSpec("seed-cnn", {"image_size": 14}, "image"), threads=2)


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
        assert "parity held to" in reg.get(name).description


def test_fp16_is_cuda_only_with_a_reason():
    assert "CUDA-only" in cnncompare_amp.AmpFp16().unavailable_reason(torch.device("cpu"))
    assert cnncompare_amp.AmpBf16().unavailable_reason(torch.device("cpu")) is None


def test_skipped_cell_says_why():
    r = run_cell(cnncompare_amp.AmpFp16(), "amp", DeviceSlot("cpu"), RunConfig(**TINY))
    assert r.status is Status.SKIPPED and "CUDA-only" in r.error


class _GradTimes1_1Bf16(cnncompare_amp.AmpBf16):
    """The largest weight's gradient 10 % too large: bf16's own error on it is about that size."""

    name = "bf16-grad-x1.1"

    def compile(self, model, example, device):
        max((p for p in model.parameters() if p.dim() > 1), key=lambda p: p.numel()).register_hook(lambda g: g * 1.1)
        return super().compile(model, example, device)


class _OtherBetasBf16(cnncompare_amp.AmpBf16):
    name = "bf16-adam-betas"

    def make_optimizer(self, params, lr):
        return torch.optim.Adam(params, lr=lr, betas=(0.8, 0.99))


class _DoubleLrBf16(cnncompare_amp.AmpBf16):
    name = "bf16-lr-x2"

    def make_optimizer(self, params, lr):
        return torch.optim.Adam(params, lr=2 * lr)


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


WRONG_BF16 = (_GradTimes1_1Bf16, _OtherBetasBf16, _DoubleLrBf16, _SkipFirstUpdateBf16, _FrozenBatchNormBf16)


class _WrongBf16:
    """A plugin registering the wrong bf16 backends."""

    @cnncompare.hookimpl
    def cnncompare_register_backends(self, register):
        for cls in WRONG_BF16:
            register(cls())


def test_bf16_is_held_to_bf16s_own_error_and_every_wrong_bf16_backend_fails():
    """One run (one shared reference), at batch 16, 14x14: amp-bf16 and compile-amp-bf16 pass with
    margin and are measured as bf16; each wrong bf16 backend fails, the gradient 10 % too large by
    the scale of its step-1 gradient (fp32 can't resolve that gradient's norm at this size, its
    scale it can) and the other betas by the scale of its last update (bf16's drift over the
    earlier steps is larger than one update, so the weights themselves can't show it)."""
    registry = load_registry(extra_plugins=[cnncompare_amp, _WrongBf16()], entry_points=False)
    config = RunConfig(**SMALL, backends=("eager", "amp-bf16", "compile-amp-bf16") + tuple(cls.name for cls in WRONG_BF16),
                       devices=("cpu",), rounds=1)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, on_result=lambda rep: None)
    rows = {r.backend: r for r in report.results}
    for name in ("amp-bf16", "compile-amp-bf16"):
        row = rows[name]
        assert row.status is Status.OK and row.parity.passed, (name, row.error, row.error_tail)
        assert row.parity.margin <= 0.5, (name, row.parity.worst_tensor, row.parity.margin)
        assert row.parity.precision == "bf16" == row.parity.declared_precision
    amp = rows["amp-bf16"]
    assert rows["eager"].parity.precision == "fp32"
    assert amp.parity.grad_rel_error > 10 * amp.parity.eager_grad_rel_error  # bf16 really is coarser
    for cls in WRONG_BF16:
        r = rows[cls.name]
        # Beyond bf16's own rounding freedom (eager perturbed by one bf16 ulp) by a clear factor: a
        # gradient x 1.1 is the nearest, at 2.0x here (reports/parity-margins.md).
        assert r.status is Status.FAIL_ACCURACY and r.parity.margin > 1.3, (cls.name, r.status, r.error)
    assert rows["bf16-grad-x1.1"].parity.worst_tensor.startswith("scale of step1/grad:")
    assert rows["bf16-adam-betas"].parity.worst_tensor.startswith("scale of step3/update:")
    # the verdict ranks amp-bf16 apart from the fp32 rows
    verdict = report.verdicts["cpu"]
    assert verdict.precision == "fp32" and all(name != "amp-bf16" for name in verdict.tied_with)


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
