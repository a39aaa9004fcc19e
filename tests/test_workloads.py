"""The workload seam: the built-in seed-cnn, a second workload through the hook, and bad input."""
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import cnncompare
import toy_workload
from _tiny import TINY
from _usage import run_cli as _cli
from _usage import usage_error
from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.report.markdown import render_markdown
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import PluginError, load_registry
from cnncompare.workloads.base import OptionError, resolve_options
from cnncompare.workloads.seed_cnn import SeedCNNWorkload

DRIVER = Path(__file__).parent / "run_cli_with_test_plugins.py"


def test_seed_cnn_is_the_builtin_default_workload():
    reg = load_registry(entry_points=False)
    assert list(reg.workloads) == ["seed-cnn", "resnet", "transformer"]
    assert reg.workload_origin["seed-cnn"] == "cnncompare.workloads.seed_cnn"
    assert RunConfig().workload.name == "seed-cnn"


def test_options_are_filled_typed_and_checked():
    seed = SeedCNNWorkload()
    assert resolve_options(seed, {"image_size": 8}) == {"image_size": 8, "in_channels": 3, "num_classes": 10}
    with pytest.raises(OptionError, match="image_size: must be positive, got 0"):
        resolve_options(seed, {"image_size": 0})
    with pytest.raises(OptionError, match="has no such option .*image_size, in_channels, num_classes"):
        resolve_options(seed, {"width": 3})
    with pytest.raises(OptionError, match="image_size: expected int, got 2.5"):
        resolve_options(seed, {"image_size": 2.5})
    with pytest.raises(OptionError, match="expected int, got True"):
        resolve_options(seed, {"image_size": True})


@pytest.mark.e2e
def test_a_second_workload_registered_through_the_hook_runs_end_to_end():
    """cnncompare_register_workloads: a toy MLP trains under eager and compile, parity passes, and the
    report names the workload and its unit."""
    reg = load_registry(extra_plugins=[toy_workload], entry_points=False)
    assert reg.workload_origin["toy-mlp"] == "toy_workload"
    config = RunConfig(**{**TINY, "workload": WorkloadSpec("toy-mlp", {"features": 8}, "vector")},
                       backends=("eager", "compile"), devices=("cpu",))
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, reg, report, lambda rep: None)
    assert [(r.backend, r.status) for r in report.results] == [("eager", Status.OK), ("compile", Status.OK)]
    for r in report.results:
        assert r.parity is not None and r.parity.passed, r.error
        assert r.gflop_per_step and r.gflop_per_step > 0 and r.images_per_s
    md = render_markdown(report)
    assert "- **workload**: **toy-mlp** (features 8" in md and "vectors/s" in md


def test_duplicate_workload_name_names_both_plugins():
    copycat = types.ModuleType("copycat")

    @cnncompare.hookimpl
    def cnncompare_register_workloads(register):
        register(SeedCNNWorkload())

    copycat.cnncompare_register_workloads = cnncompare_register_workloads
    with pytest.raises(PluginError, match="workload name 'seed-cnn' is registered twice: by plugin "
                                          "'cnncompare.workloads.seed_cnn' and by plugin 'copycat'"):
        load_registry(extra_plugins=[copycat], entry_points=False)


def test_a_workload_missing_a_member_breaks_its_plugin_only():
    broken = types.ModuleType("broken")

    @cnncompare.hookimpl
    def cnncompare_register_workloads(register):
        register(toy_workload.NoLoss())

    broken.cnncompare_register_workloads = cnncompare_register_workloads
    reg = load_registry(extra_plugins=[broken], entry_points=False)
    assert "no-loss" not in reg.workloads and "seed-cnn" in reg.workloads
    info = next(p for p in reg.plugins if p.name == "broken")
    assert "has no callable loss" in info.error


@pytest.mark.parametrize("argv, fragment", [
    (["--workload", "nope"], "--workload: unknown workload 'nope'; known: seed-cnn, resnet, transformer"),
    (["--image-size", "0"], "--image-size: must be positive, got 0"),
])
def test_bad_workload_input_is_one_line_and_exit_2(capsys, argv, fragment):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == "" and fragment in usage_error(err)


def test_image_size_for_a_workload_without_it_is_refused_before_any_cell(tmp_path):
    proc = subprocess.run([sys.executable, str(DRIVER), "--workload", "toy-mlp", "--image-size", "8",
                           "--output", str(tmp_path / "r.md")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().endswith("--image-size: workload 'toy-mlp' has no such option "
                                        "(its options: features, classes, hidden)")
    assert not (tmp_path / "r.md").exists()


def test_list_shows_workloads(capsys):
    code, out, _ = _cli(capsys, "--list", "--devices", "cpu")
    assert code == 0
    line = next(line for line in out.splitlines() if line.startswith("seed-cnn"))
    assert "the default)" in line and "image_size=28, in_channels=3, num_classes=10" in line and "image" in line


@pytest.mark.e2e
def test_cli_runs_the_named_workload_and_records_it(tmp_path):
    proc = subprocess.run([sys.executable, str(DRIVER), "--workload", "toy-mlp", "--backends", "eager", "--devices", "cpu",
                           "--batch-size", "4", "--steps", "2", "--warmup", "0", "--rounds", "1", "--round-time", "0", "--threads", "1",
                           "--output", str(tmp_path / "r.md")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["config"]["workload"] == {"name": "toy-mlp", "options": {"features": 16, "classes": 4, "hidden": 32},
                                          "sample_unit": "vector", "throughput_unit": "vector", "units_per_sample": 1,
                                          "recipe": {"optimizer": "", "scheduler": "", "clip_grad_norm": None,
                                                     "accumulation_steps": 1},
                                          "loop": {"epoch_steps": 1000, "last_batch": None, "eval_every": 0,
                                                   "eval_steps": 10, "epochs": 1}}
    assert data["results"][0]["status"] == "ok" and data["results"][0]["parity"]["passed"]
