import math

import pytest

from cnncompare.core.config import RunConfig
from cnncompare.core.records import Status
from cnncompare.core.results import CellResult, RunReport
from cnncompare.core.stats import StepStats, derive


def test_step_stats_keep_samples_and_derive_quartiles():
    samples = [5.0, 1.0, 3.0, 2.0, 4.0]
    s = StepStats.from_samples(samples)
    assert s.samples == samples  # run order kept, not sorted
    assert (s.median, s.q1, s.q3, s.min, s.max, s.n) == (3.0, 2.0, 4.0, 1.0, 5.0, 5)
    assert s.iqr == 2.0


def test_step_stats_even_count_and_single_sample():
    s = StepStats.from_samples([1.0, 2.0, 3.0, 4.0])
    assert s.median == 2.5
    assert (s.q1, s.q3) == (1.75, 3.25)
    one = StepStats.from_samples([0.5])
    assert (one.median, one.q1, one.q3, one.n) == (0.5, 0.5, 0.5, 1)
    with pytest.raises(ValueError):
        StepStats.from_samples([])


def _cell(backend, median, compile_s=0.0, first=None, status=Status.OK, device="cpu"):
    return CellResult(
        backend=backend, device=device, status=status, compile_s=compile_s,
        first_step_s=median if first is None else first, step_s=StepStats.from_samples([median] * 3),
    )


def test_speedup_is_eager_over_backend_and_break_even_counts_steps():
    eager = _cell("eager", 1.0, compile_s=0.0, first=1.2)
    fast = _cell("fast", 0.5, compile_s=10.0, first=20.0)  # one-off 10 + 19.5, eager's 0.2
    slow = _cell("slow", 2.0, compile_s=5.0)
    same = _cell("same", 2.0, compile_s=0.5)  # half a step of eager's: within a first step's noise
    derive([eager, fast, slow, same], units_per_step=128)
    assert fast.speedup_vs_eager == 2.0
    assert slow.speedup_vs_eager == 0.5  # slower shows below 1, never clipped
    assert fast.up_front_s == pytest.approx(10.0 + 19.5 - 0.2)
    assert fast.break_even_steps == math.ceil((10.0 + 19.5 - 0.2) / 0.5)
    assert slow.up_front_s == pytest.approx(4.8) and slow.break_even_steps is None  # never repaid
    assert same.up_front_s == 0.0 and same.break_even_steps == 0  # nothing to repay
    assert eager.speedup_vs_eager == 1.0 and eager.break_even_steps is None and eager.up_front_s is None
    assert fast.images_per_s == 256.0


def test_cheaper_and_faster_breaks_even_at_once():
    eager = _cell("eager", 1.0, compile_s=0.5)
    fast = _cell("fast", 0.9, compile_s=0.0)
    derive([eager, fast], units_per_step=1)
    assert fast.break_even_steps == 0


def test_break_even_counts_the_warm_up_steps_beyond_steady_ones():
    eager = _cell("eager", 1.0)
    eager.warmup_s = [1.0, 1.0]
    graphs = _cell("graphs", 0.5, compile_s=2.0)  # records CUDA graphs in its warm-up: 3 s beyond 2 steady steps
    graphs.warmup_s = [3.0, 1.0]
    derive([eager, graphs], units_per_step=1)
    assert graphs.break_even_steps == math.ceil((2.0 + (4.0 - 2 * 0.5)) / 0.5)


def _rounds(backend, per_round, compile_s=0.0):
    pooled = [x for samples in per_round for x in samples]
    r = CellResult(backend=backend, device="cpu", compile_s=compile_s, first_step_s=min(pooled),
                   step_s=StepStats.from_samples(pooled), round_samples=per_round)
    r.rounds = [StepStats.from_samples(samples).median for samples in per_round]
    return r


