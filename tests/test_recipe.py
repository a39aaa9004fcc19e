"""The workload's training recipe: its optimizer, scheduler, clipping and micro-batches, followed by
every backend's cell and by the float64 reference, and judged by parity."""
import contextlib
import dataclasses

import pytest
import torch
from torch import nn

import cnncompare
import wrong_backends
from _tiny import TINY
from cnncompare.backends.base import NotApplicable, rebuild_optimizer
from cnncompare.cli.select import recipe_info
from cnncompare.core.cell.training import make_train_step, with_scheduler
from cnncompare.core.config import RecipeInfo, RunConfig, WorkloadSpec
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry
from cnncompare.workloads import WorkloadError, find
from cnncompare.workloads.base import describe_optimizer, recipe_of

RECIPE = "tests/user_models/recipe.py:build"


def _params():
    return [nn.Parameter(torch.randn(3, 2)), nn.Parameter(torch.randn(2))]


def test_rebuild_keeps_class_groups_and_hyperparameters_and_applies_the_change():
    groups = _params()
    sgd = torch.optim.SGD([{"params": groups[:1]}, {"params": groups[1:], "lr": 0.01}], lr=0.1, momentum=0.9)
    fused = rebuild_optimizer(sgd, fused=True)
    assert type(fused) is torch.optim.SGD
    assert [g["lr"] for g in fused.param_groups] == [0.1, 0.01]
    assert all(g["fused"] and g["momentum"] == 0.9 for g in fused.param_groups)
    tensor_lr = rebuild_optimizer(sgd, lr=torch.tensor)
    assert [float(g["lr"]) for g in tensor_lr.param_groups] == pytest.approx([0.1, 0.01])
    assert all(isinstance(g["lr"], torch.Tensor) for g in tensor_lr.param_groups)
    with pytest.raises(NotApplicable, match=r"torch\.optim\.RMSprop, takes no fused="):
        rebuild_optimizer(torch.optim.RMSprop(_params()), fused=True)


def test_describe_names_what_the_optimizer_sets_away_from_its_defaults():
    assert describe_optimizer(torch.optim.SGD(_params(), lr=0.1, momentum=0.9, nesterov=True)) == \
        "SGD(lr=0.1, momentum=0.9, nesterov=True)"
    assert describe_optimizer(torch.optim.Adam(_params())) == "Adam()"
    assert RecipeInfo().describe(1e-3) == "Adam(lr=0.001) (the default)"
    described = RecipeInfo("SGD(lr=0.1)", "OneCycleLR", 1.0, 4).describe(1e-3)
    assert described == "SGD(lr=0.1), OneCycleLR every step, clip_grad_norm 1, 4 micro-batches per step"


def test_the_parent_reads_the_recipe_before_any_cell():
    workload, _ = find(RECIPE, {})
    info = recipe_info(workload, workload.options)
    assert info == RecipeInfo("SGD(lr=0.5, momentum=0.9)", "ExponentialLR", 0.05, 1)
    assert recipe_info(*find("seed-cnn", load_registry(entry_points=False).workloads)[:1],
                       {"image_size": 8, "in_channels": 3, "num_classes": 10}) == RecipeInfo()


@pytest.mark.parametrize("field, value, message", [
    ("clip_grad_norm", 0.0, "clip_grad_norm must be a positive number"),
    ("accumulation_steps", 0, "accumulation_steps must be a positive int"),
    ("optimizer", "sgd", "optimizer must be a callable"),
])
def test_a_wrong_recipe_is_refused_in_one_line(field, value, message):
    spec = cnncompare.ModelSpec(nn.Linear(2, 2), lambda n, g, d: None)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(spec, **{field: value}).recipe.check("build()")


def test_a_factory_returning_a_wrong_recipe_fails_before_any_cell(tmp_path):
    path = tmp_path / "bad.py"
    path.write_text("import torch, cnncompare\n"
                    "def build():\n"
                    "    return cnncompare.ModelSpec(torch.nn.Linear(2, 2), lambda n, g, d: None, clip_grad_norm=-1.0)\n")
    with pytest.raises(WorkloadError, match="clip_grad_norm must be a positive number"):
        find(f"{path}:build", {})


def _one_step(count: int, clip=None):
    """One step of a seeded linear model over a seeded batch in ``count`` micro-batches: its loss,
    the weights after it and the norm of the gradients it stepped with."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 5), torch.randint(0, 3, (8,))
    torch.manual_seed(1)
    model = nn.Linear(5, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recipe = cnncompare.Recipe(accumulation_steps=count, clip_grad_norm=clip)
    loss = make_train_step(model, optimizer, nn.functional.cross_entropy, recipe, list(model.parameters()))(x, y)
    norm = torch.cat([p.grad.flatten() for p in model.parameters()]).norm()
    return float(loss), [p.detach().clone() for p in model.parameters()], float(norm)


def test_a_ddp_module_skips_the_all_reduce_on_every_micro_batch_but_the_last():
    """DistributedDataParallel's ``no_sync``, as a DDP user accumulates: one reduction per step."""
    entered = []

    class Wrapped(nn.Linear):  # stands in for a DDP-wrapped module: only its no_sync matters here
        @contextlib.contextmanager
        def no_sync(self):
            entered.append(True)
            yield

    torch.manual_seed(1)
    model = Wrapped(5, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    step = make_train_step(model, optimizer, nn.functional.cross_entropy, cnncompare.Recipe(accumulation_steps=4))
    step(torch.randn(8, 5), torch.randint(0, 3, (8,)))
    assert len(entered) == 3


def test_micro_batches_train_as_the_whole_batch_does():
    """Accumulating k micro-batches, each loss divided by k, is one step on their mean loss: the
    same loss, gradient norm and weights (without clipping, which would hide a wrong scale)."""
    loss1, weights1, norm1 = _one_step(1)
    loss4, weights4, norm4 = _one_step(4)
    assert loss4 == pytest.approx(loss1, rel=1e-5)
    assert norm4 == pytest.approx(norm1, rel=1e-5) and norm1 > 0.1
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(weights1, weights4))


