"""Bring your own model: the resnet and transformer built-ins, a user's model from a file or a module, library
models by name, workloads from an entry point, --workload-option and --batch-size sweeps."""
import json
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest

import toy_workload
from _tiny import TINY
from _usage import run_cli as _cli
from _usage import usage_error
from cnncompare import plugins
from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry
from cnncompare.workloads import WorkloadError, find

ROOT = Path(__file__).resolve().parent.parent
FACTORIES = "tests/user_models/factories.py"
#: The smallest run the CLI can make: one step, no warm-up beyond the parity step's.
QUICK = ["--devices", "cpu", "--batch-size", "4", "--steps", "2", "--warmup", "0", "--rounds", "1", "--round-time", "0", "--threads", "1",
         "--compile-threads", "1", "--no-control"]


def _run(workload: WorkloadSpec, backends, registry=None, batch_size=TINY["batch_size"], **overrides):
    registry = registry or load_registry(entry_points=False)
    config = RunConfig(**{**TINY, "workload": workload, "batch_size": batch_size, **overrides}, backends=tuple(backends),
                       devices=("cpu",))
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, lambda rep: None)
    return {r.backend: r for r in report.results}, report


#: Plain torch, no cnncompare: three steps of the resnet workload's model at batch 2, 8x8, one thread,
#: in channels-last and in the default layout from the same weights and batches; exits 0 when their
#: gradients agree.
_NHWC_CHECK = """
import torch
from cnncompare.workloads.resnet import ResNet18
torch.set_num_threads(1)
grads = []
for layout in (torch.contiguous_format, torch.channels_last):
    torch.manual_seed(0)
    model = ResNet18(width=4).to(memory_format=layout)
    for step in range(3):
        model.zero_grad()
        x = torch.randn(2, 3, 8, 8, generator=torch.Generator().manual_seed(step)).contiguous(memory_format=layout)
        torch.nn.functional.cross_entropy(model(x), torch.tensor([1, 2])).backward()
    grads.append([p.grad.clone() for p in model.parameters()])
worst = max(((a - b).norm() / b.norm().clamp_min(1e-12)).item() for a, b in zip(*grads))
raise SystemExit(0 if worst < 0.01 else 1)
"""


def _torch_nhwc_backward_is_wrong_here() -> bool:
    """Whether this torch's CPU channels-last convolution backward crashes or computes other gradients
    than the default layout at the size above. Seen with torch 2.13.0+cpu on an AMD EPYC (AVX2): heap
    corruption inside oneDNN's mkldnn_convolution_backward_weights ("double free or corruption") with
    one thread, a BatchNorm bias gradient 29 % off with two."""
    import subprocess

    return subprocess.run([sys.executable, "-c", _NHWC_CHECK], capture_output=True, timeout=120).returncode != 0


@pytest.mark.e2e
def test_resnet_trains_under_the_builtins_with_parity_at_batch_2():
    """The smallest batch a user may try, where a correct change of rounding moves a BatchNorm
    gradient most (every built-in at batch 2, 8 and 32 on every workload: bench/parity_sizes.py)."""
    rows, _ = _run(WorkloadSpec("resnet", {"image_size": 8, "width": 4}, "image"),
                   ["eager", "eager-fused", "channels-last", "jit-script", "compile"], batch_size=2, compile_threads=2)
    if _torch_nhwc_backward_is_wrong_here():
        # channels-last, and compile (inductor lays the CPU's convolutions out channels-last), run torch's
        # broken kernel: heap corruption may crash the cell, corrupt a gradient (parity fails) or miss.
        for name in ("channels-last", "compile"):
            r = rows.pop(name)
            assert r.status in (Status.CRASHED, Status.FAIL_ACCURACY) or (r.status == Status.OK and r.parity.passed), \
                (name, r.status, r.error)
    for name, r in rows.items():
        assert r.status == Status.OK and r.parity.passed, (name, r.error)
        assert r.parity.margin < 0.5 and r.gflop_per_step > 0 and r.images_per_s > 0, (name, r.parity.worst_tensor, r.parity.margin)