def test_break_even_agrees_with_the_speedup_over_rounds():
    # Pooled, the backend's median (0.97) is below eager's (1.0); round by round it is slower in
    # two rounds of three (drift moved eager's): the speedup is below 1, so its compile is never repaid.
    eager = _rounds("eager", [[1.2] * 3, [0.9] * 3, [1.0] * 3])
    backend = _rounds("other", [[1.25] * 3, [0.95] * 3, [0.97] * 3], compile_s=5.0)
    derive([eager, backend], units_per_step=1)
    assert backend.step_s.median < eager.step_s.median and backend.speedup_vs_eager < 1
    assert backend.break_even_steps is None
    faster = _rounds("faster", [[0.6] * 3, [0.45] * 3, [0.5] * 3], compile_s=5.0)
    derive([eager, faster], units_per_step=1)
    assert faster.speedup_vs_eager == pytest.approx(2.0)
    assert faster.break_even_steps == math.ceil(5.0 / (1.0 * (1 - 1 / faster.speedup_vs_eager)))


def test_memory_vs_eager_on_the_cpu_compares_allocated_peaks_not_rss():
    """Identical processes' RSS differs by several per cent (the heap); their allocated peaks
    don't: the CPU ratio is the allocated peaks', eager's from its own cell."""
    eager, fused = _cell("eager", 1.0), _cell("fused", 0.8)
    eager.allocated_peak_steady_mb, fused.allocated_peak_steady_mb = 1352.0, 1081.6
    fused.peak_rss_steady_mb, fused.eager_peak_rss_steady_mb = 1700.0, 1600.0  # the heap's draw: 6 % more
    derive([eager, fused], units_per_step=1)
    assert fused.memory_vs_eager == pytest.approx(0.8)
    fused.allocated_peak_steady_mb = None  # none had (no glibc): RSS against its eager partner
    derive([eager, fused], units_per_step=1)
    assert fused.memory_vs_eager == pytest.approx(1700 / 1600)


def test_memory_vs_eager_compares_steady_peaks_not_one_off_ones():
    eager, tuned = _cell("eager", 1.0), _cell("tuned", 0.5)
    eager.cuda_peak_allocated_steady_mb, eager.cuda_peak_allocated_mb = 100.0, 120.0
    tuned.cuda_peak_allocated_steady_mb, tuned.cuda_peak_allocated_mb = 50.0, 900.0  # autotuning's one-off peak
    derive([eager, tuned], units_per_step=1)
    assert tuned.memory_vs_eager == 0.5  # half of eager's: uses less
    old_eager, old = _cell("eager", 1.0), _cell("old", 1.0)  # a report from before the phases: lifetime peaks
    old_eager.peak_rss_mb, old.peak_rss_mb = 300.0, 200.0
    derive([old_eager, old], units_per_step=1)
    assert old.memory_vs_eager == pytest.approx(2 / 3)


def test_cuda_graph_rows_compare_reserved_memory_and_an_own_allocator_has_no_ratio():
    from cnncompare.core.records import DynamoStats

    eager, graphs, arena = _cell("eager", 1.0), _cell("graphs", 0.5), _cell("arena", 0.5)
    for r in (eager, graphs, arena):
        r.cuda_peak_allocated_steady_mb = r.cuda_peak_allocated_mb = 100.0
    eager.cuda_peak_reserved_steady_mb = 150.0
    graphs.cuda_peak_allocated_steady_mb = 20.0  # a replay allocates nothing: its activations live in the pool
    graphs.cuda_peak_reserved_steady_mb = 300.0
    graphs.dynamo = DynamoStats(graphs=1, graph_breaks=0, recompiles=0, frames_compiled=1, frames_seen=1,
                                fell_back_to_eager=False, cudagraphs_recorded=2)
    arena.cuda_memory_incomparable = "its own arena"
    derive([eager, graphs, arena], units_per_step=1)
    assert graphs.memory_vs_eager == 2.0 and arena.memory_vs_eager is None


