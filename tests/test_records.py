"""The record that crosses the process boundary and the statistics: typed, strict, in one place."""
import json
import statistics

import pytest

from cnncompare.core import stats
from cnncompare.core.records import CellRecord, DistributedFigures, DynamoStats, Parity, Status
from cnncompare.core.results import CellResult


def _record():
    return CellRecord(status=Status.FAIL_ACCURACY, complete=True, threads=2, compile_s=1.5, step_samples=[0.2, 0.1],
                      dynamo=DynamoStats(graphs=1, graph_breaks=0, recompiles=None, frames_compiled=1, frames_seen=1,
                                         fell_back_to_eager=False),
                      parity=Parity(passed=False, reference="float64 eager", multiplier=3.0, tolerance=1e-4,
                                    loss_rel_error=float("nan"), grad_rel_error=1e-3, weight_rel_error=1e-4,
                                    eager_loss_rel_error=0.0, eager_grad_rel_error=1e-7, eager_weight_rel_error=1e-7),
                      distributed=DistributedFigures(nproc=2, nnodes=1, nproc_per_node=2, process_group="gloo",
                                                     batch_size_per_rank=4, global_batch_size=8, threads_per_rank=1,
                                                     rank_step_median_s=[0.1, 0.2], slowest_rank=1,
                                                     slowest_rank_step_median_s=0.2, peak_rss_mb_per_rank=[1.0, None],
                                                     ranks_identical=True, max_rank_weight_diff=0.0),
                      notes=["a note"])


def test_a_record_reads_back_as_itself_with_nan_as_null():
    record = _record()
    again = CellRecord.from_json(record.to_json())
    assert again.parity is not None and again.parity.loss_rel_error is None  # NaN is not JSON
    again.parity.loss_rel_error = record.parity.loss_rel_error
    assert json.loads(again.to_json()) == json.loads(record.to_json())
    assert isinstance(again.dynamo, DynamoStats) and again.status is Status.FAIL_ACCURACY


@pytest.mark.parametrize("change, fragment", [
    (lambda d: d.update(compile_secs=1.0), "compile_secs"),  # a misspelled figure is an error, not dropped
    (lambda d: d.update(threads="two"), "threads"),
    (lambda d: d["dynamo"].update(graphz=1), "graphz"),
    (lambda d: d.update(status="fine"), "not a valid Status"),
])
def test_a_record_with_an_unknown_key_or_a_wrong_type_is_refused(change, fragment):
    data = json.loads(_record().to_json())
    change(data)
    with pytest.raises(ValueError, match=fragment):
        CellRecord.from_json(json.dumps(data))


def test_the_row_takes_every_measured_figure_from_the_record():
    record = _record()
    row = CellResult.from_record(record, backend="b", device="cpu")
    assert row.compile_s == 1.5 and row.threads == 2 and row.notes == ["a note"] and row.dynamo is record.dynamo
    assert row.step_s is not None and row.step_s.samples == [0.2, 0.1] and row.step_s.median == pytest.approx(0.15)


def test_slowest_rank_and_the_rounds_test():
    assert stats.slowest([0.1, 0.3, 0.2]) == 1
    assert stats.rounds_test(((1.0, 1.1),), ((2.0,), (3.0,))) is None  # one round: no independent repeats
    assert stats.rounds_test(((1.0, 1.1), (1.05,), (1.0,)), ((2.0,), (2.1,), (2.05,))) < 0.05
    assert stats.rounds_test(((1.0,), (1.1,), (1.05,)), ((1.05,), (1.0,), (1.1,))) > 0.5
    assert stats.kernel_share(0.3, 0.1) == pytest.approx(0.25) and stats.kernel_share(0.3, 0.0) is None


def test_the_kernel_time_hint_is_for_eagers_cpu_row_under_the_system_allocator_from_the_threshold():
    def eager(sys_s, device="cpu", status=Status.OK):
        return CellResult(backend="eager", device=device, status=status, cpu_user_s_per_step=1.0, cpu_sys_s_per_step=sys_s)

    assert stats.kernel_share_hint([eager(0.25)], "system") == pytest.approx(0.2)  # exactly at the threshold
    assert stats.kernel_share_hint([eager(0.2)], "system") is None  # 1/6: below it
    assert stats.kernel_share_hint([eager(0.5)], "reuse") is None  # the allocator already keeps freed memory
    assert stats.kernel_share_hint([eager(0.5, device="cuda:0")], "system") is None  # the driver's time, not faults
    assert stats.kernel_share_hint([eager(0.5, status=Status.FAIL_RUN)], "system") is None