@pytest.mark.e2e
def test_transformer_counts_tokens_and_skips_channels_last_with_its_reason():
    spec = WorkloadSpec("transformer", {"seq_len": 6, "d_model": 16, "heads": 2, "ff": 32, "vocab": 50}, "sequence",
                        "token", 6)
    rows, report = _run(spec, ["eager", "channels-last", "jit-trace", "aot-eager"])
    skipped = rows.pop("channels-last")
    assert skipped.status == Status.SKIPPED and "4-d image batches" in skipped.error and "2-d (4, 6)" in skipped.error
    for name, r in rows.items():
        assert r.status == Status.OK and r.parity.passed, (name, r.error)
    eager = rows["eager"]
    assert eager.images_per_s == pytest.approx(4 * 6 / eager.step_time_s)  # tokens/s, batch 4 x 6 tokens
    from cnncompare.core.report.markdown import render_markdown

    assert "tokens/s" in render_markdown(report)


@pytest.mark.e2e
def test_a_user_file_and_a_module_factory_run_from_the_cli(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    code, _, err = _cli(capsys, "--workload", "examples/my_model.py:build", "--workload-option", "hidden=16",
                        "--backends", "eager,channels-last", *QUICK, "--output", str(tmp_path / "f.md"))
    assert code == 0, err
    data = json.loads((tmp_path / "f.json").read_text())
    assert data["config"]["workload"]["options"] == {"features": 64, "hidden": 16, "classes": 10}
    ok, skipped = data["results"]
    assert ok["status"] == "ok" and ok["parity"]["passed"] and skipped["status"] == "skipped"
    # A module beside where the command runs imports, as with `python -m`; a ModelSpec names the unit.
    monkeypatch.chdir(ROOT / "tests")
    code, _, err = _cli(capsys, "--workload", "user_models.factories:tiny_regression", "--backends", "eager", *QUICK,
                        "--output", str(tmp_path / "m.md"))
    assert code == 0, err
    data = json.loads((tmp_path / "m.json").read_text())
    assert data["config"]["workload"]["sample_unit"] == "row"
    assert data["results"][0]["status"] == "ok" and data["results"][0]["parity"]["passed"]


@pytest.mark.parametrize("workload, fragment", [
    (f"{FACTORIES}:raises", f"--workload {FACTORIES}:raises: raises() raised ValueError: no weights for width 4"),
    (f"{FACTORIES}:returns_a_number", "returns_a_number() returned int; expected (model, make_batch)"),
    (f"{FACTORIES}:not_a_module", "returned a model of type str; expected a torch.nn.Module"),
    (f"{FACTORIES}:needs_an_argument", "parameter 'width' of tests/user_models/factories.py:needs_an_argument has "
                                       "no default"),
    (f"{FACTORIES}:missing", "tests/user_models/factories.py has no function 'missing'"),
    ("tests/user_models/nowhere.py:build", "no such file: "),
    ("tests/user_models/broken_import.py:build", "raised ModuleNotFoundError: No module named "
                                                 "'this_module_does_not_exist'"),
    ("torchvision:resnet18", "needs the torchvision package"),
    ("timm:vit_tiny_patch16_224", "needs the timm package"),
])
def test_a_bad_workload_is_one_line_and_exit_2_before_any_cell(capsys, monkeypatch, tmp_path, workload, fragment):
    if workload.startswith(("torchvision", "timm")):
        lib = workload.split(":")[0]
        monkeypatch.setitem(sys.modules, lib, None)  # as if not installed, whatever this venv holds
        monkeypatch.setitem(sys.modules, f"{lib}.models", None)
    monkeypatch.chdir(ROOT)
    code, out, err = _cli(capsys, "--workload", workload, "--output", str(tmp_path / "r.md"))
    assert code == 2 and out == "" and fragment in usage_error(err)
    assert not (tmp_path / "r.md").exists()


@pytest.mark.parametrize("argv, fragment", [
    (["--workload", "transformer", "--workload-option", "layers=two"], "--workload-option layers: expected a whole "
                                                                       "number, got 'two'"),
    (["--workload", "transformer", "--workload-option", "heads=3"], "d_model: must be a multiple of heads (3)"),
    (["--workload", "resnet", "--workload-option", "depth=50"], "--workload-option depth: workload 'resnet' has no "
                                                                "such option (its options: image_size, width"),
    (["--workload-option", "image_size"], "--workload-option: expected KEY=VALUE, got 'image_size'"),
    (["--image-size", "8", "--workload-option", "image_size=9"], "--workload-option image_size: given twice"),
    (["--batch-size", "16,16"], "--batch-size: '16,16' names a size twice"),
    (["--batch-size", "16,0"], "--batch-size: must be positive, got 0"),
    (["--batch-size", "16,32", "--resume", "x.json"], "--resume: resume one size of a sweep"),
])
def test_bad_options_are_one_line_and_exit_2(capsys, argv, fragment):
    code, out, err = _cli(capsys, *argv)
    assert code == 2 and out == "" and fragment in usage_error(err)


@pytest.mark.e2e
def test_a_workload_that_fails_in_the_cell_names_itself(tmp_path, capsys, monkeypatch):
    """Known only in a cell: no float64 (the parity reference) and a make_batch that raises."""
    monkeypatch.chdir(ROOT)
    for factory, status, fragment in [
        ("float32_only", "fail_run", "can't train in float64 for the parity reference"),
        ("bad_batch", "fail_run", "make_batch raised ZeroDivisionError"),
    ]:
        code, _, err = _cli(capsys, "--workload", f"{FACTORIES}:{factory}", "--backends", "eager", *QUICK,
                            "--output", str(tmp_path / f"{factory}.md"))
        assert code == 0, err
        (row,) = json.loads((tmp_path / f"{factory}.json").read_text())["results"]
        assert row["status"] == status and row["error"].startswith(f"workload '{FACTORIES}:{factory}'"), row["error"]
        assert fragment in row["error"]


@pytest.mark.e2e
def test_a_model_with_dropout_is_judged_with_eagers_random_numbers(tmp_path, capsys, monkeypatch):
    """Inductor draws its own random numbers unless told to use eager's: without that, a correct
    compile would fail parity on every gradient dropout touches."""
    monkeypatch.chdir(ROOT)
    code, _, err = _cli(capsys, "--workload", f"{FACTORIES}:with_dropout", "--backends", "eager,eager-fused,compile",
                        *QUICK, "--output", str(tmp_path / "dropout.md"))
    assert code == 0, err
    rows = {r["backend"]: r for r in json.loads((tmp_path / "dropout.json").read_text())["results"]}
    for name, row in rows.items():
        assert row["status"] == "ok" and row["parity"]["passed"] and row["parity"]["random"], (name, row["error"])
        assert row["parity"]["margin"] <= 0.5, (name, row["parity"]["worst_tensor"])
    assert "draws random numbers" in (tmp_path / "dropout.md").read_text()


def test_find_resolves_names_no_plugin_registers():
    with pytest.raises(WorkloadError, match="expected FILE.py:FUNCTION or MODULE:FUNCTION"):
        find("x.py:", {})
    with pytest.raises(WorkloadError, match="unknown workload 'nope'; known: a, torchvision:<model>"):
        find("nope", {"a": object()})


def test_a_workload_from_an_entry_point_is_listed(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "fake_workload_plugin", toy_workload)
    monkeypatch.setattr(plugins, "_entry_points",
                        lambda: [EntryPoint(name="toys", value="fake_workload_plugin", group="cnncompare")])
    monkeypatch.delenv(plugins.ENV_PLUGINS, raising=False)
    reg = load_registry()
    assert reg.workload_origin["toy-mlp"] == "toys"
    code, out, _ = _cli(capsys, "plugins")
    assert code == 0 and any(line.startswith("toys") and "toy-mlp" in line for line in out.splitlines())
    code, out, _ = _cli(capsys, "--list", "--devices", "cpu")
    assert code == 0 and any(line.startswith("toy-mlp") and "toys" in line for line in out.splitlines())


@pytest.mark.e2e
def test_a_batch_size_sweep_writes_each_size_and_a_summary(tmp_path, capsys):
    code, out, err = _cli(capsys, "--backends", "eager,jit-trace", "--image-size", "8", *QUICK[:2],
                          "--batch-size", "2,4", *QUICK[4:], "--output", str(tmp_path / "s.md"))
    assert code == 0, err
    for size in (2, 4):
        data = json.loads((tmp_path / f"s-bs{size}.json").read_text())
        assert data["config"]["batch_size"] == size and {r["status"] for r in data["results"]} == {"ok"}
    summary = json.loads((tmp_path / "s.json").read_text())
    assert summary["kind"] == "batch-size sweep" and summary["batch_sizes"] == [2, 4]
    assert [run["json"] for run in summary["runs"]] == ["s-bs2.json", "s-bs4.json"]
    assert {(t["backend"], t["batch_size"]) for t in summary["throughput"]} == {
        (b, s) for b in ("eager", "jit-trace") for s in (2, 4)}
    assert all(t["per_s"] > 0 and t["unit"] == "image" for t in summary["throughput"])
    md = (tmp_path / "s.md").read_text()
    assert "batch 2, 4 images" in md and "| backend   | batch 2" in md and md == out.rstrip("\n") + "\n"
    assert md.count("- batch ") == 2  # a verdict per size
    # A summary is not a run: compare says which file to use.
    code, _, err = _cli(capsys, "compare", str(tmp_path / "s.json"), str(tmp_path / "s-bs2.json"))
    assert code == 2 and "is a batch-size sweep's summary; use one size's report" in err
    # Two sizes are the same workload: compare takes them; other workloads it refuses unless told.
    code, _, err = _cli(capsys, "compare", str(tmp_path / "s-bs2.json"), str(tmp_path / "s-bs4.json"))
    assert code == 0, err
    other = json.loads((tmp_path / "s-bs4.json").read_text())
    other["config"]["workload"]["options"]["image_size"] = 9
    (tmp_path / "other.json").write_text(json.dumps(other))
    code, _, err = _cli(capsys, "compare", str(tmp_path / "s-bs2.json"), str(tmp_path / "other.json"))
    assert code == 2 and "different workloads (seed-cnn with other options (image_size=8" in err
    code, _, err = _cli(capsys, "compare", str(tmp_path / "s-bs2.json"), str(tmp_path / "other.json"),
                        "--any-workload")
    assert code == 0, err


def test_float_targets_reach_the_float64_reference_as_float64(monkeypatch):
    """A regression's targets are cast with its inputs: torch 2.6's MSE backward refuses a float32
    target against the reference's float64 output (newer releases promote it silently)."""
    import torch

    from cnncompare.core.cell.training import Job

    monkeypatch.chdir(ROOT / "tests")
    workload, _ = find("user_models.factories:tiny_regression", {})
    job = Job(workload, RunConfig(**{**TINY, "workload": WorkloadSpec("user_models.factories:tiny_regression")}))
    x, y = job.batch(0, torch.device("cpu"), dtype=torch.float64)
    assert x.dtype == y.dtype == torch.float64
    x, y = job.batch(0, torch.device("cpu"))
    assert x.dtype == y.dtype == torch.float32
    ids = find("seed-cnn", load_registry(entry_points=False).workloads)[0]
    _, labels = Job(ids, RunConfig(**TINY)).batch(0, torch.device("cpu"), dtype=torch.float64)
    assert labels.dtype == torch.int64  # class ids stay integers
