"""The loop around the step: --loop, the cell's rehearsal of the loop's events, the projection."""
import itertools

import pytest

from _tiny import TINY
from _usage import run_cli
from cnncompare.core.config import ConfigError, LoopSpec, RunConfig, WorkloadSpec
from cnncompare.core.records import LOOP_EVENTS, DynamoStats, LoopEvent, LoopRehearsal, Status
from cnncompare.core.results import CellResult, RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.core.stats import loop_counts
from cnncompare.core.stats.figures import loop_total_s
from cnncompare.plugins import load_registry


def _simulated(loop: LoopSpec, batch_size: int) -> dict[str, int]:
    """loop_counts' rules, step by step."""
    counts = dict.fromkeys(LOOP_EVENTS, 0)
    ragged, seen_ragged, after_eval, g = loop.ragged(batch_size), False, False, 0
    for _ in range(loop.epochs):
        for i in range(1, loop.epoch_steps + 1):
            g += 1
            kind = ("ragged" if ragged and i == loop.epoch_steps else "resume" if after_eval
                    else "after_ragged" if seen_ragged else "full")
            counts[kind] += 1
            seen_ragged, after_eval = seen_ragged or kind == "ragged", False
            if loop.eval_every and g % loop.eval_every == 0:
                counts["eval"] += loop.eval_steps
                after_eval = True
    return counts


@pytest.mark.parametrize("epochs,steps,every,last", list(itertools.product((1, 3), (1, 2, 7, 12), (0, 1, 3, 4, 7, 12, 30),
                                                                            (None, 5, 8))))
def test_the_closed_form_counts_every_event_as_the_loop_meets_it(epochs, steps, every, last):
    loop = LoopSpec(epoch_steps=steps, last_batch=last, eval_every=every, eval_steps=2, epochs=epochs)
    counts = loop_counts(loop, batch_size=8)
    assert counts == _simulated(loop, 8), loop
    assert sum(counts[k] for k in LOOP_EVENTS if k != "eval") == epochs * steps


def test_inference_loops_have_no_evaluation():
    counts = loop_counts(LoopSpec(epoch_steps=10, last_batch=3, eval_every=2), batch_size=8, inference=True)
    assert counts["eval"] == counts["resume"] == 0 and counts["ragged"] == 1 and counts["full"] == 9


def _row(backend: str, first_step_s: float, ragged_first_s: float, ratio: float) -> CellResult:
    """A row whose rehearsal met a full step and a ragged one (whose first time compiled once),
    as dynamo's backends' rows (``compile``) are; eager's has no dynamo figures."""
    events = [LoopEvent("full", 0.1, 0.1, 1.0, 0, 0), LoopEvent("ragged", ragged_first_s, 0.05, ratio, 1, 0)]
    dynamo = None if backend == "eager" else DynamoStats(graphs=1, graph_breaks=0, recompiles=0, frames_compiled=1,
                                                          frames_seen=1, fell_back_to_eager=False)
    return CellResult(backend=backend, device="cpu", compile_s=0.0, first_step_s=first_step_s, warmup_s=[0.1],
                      loop_rehearsal=LoopRehearsal(events), dynamo=dynamo)


def test_the_projection_prices_each_event_at_its_ratio_to_the_paired_step_and_its_recompile_once():
    loop = LoopSpec(epoch_steps=10, last_batch=2, epochs=3)
    counts = loop_counts(loop, batch_size=4)
    r = _row("compile", first_step_s=5.1, ragged_first_s=2.05, ratio=0.5)
    assert counts["full"] == 9 and counts["ragged"] == 3 and counts["after_ragged"] == 18
    # One-off: the first step's 5 s beyond a 0.1 s step, and the first ragged step's recompile;
    # each event at its ratio to the 0.1 s step.
    r.loop_rehearsal.events.append(LoopEvent("after_ragged", 0.12, 0.12, 1.2, 0, 0))
    total = loop_total_s(r, r.loop_rehearsal, counts, 0.1)
    expected = 5.0 + 9 * 0.1 + (2.05 - 0.05) + 3 * 0.1 * 0.5 + 18 * 0.1 * 1.2
    assert total == pytest.approx(expected)


def test_a_report_gives_every_ok_row_its_loop_and_eagers_loop_over_it():
    loop = LoopSpec(epoch_steps=10, last_batch=2, epochs=1)
    config = RunConfig(**{**TINY, "workload": WorkloadSpec("seed-cnn", {"image_size": 8}, "image", loop=loop),
                          "backends": ("eager", "compile"), "devices": ("cpu",)})
    eager, compiled = _row("eager", 0.1, 0.05, 0.5), _row("compile", 5.1, 2.05, 0.5)
    for r, step in ((eager, 0.1), (compiled, 0.05)):
        r.step_s = None
        r.round_samples = [[step] * 4]
    from cnncompare.core.stats import StepStats

    eager.step_s, compiled.step_s = StepStats.from_samples([0.1] * 4), StepStats.from_samples([0.05] * 4)
    compiled.round_eager_samples = [[0.1] * 4]
    report = RunReport(environment={}, config=config, results=[eager, compiled])
    e, c = (r.loop for r in report.results)
    assert e.total_s == pytest.approx(9 * 0.1 + 0.1 * 0.5) and e.speedup_vs_eager == 1.0 and e.recompiles is None
    assert c.recompiles == 1 and c.speedup_vs_eager == pytest.approx(e.total_s / c.total_s)
    assert c.total_s > e.total_s  # ten steps never repay a 5 s compile
    again = RunReport.from_json(report.to_json())
    assert again.results[1].loop == c and again.config.workload.loop == loop


