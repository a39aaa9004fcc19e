"""--mode inference: every built-in that supports it end to end at the tiny config, the mode
skips, wrong outputs failing parity, latency percentiles, and the refusals (docs/inference.md)."""
import json
import subprocess
import sys

import pytest
import torch

import wrong_backends
from _tiny import TINY
from cnncompare.backends import base
from cnncompare.core.config import ConfigError, RunConfig
from cnncompare.core.records import Status
from cnncompare.core.results import SCHEMA_VERSION, RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cell, run_cells
from cnncompare.core.stats import StepStats
from cnncompare.plugins import load_registry

INFERENCE_BUILTINS = ("eager", "channels-last", "jit-trace", "jit-script", "jit-freeze", "compile",
                      "compile-freezing", "compile-channels-last", "compile-max-autotune-no-cudagraphs", "aot-eager",
                      "export-aot-inductor")
TRAIN_ONLY = ("eager-fused", "compile-step")


def _run(config: RunConfig):
    registry = load_registry(extra_plugins=[wrong_backends], entry_points=False)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, on_result=lambda rep: None)
    return report, {r.backend: r for r in report.results}


@pytest.mark.e2e
def test_every_inference_builtin_is_ok_with_parity_passed_and_train_only_ones_skip(tiny_config):
    config = tiny_config(mode="inference", backends=INFERENCE_BUILTINS + TRAIN_ONLY, devices=("cpu",), steps=4)
    report, rows = _run(config)
    for name in INFERENCE_BUILTINS:
        r = rows[name]
        assert r.status is Status.OK, (name, r.error, r.error_tail)
        assert r.parity.passed and r.parity.reference == "float64 eager forward (eval mode)", (name, r.parity)
        assert r.parity.output_rel_error is not None and r.parity.grad_rel_error is None
        assert r.parity.margin <= 0.5, (name, r.parity.worst_tensor, r.parity.margin)
        assert r.latency_p50_s <= r.latency_p90_s <= r.latency_p99_s <= r.step_s.max
        assert len(r.step_s.samples) == 4
    for name in TRAIN_ONLY:
        assert rows[name].status is Status.SKIPPED and "train mode only" in rows[name].error
    # The forward's FLOPs, not forward + backward: about a third of a training step's.
    train = RunConfig(**{**config.__dict__, "mode": "train"})
    from cnncompare.core.cell.roofline import step_gflop
    from cnncompare.core.cell.training import Job
    from cnncompare.workloads.seed_cnn import SeedCNNWorkload

    forward, whole = (step_gflop(Job(SeedCNNWorkload(), c), torch.device("cpu"))[0] for c in (config, train))
    assert rows["eager"].gflop_per_step == pytest.approx(forward) and 0.25 < forward / whole < 0.5
    data = json.loads(report.to_json())
    assert data["config"]["mode"] == "inference" and data["schema_version"] == SCHEMA_VERSION
    assert {"latency_p50_s", "latency_p90_s", "latency_p99_s"} <= set(data["results"][0])


@pytest.mark.e2e
def test_wrong_outputs_fail_parity(tiny_config):
    wrong = tuple(cls.name for cls in wrong_backends.WRONG_INFERENCE)
    _, rows = _run(tiny_config(mode="inference", backends=("eager",) + wrong, devices=("cpu",), steps=2))
    assert rows["eager"].status is Status.OK
    for name in wrong:
        r = rows[name]
        assert r.status is Status.FAIL_ACCURACY and not r.parity.passed, (r.backend, r.status, r.error)
        assert r.parity.margin > 2 and r.error.startswith("parity: ")


def test_inference_only_backend_is_skipped_in_training_with_the_reason(tiny_config):
    registry = load_registry(entry_points=False)
    r = run_cell(registry.get("jit-freeze"), "cnncompare", DeviceSlot("cpu"), tiny_config())
    assert r.status is Status.SKIPPED and r.error == "jit-freeze runs in inference mode only, not train"
    assert base.modes(registry.get("eager")) == ("train", "inference")  # the default


def test_steps_default_per_mode_and_ddp_is_refused_in_inference():
    assert RunConfig().steps == 4 and RunConfig(mode="inference").steps == 20
    assert RunConfig(mode="inference", steps=3).steps == 3
    with pytest.raises(ConfigError, match="--nproc: DistributedDataParallel is a training technique"):
        RunConfig(mode="inference", nproc=2)
    with pytest.raises(ConfigError, match="--mode: must be one of train, inference"):
        RunConfig(mode="serving")
    assert RunConfig.from_dict({k: v for k, v in RunConfig().to_dict().items() if k != "mode"}).mode == "train"


def test_latency_percentiles_interpolate_between_order_statistics():
    s = StepStats.from_samples([4.0, 1.0, 3.0, 2.0, 5.0])
    assert (s.percentile(50), s.percentile(90), s.percentile(99), s.percentile(100)) == \
        (3.0, pytest.approx(4.6), pytest.approx(4.96), 5.0)


def test_compare_and_resume_refuse_to_mix_modes(tmp_path):
    train = RunReport(environment={}, config=RunConfig())
    inference = RunReport(environment={}, config=RunConfig(mode="inference"))
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(train.to_json())
    b.write_text(inference.to_json())
    cli = [sys.executable, "-m", "cnncompare"]
    proc = subprocess.run(cli + ["compare", str(a), str(b)], capture_output=True, text=True)
    assert proc.returncode == 2 and "different modes (train vs inference)" in proc.stderr
    proc = subprocess.run(cli + ["--mode", "inference", "--backends", "eager", "--devices", "cpu", "--resume", str(a),
                                 "--output", str(tmp_path / "r.md")], capture_output=True, text=True)
    assert proc.returncode == 2 and "mode: 'train' → 'inference'" in proc.stderr


def test_inference_models_get_seeded_batchnorm_statistics_but_a_trained_model_keeps_its_own():
    """A never-trained BatchNorm is the identity in eval mode, which would hide a wrong fold."""
    from torch import nn

    from cnncompare.core.cell.training import Job, seed_normalization
    from cnncompare.workloads.seed_cnn import SeedCNNWorkload

    config = RunConfig(**{**TINY, "mode": "inference"})
    models = [Job(SeedCNNWorkload(), config).build_model(torch.device("cpu")) for _ in range(2)]
    norms = [[m for m in model.modules() if isinstance(m, nn.BatchNorm2d)] for model in models]
    for bn in norms[0]:
        assert bn.running_mean.abs().min() > 0 and not torch.allclose(bn.running_var, torch.ones_like(bn.running_var))
        assert not torch.allclose(bn.weight, torch.ones_like(bn.weight)) and bn.bias.abs().max() > 0
    for a, b in zip(*norms):  # seeded: the same numbers every time
        assert torch.equal(a.running_var, b.running_var) and torch.equal(a.bias, b.bias)
    train = Job(SeedCNNWorkload(), RunConfig(**TINY)).build_model(torch.device("cpu"))
    assert all(torch.equal(m.running_var, torch.ones_like(m.running_var))
               for m in train.modules() if isinstance(m, nn.BatchNorm2d))
    trained = nn.BatchNorm1d(3)
    trained.running_mean.fill_(0.5)
    seed_normalization(trained, 0)
    assert torch.equal(trained.running_mean, torch.full((3,), 0.5)) and torch.equal(trained.weight, torch.ones(3))