def test_clipping_scales_the_accumulated_gradient_to_the_recipes_norm():
    _, unclipped, _ = _one_step(4)
    _, clipped, norm = _one_step(4, clip=0.01)
    assert norm == pytest.approx(0.01, rel=1e-4)
    assert not all(torch.allclose(a, b, atol=1e-6) for a, b in zip(unclipped, clipped))


def test_the_scheduler_steps_after_every_optimizer_step():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.ExponentialLR(optimizer, gamma=0.5)
    step = with_scheduler(make_train_step(model, optimizer, nn.functional.mse_loss), scheduler)
    for _ in range(3):
        step(torch.randn(4, 2), torch.randn(4, 1))
    assert optimizer.param_groups[0]["lr"] == 0.125


def _run(backends, **options) -> dict:
    registry = load_registry(extra_plugins=[wrong_backends], entry_points=False)
    workload, origin = find(RECIPE, registry.workloads)
    registry.workloads[workload.name] = workload
    resolved = {**workload.options, **options}
    spec = WorkloadSpec(workload.name, resolved, "sample", "", 1, recipe_info(workload, resolved))
    config = RunConfig(**{**TINY, "workload": spec, "backends": tuple(backends), "devices": ("cpu",)})
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, lambda rep: None)
    rows = {r.backend: r for r in report.results}
    eager = rows["eager"]
    assert eager.images_per_s == pytest.approx(TINY["batch_size"] * spec.recipe.accumulation_steps / eager.step_time_s)
    return rows


@pytest.mark.e2e
def test_parity_holds_backends_to_the_workloads_recipe(fresh_reference_cache):
    """Correct backends pass under SGD, a halving schedule and active clipping; a step that keeps the
    first learning rate, or skips the clipping, fails; a backend that builds its own Adam is skipped."""
    rows = _run(("eager", "eager-fused", "compile-step", "wrong-ignores-scheduler", "wrong-skips-clipping",
                 "wrong-adam-betas"))
    for name in ("eager", "eager-fused", "compile-step"):
        assert rows[name].status is Status.OK and rows[name].parity.passed, (name, rows[name].error, rows[name].parity)
    for name in ("wrong-ignores-scheduler", "wrong-skips-clipping"):
        r = rows[name]
        assert r.status is Status.FAIL_ACCURACY and not r.parity.passed, (name, r.status, r.error)
        assert r.parity.margin > 2, (name, r.parity)
    legacy = rows["wrong-adam-betas"]
    assert legacy.status is Status.SKIPPED and "make_optimizer" in legacy.error, legacy.error


@pytest.mark.e2e
def test_clipping_off_lets_the_clip_skipping_backend_pass_and_micro_batches_are_judged(fresh_reference_cache):
    """Without clipping the backend that skips it computes the recipe exactly; with two micro-batches
    per step every correct backend still matches the reference, and throughput counts both."""
    rows = _run(("eager", "wrong-skips-clipping"), clip=0.0, accumulation=2)
    for name in ("eager", "wrong-skips-clipping"):
        assert rows[name].status is Status.OK and rows[name].parity.passed, (name, rows[name].error)
    assert recipe_of(find(RECIPE, {})[0], {**find(RECIPE, {})[0].options, "accumulation": 2}).accumulation_steps == 2


def test_a_step_holds_its_micro_batches_in_training_and_one_batch_in_inference():
    from cnncompare.core.cell.training import Job

    workload, _ = find(RECIPE, {})
    options = {**workload.options, "accumulation": 3}
    spec = WorkloadSpec(workload.name, options, "sample", "", 1, recipe_info(workload, options))
    for mode, micro in (("train", 3), ("inference", 1)):
        job = Job(workload, RunConfig(**{**TINY, "workload": spec, "mode": mode}))
        x, y = job.batch(0, torch.device("cpu"))
        assert job.micro_batches == micro and len(x) == len(y) == TINY["batch_size"] * micro


def test_the_use_it_line_builds_the_workloads_own_optimizer():
    """eager-fused's advice to an SGD user is a fused SGD, not a fused Adam."""
    from cnncompare.backends import base
    from cnncompare.plugins import load_registry

    registry = load_registry(entry_points=False)
    fused = registry.get("eager-fused")
    assert base.use_it(fused, "cpu", None, "SGD(lr=0.1, momentum=0.9)") == \
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)"
    assert base.use_it(fused) == "optimizer = torch.optim.Adam(model.parameters(), lr=0.001, fused=True)"