def test_a_version_2_report_loses_compile_threads_on_rows_that_never_compiled():
    data = RunReport(environment={}, config=RunConfig(batch_size=2),
                     results=[_cell("eager", 1.0), _cell("compile", 0.5)]).to_dict()
    data["schema_version"] = 2
    data["results"][0]["compile_threads"] = data["results"][1]["compile_threads"] = 1  # the run's setting then
    data["results"][1]["dynamo"] = {"graphs": 1, "graph_breaks": 0, "recompiles": 0, "frames_compiled": 1,
                                    "frames_seen": 1, "fell_back_to_eager": False}
    eager, compiled = RunReport.from_dict(data).results
    assert eager.compile_threads is None and compiled.compile_threads == 1


def test_no_speedup_without_ok_eager_on_the_same_device_or_for_failed_rows():
    eager_gpu = _cell("eager", 1.0, device="cuda:0")
    other = _cell("fast", 0.5, device="cpu")
    wrong = _cell("wrong", 0.1, status=Status.FAIL_ACCURACY, device="cuda:0")
    derive([eager_gpu, other, wrong], units_per_step=4)
    assert other.speedup_vs_eager is None
    assert wrong.speedup_vs_eager is None and wrong.images_per_s == 40.0


def test_report_json_round_trip():
    report = RunReport(environment={"torch": "x"}, config=RunConfig(batch_size=2), results=[_cell("eager", 1.0)])
    again = RunReport.from_dict(report.to_dict())
    assert again.results[0].step_s == report.results[0].step_s
    assert again.results[0].status is Status.OK
    with pytest.raises(ValueError, match="schema_version"):
        RunReport.from_dict({**report.to_dict(), "schema_version": 99})


def test_a_later_round_joins_its_row_and_a_row_that_sat_it_out_keeps_its_place():
    def row(backend, samples, eager=None, status=Status.OK, wall=1.0):
        return CellResult(backend=backend, device="cpu", status=status, compile_s=0.5, first_step_s=2.0,
                          step_s=StepStats.from_samples(samples) if samples else None, wall_s=wall,
                          round_eager_samples=[eager] if eager is not None else None)

    report = RunReport(environment={}, config=RunConfig(rounds=2, batch_size=1))
    report.fold(row("b", [1.0, 2.0]), 1)
    report.fold(row("eager", [1.0, 1.0]), 1)
    report.fold(row("c", [3.0, 3.0], eager=[1.0, 1.0]), 1)
    report.fold(row("d", [4.0, 4.0], eager=[1.0, 1.0]), 1)
    assert [r.backend for r in report.results] == ["eager", "b", "c", "d"]  # eager first, as the plan has it
    assert report.row("b", "cpu").rounds == [1.5]

    report.fold(row("c", [5.0, 7.0], eager=[2.0, 2.0], wall=3.0), 2)
    failed = row("d", None, status=Status.CRASHED)
    failed.error = "the child was killed by SIGKILL"
    report.fold(failed, 2)
    report.end_round("cpu", 2)

    c = report.row("c", "cpu")
    assert c.round_samples == [[3.0, 3.0], [5.0, 7.0]] and c.rounds == [3.0, 6.0]
    assert c.round_eager_samples == [[1.0, 1.0], [2.0, 2.0]]  # round 2's pairs, in step with round 2's steps
    assert c.step_s.samples == [3.0, 3.0, 5.0, 7.0] and c.wall_s == 4.0
    assert c.round_compile_s == [0.5, 0.5] and c.round_first_step_s == [2.0, 2.0]
    d = report.row("d", "cpu")  # a failed later round: an empty round, a note, round 1's status kept
    assert d.status == Status.OK and d.rounds == [4.0, None] and d.round_eager_samples == [[1.0, 1.0], []]
    assert d.notes == ["round 2: crashed (the child was killed by SIGKILL)"]
    b = report.row("b", "cpu")  # sat round 2 out: an empty round keeps round k the k-th everywhere
    assert b.rounds == [1.5, None] and b.step_s.samples == [1.0, 2.0]
