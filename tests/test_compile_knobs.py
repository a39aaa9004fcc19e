"""The knobs that trade compile cost against recompiles: compile-dynamic, compile-mark-dynamic,
compile-regional, and where each row's compile time went (torch's compile metrics by phase)."""
import pytest
import torch

from _tiny import TINY
from cnncompare.backends.inductor import CompileRegional, repeated_blocks
from cnncompare.cli.select import recipe_info
from cnncompare.core.config import RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry
from cnncompare.workloads import find

#: A residual MLP with two blocks, trained with its own recipe (SGD, a schedule, clipping): the
#: smallest model on which every new backend has something to do.
BLOCKS = "tests/user_models/recipe.py:build"


def _model(name, **options):
    workload = load_registry(entry_points=False).workloads[name]
    return workload.build_model({**workload.options, **options})


def test_repeated_blocks_are_the_outermost_instances_of_the_heaviest_repeated_class():
    assert [type(b).__name__ for b in repeated_blocks(_model("resnet"))] == ["BasicBlock"] * 8
    # The attention inside each layer repeats too; the layers hold more parameters and contain it.
    assert [type(b).__name__ for b in repeated_blocks(_model("transformer"))] == ["TransformerEncoderLayer"] * 2
    assert repeated_blocks(_model("seed-cnn")) == []  # its two Sequentials are containers, not blocks
    assert len(repeated_blocks(_model("seed-cnn"), "Sequential")) == 2  # unless named


def test_compile_regional_takes_only_a_class_name():
    backend = CompileRegional()
    backend.configure({"blocks": "BasicBlock"})
    assert backend.blocks == "BasicBlock"
    for wrong in ({"block": "X"}, {"blocks": 3}, {"blocks": "not a name"}):
        with pytest.raises(ValueError):
            backend.configure(wrong)


def _run(name: str, backends) -> dict:
    registry = load_registry(entry_points=False)
    workload, _ = find(name, registry.workloads)
    registry.workloads[workload.name] = workload
    options = {**workload.options, **(TINY["workload"].options if name == "seed-cnn" else {})}
    spec = WorkloadSpec(workload.name, options, workload.sample_unit, "", 1, recipe_info(workload, options))
    config = RunConfig(**{**TINY, "workload": spec, "backends": tuple(backends), "devices": ("cpu",)})
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, lambda rep: None)
    return {r.backend: r for r in report.results}


@pytest.mark.e2e
def test_the_new_compile_backends_train_correctly_and_report_their_compile_phases(cold_compiles):
    """Cold compiles (the suite's shared cache would load graphs other tests compiled, leaving
    inductor nothing to do) of each new backend: its phases, and regional compilation's one graph."""
    rows = _run(BLOCKS, ("eager", "compile-dynamic", "compile-mark-dynamic", "compile-regional"))
    for name in ("compile-dynamic", "compile-mark-dynamic", "compile-regional"):
        r = rows[name]
        assert r.status is Status.OK and r.parity.passed, (name, r.error, r.error_tail)
        assert r.dynamo is not None, name
        phases = r.dynamo.compile_phases
        assert phases is not None and phases.compiles >= 1, (name, phases)
        assert phases.codegen_s > 0 and phases.dynamo_s > 0 and phases.aot_autograd_s > 0, (name, phases)
        # Phases are parts of the compile, which the first step (compile is lazy) and the compile call hold.
        parts = phases.dynamo_s + phases.aot_autograd_s + phases.inductor_s + phases.codegen_s
        assert parts <= (r.compile_s + r.first_step_s) * 1.05, (name, parts, r.compile_s, r.first_step_s)
    # The two identical blocks share one compiled graph: regional compilation compiles once.
    assert rows["compile-regional"].dynamo.graphs == 1
    assert rows["eager"].dynamo is None


@pytest.mark.e2e
def test_compile_regional_is_skipped_with_the_reason_on_a_model_without_repeated_blocks():
    rows = _run("seed-cnn", ("eager", "compile-regional"))
    r = rows["compile-regional"]
    assert r.status is Status.SKIPPED and "no repeated blocks" in r.error and "blocks=CLASS" in r.error, r.error


@pytest.mark.e2e
def test_a_warm_cache_run_measures_the_start_from_the_cold_runs_portable_cache(tiny_config):
    """--compile-cache warm: cold (saving torch.compiler's portable cache), warm (its directory), and
    from an empty directory loaded with the portable cache; eager compiles nothing to ship."""
    from cnncompare.core.run.cell import run_cell

    registry = load_registry(entry_points=False)
    config = tiny_config(compile_cache="warm", backends=("compile",))
    r = run_cell(registry.get("compile"), None, DeviceSlot("cpu"), config)
    assert r.status is Status.OK and r.compile_cache == "warm", (r.error, r.error_tail)
    assert r.cold_first_step_s is not None
    if not hasattr(torch.compiler, "save_cache_artifacts"):  # torch 2.6: the row says why there is no third run
        assert r.portable_status is None and any("save_cache_artifacts" in note for note in r.notes), r.notes
        return
    assert r.portable_status == "ok", (r.portable_status, r.error_tail)
    assert r.portable_first_step_s is not None and r.portable_compile_s is not None and r.portable_cache_mb > 0
    assert not r.notes, r.notes
    eager = run_cell(registry.get("eager"), None, DeviceSlot("cpu"), config)
    assert eager.status is Status.OK and eager.portable_status is None and eager.portable_compile_s is None