def _row(name, samples, status=Status.OK, rounds=None):
    rows = CellResult(backend=name, device="cpu", status=status, step_s=stats.StepStats.from_samples(samples))
    if rounds:
        rows.round_samples = rounds
        rows.rounds = [statistics.median(r) if r else None for r in rounds]
    return rows


def _verdict(*rows):
    stats.derive(rows, units_per_step=1)
    return stats.verdict("cpu", rows)


def _measured(row, precision, declared="fp32"):
    from cnncompare.core.records import Parity

    row.parity = Parity(passed=True, reference="float64 eager", multiplier=5.0, tolerance=0.01, loss_rel_error=0.0,
                        grad_rel_error=0.0, weight_rel_error=0.0, eager_loss_rel_error=0.0, eager_grad_rel_error=0.0,
                        eager_weight_rel_error=0.0, precision=precision, declared_precision=declared)
    return row


def test_a_row_at_another_precision_is_named_apart_never_ranked_over_eagers_precision():
    eager = _measured(_row("eager", [1.0, 1.0, 1.0]), "fp32")
    fused = _measured(_row("fused", [0.8, 0.8, 0.8]), "fp32")
    silent = _measured(_row("silent-bf16", [0.4, 0.4, 0.4]), "bf16")  # declares fp32, computes in bf16
    v = _verdict(eager, fused, silent)
    assert v.pick == "fused" and v.precision == "fp32" and v.other_precision is silent
    data = v.to_dict()
    assert data["fastest_other_precision"] == {"backend": "silent-bf16", "precision": "bf16", "speedup": 2.5,
                                               "speedup_ci": [2.5, 2.5]}
    from cnncompare.core.report.summary import summary_line

    line = summary_line(v)
    assert "pick **fused**" in line and "**silent-bf16** at 2.50x" in line and "computes in bf16, though it declares fp32" in line
    slower = _measured(_row("slow-bf16", [0.9, 0.9, 0.9]), "bf16", "bf16")
    assert _verdict(eager, fused, slower).other_precision is None  # named only where it is faster


def test_verdict_picks_the_fastest_ok_row_and_says_how_far_to_trust_it():
    eager, fast, wrong = _row("eager", [1.0, 1.0, 1.0]), _row("fast", [0.5, 0.5, 0.5]), _row("wrong", [0.1], Status.FAIL_ACCURACY)
    v = _verdict(eager, fast, wrong)
    assert v.best is fast and v.pick == "fast" and v.eager is eager
    assert v.to_dict() == {"pick": "fast", "best": "fast", "speedup": 2.0, "speedup_ci": [2.0, 2.0], "tied_with": [],
                           "confidence": stats.VERDICT_CONFIDENCE, "tested_ci": [2.0, 2.0], "undecided_between": [],
                           "rounds_to_separate": None, "precision": None, "noise_floor": None,
                           "fastest_other_precision": None}
    close = _row("close", [0.9, 0.95, 1.05])
    v = _verdict(eager, close)
    assert v.pick is None and v.tied_with == ["eager"]  # its interval reaches 1.0
    assert _verdict(wrong).best is None


def test_speedup_is_the_geometric_mean_of_paired_round_ratios_with_a_bootstrap_interval():
    # Round 2 ran on a machine 50 % slower for both: pairing rounds cancels the drift.
    eager = _row("eager", [1.0] * 6, rounds=[[1.0, 1.02, 0.98], [1.5, 1.53, 1.47]])
    fast = _row("fast", [0.5] * 6, rounds=[[0.5, 0.51, 0.49], [0.75, 0.76, 0.74]])
    speedup, low, high = stats.speedup_interval(stats.rounds_of(eager), stats.rounds_of(fast))
    assert speedup == pytest.approx(2.0) and low < 2.0 < high and high / low < 1.2
    assert stats.speedup_interval(stats.rounds_of(eager), stats.rounds_of(fast)) == (speedup, low, high)  # seeded
    v = _verdict(eager, fast)
    assert v.pick == "fast" and fast.speedup_ci == [low, high]