def test_a_loop_of_full_steps_alone_is_projected_from_the_step_without_a_rehearsal():
    """Nothing to rehearse: the measured steps are the loop's steps."""
    from cnncompare.core.stats import StepStats

    loop = LoopSpec(epoch_steps=100, epochs=2)
    config = RunConfig(**{**TINY, "workload": WorkloadSpec("seed-cnn", {"image_size": 8}, "image", loop=loop),
                          "backends": ("eager",), "devices": ("cpu",)})
    eager = CellResult(backend="eager", device="cpu", compile_s=0.0, first_step_s=0.3, warmup_s=[0.1],
                       loop_rehearsal=LoopRehearsal(), step_s=StepStats.from_samples([0.1] * 4))
    f = RunReport(environment={}, config=config, results=[eager]).results[0].loop
    assert f.error is None and f.total_s == pytest.approx(0.2 + 200 * 0.1) and f.events["full"] == 200


def test_a_failed_rehearsal_leaves_no_projection_and_says_why():
    r = _row("jit-trace", 0.1, 0.05, 0.5)
    r.loop_rehearsal = LoopRehearsal([LoopEvent("full", 0.1, 0.1, 1.0)], error="ragged: RuntimeError: shape")
    r.step_s = None
    config = RunConfig(**{**TINY, "workload": WorkloadSpec("seed-cnn", {"image_size": 8}, "image",
                                                           loop=LoopSpec(epoch_steps=5, last_batch=2)),
                          "backends": ("jit-trace",), "devices": ("cpu",)})
    from cnncompare.core.stats import StepStats

    r.step_s = StepStats.from_samples([0.1] * 4)
    report = RunReport(environment={}, config=config, results=[r])
    f = report.results[0].loop
    assert f.total_s is None and "ragged: RuntimeError" in f.error


@pytest.mark.parametrize("argv,fragment", [
    (("--loop", "epochs"), "expected KEY=VALUE"),
    (("--loop", "epoch=3"), "unknown key 'epoch'"),
    (("--loop", "epochs=two"), "expected a whole number"),
    (("--loop", "epochs=0"), "epochs must be at least 1"),
    (("--loop", "eval_every=-1"), "eval_every must be at least 0"),
    (("--loop", "epochs=2", "--loop", "epochs=3"), "given twice"),
    (("--loop", "last_batch=200"), "last_batch 200 is more than --batch-size 128"),
])
def test_wrong_loop_keys_are_usage_errors_naming_the_key(capsys, argv, fragment):
    code, _, err = run_cli(capsys, "run", "--dry-run", "--backends", "eager", "--devices", "cpu", *argv)
    assert code == 2 and fragment in err, err


def test_the_loop_checks_its_last_batch_against_the_batch_size():
    with pytest.raises(ConfigError, match="last_batch 9"):
        RunConfig(**{**TINY, "workload": WorkloadSpec("seed-cnn", {"image_size": 8}, "image",
                                                      loop=LoopSpec(last_batch=9))})


@pytest.mark.e2e
def test_a_ragged_last_batch_recompiles_compile_but_not_compile_mark_dynamic():
    """The loop's ragged batch is a new shape: torch.compile recompiles on it, where a batch dimension
    marked dynamic does not; eager compiles nothing, and every row projects the loop."""
    loop = LoopSpec(epoch_steps=6, last_batch=3, eval_every=3, eval_steps=2, epochs=2)
    config = RunConfig(**{**TINY, "workload": WorkloadSpec("seed-cnn", {"image_size": 8}, "image", loop=loop),
                          "backends": ("eager", "compile", "compile-mark-dynamic"), "devices": ("cpu",)})
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, load_registry(entry_points=False), report,
              lambda rep: None)
    rows = {r.backend: r for r in report.results}
    for name in ("eager", "compile", "compile-mark-dynamic"):
        r = rows[name]
        assert r.status is Status.OK and r.loop is not None and r.loop.total_s is not None, (name, r.error, r.loop)
        assert r.loop.speedup_vs_eager is not None and r.loop.events["ragged"] == 2, (name, r.loop)
        assert {e.name for e in r.loop_rehearsal.events} == set(LOOP_EVENTS), r.loop_rehearsal
    assert rows["eager"].loop.recompiles is None  # dynamo never ran there
    ragged = {name: rows[name].loop_rehearsal.event("ragged") for name in ("compile", "compile-mark-dynamic")}
    assert ragged["compile"].compiles >= 1, ragged
    assert ragged["compile-mark-dynamic"].compiles == 0, ragged
    assert rows["compile"].loop.recompiles >= 1