def test_two_backends_whose_intervals_overlap_are_a_tie():
    eager = _row("eager", [1.0] * 6, rounds=[[1.0, 1.1, 0.9], [1.0, 1.05, 0.95]])
    a = _row("a", [0.5] * 6, rounds=[[0.5, 0.55, 0.45], [0.52, 0.5, 0.54]])
    b = _row("b", [0.51] * 6, rounds=[[0.51, 0.56, 0.46], [0.5, 0.55, 0.48]])
    v = _verdict(eager, a, b)
    assert v.pick is None and v.best.backend in ("a", "b") and v.tied_with == [({"a", "b"} - {v.best.backend}).pop()]
    assert v.to_dict()["pick"] is None


def test_from_three_rounds_the_interval_is_students_t_over_the_rounds_log_ratios():
    import math

    eager = ((1.0, 1.0), (1.0, 1.0), (1.0, 1.0))
    other = tuple((r, r) for r in (0.5, 0.5 * math.exp(-0.1), 0.5 * math.exp(0.1)))  # ratios 2, 2e^0.1, 2e^-0.1
    speedup, low, high = stats.speedup_interval(eager, other)
    half = 4.302653 * 0.1 / math.sqrt(3)  # t(0.975, 2 df) x sd / sqrt(n)
    assert speedup == pytest.approx(2.0) and low == pytest.approx(2 * math.exp(-half)) and high == pytest.approx(2 * math.exp(half))


def test_a_tie_is_decided_round_by_round_not_by_overlapping_intervals_against_eager():
    # The machine drifts from round to round and eager's own process adds 15 % of noise: against
    # eager, a's and b's intervals are wide and overlap. Round by round a is 10 % faster than b.
    drift = (1.0, 1.2, 0.9, 1.1)
    eager = _row("eager", [1.0] * 4, rounds=[[d * n] for d, n in zip(drift, (1.0, 1.15, 0.9, 1.05))])
    a = _row("a", [0.5] * 4, rounds=[[d * 0.5] for d in drift])
    b = _row("b", [0.55] * 4, rounds=[[d * 0.55 * n] for d, n in zip(drift, (1.01, 0.99, 1.0, 1.02))])
    assert a.speedup_ci is None  # derived below
    stats.derive([eager, a, b], units_per_step=1)
    assert b.speedup_ci[1] > a.speedup_ci[0]  # overlapping intervals against eager
    v = _verdict(eager, a, b)
    assert v.best is a and v.tied_with == [] and v.pick == "a"


def test_no_pick_below_the_noise_floor_or_from_too_few_rounds():
    from cnncompare.core.report.summary import summary_line

    drift = [1.0, 1.1, 0.9, 1.0, 1.1, 0.9]
    eager = _row("eager", [1.0] * 6, rounds=[[d] for d in drift])
    fast = _row("fast", [0.8] * 6, rounds=[[d * 0.8 * n] for d, n in zip(drift, (1.01, 0.99, 1.0, 1.02, 0.98, 1.0))])
    # eager against itself, as fast or slower as fast from round to round: fast clears eager, not it
    control = _row("eager-control", [0.8] * 6, rounds=[[d * 0.8 * n] for d, n in zip(drift, (1.3, 0.8, 1.25, 0.78, 1.2, 0.85))])
    v = _verdict(eager, control, fast)
    assert v.tested_ci[0] > 1
    assert v.best is fast and v.control is control and v.below_control and v.pick is None
    assert "no backend clears this run's noise floor" in summary_line(v) and "Noise floor" in summary_line(v)
    assert v.to_dict()["noise_floor"]["speedup"] == control.speedup_vs_eager
    clear = _row("clear", [0.4] * 6, rounds=[[d * 0.4] for d in drift])
    assert _verdict(eager, control, clear).pick == "clear"
    stats.derive([eager, clear], units_per_step=1)
    one = stats.verdict("cpu", [eager, clear], rounds=1)
    assert one.best is clear and one.pick is None and "no pick from 1 round(s)" in summary_line(one)


def test_a_failed_round_pairs_with_nothing_and_shifts_no_pairing():
    eager = _row("eager", [1.0] * 3, rounds=[[1.0], [2.0], [1.0]])  # round 2 ran on a machine twice as slow
    fast = _row("fast", [0.5] * 2, rounds=[[0.5], [], [0.5]])  # its round 2 failed
    speedup, low, high = stats.speedup_interval(stats.rounds_of(eager), stats.rounds_of(fast))
    assert speedup == pytest.approx(2.0) and low == pytest.approx(2.0)  # rounds 1 and 3 only, never 3 against 2
