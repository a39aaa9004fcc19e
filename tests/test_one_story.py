"""One story in every figure: every speed figure a user reads derives from the paired
measurement the verdict uses; break-even from the paired speedup; the noise floor tested as a
paired interval; each row paired with an eager process of its own; memory like for like; the
round order drawn per run from a recorded seed."""
import math
import random
import threading

import pytest

from cnncompare.core import stats
from cnncompare.core.config import RunConfig
from cnncompare.core.records import CellRecord, Status
from cnncompare.core.report.markdown import render_markdown
from cnncompare.core.report.tables import ranked
from cnncompare.core.results import CellResult, RunReport
from cnncompare.core.run.pairs import Listener


def _paired(name, rounds, **fields):
    """A row from ``[(eager steps, its steps), ...]`` per round."""
    row = CellResult(backend=name, device="cpu", status=Status.OK,
                     step_s=stats.StepStats.from_samples([s for _, b in rounds for s in b]), **fields)
    row.round_samples = [list(b) for _, b in rounds]
    row.round_eager_samples = [list(e) for e, _ in rounds]
    row.rounds = [sorted(b)[len(b) // 2] if b else None for _, b in rounds]
    return row


def _eager(own_step):
    """Eager's own row: its cold cell's steps, alone (no pairs), from other minutes than the pairs."""
    row = CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=own_step,
                     step_s=stats.StepStats.from_samples([own_step] * 4))
    row.round_samples, row.rounds = [[own_step] * 4, [own_step] * 4], [own_step, own_step]
    return row


def _drifting_rows():
    """A run whose rows' own medians contradict their speedups, as the machine drifted: the fast
    row's steps were taken in a slow minute, so its own median (0.66 s) is above the slow row's
    (0.62 s) although in its pairs it ran at twice eager's speed."""
    eager = _eager(0.9)
    fast = _paired("fast", [([1.30, 1.34, 1.32, 1.31], [0.65, 0.67, 0.66, 0.66]),
                            ([1.28, 1.33, 1.35, 1.30], [0.64, 0.66, 0.68, 0.65])], compile_s=0.0, first_step_s=0.7)
    slow = _paired("slow", [([0.51, 0.50, 0.52, 0.50], [0.62, 0.61, 0.63, 0.62]),
                            ([0.50, 0.52, 0.51, 0.51], [0.61, 0.63, 0.62, 0.62])], compile_s=0.0, first_step_s=0.62)
    return eager, fast, slow


def test_step_time_throughput_and_the_summary_derive_from_the_speedup():
    eager, fast, slow = _drifting_rows()
    report = RunReport(environment={}, config=RunConfig(batch_size=8, rounds=2), results=[eager, fast, slow])
    assert fast.step_s.median > slow.step_s.median  # their own minutes say the opposite of the pairs
    assert fast.speedup_vs_eager == pytest.approx(2.0, rel=0.02) and slow.speedup_vs_eager < 1
    paired_eager = stats.eager_step_s(report.rows("cpu"))
    assert paired_eager != eager.step_s.median  # the eager steps the rows were paired with, not its cold cell's
    for r in (eager, fast, slow):
        assert r.step_time_s * r.speedup_vs_eager == pytest.approx(paired_eager)
        assert r.images_per_s == pytest.approx(8 / r.step_time_s)
    low, high = fast.step_time_ci
    assert low == pytest.approx(paired_eager / fast.speedup_ci[1]) and high == pytest.approx(paired_eager / fast.speedup_ci[0])
    assert fast.step_time_s < eager.step_time_s < slow.step_time_s  # ranked as the speedups rank them
    md = render_markdown(report)
    assert f"{fast.step_time_s:.3g}" in md.split("## Summary")[1].split("\n\n")[1]
    assert f"{fast.step_s.median:.4g} s/step" not in md  # no unpaired figure in the verdict


def test_charts_rank_rows_as_the_table_does():
    from cnncompare.core.report.charts import _ok_rows

    eager, fast, slow = _drifting_rows()
    report = RunReport(environment={}, config=RunConfig(batch_size=8, rounds=2), results=[slow, eager, fast])
    assert [r.backend for r in _ok_rows(report)] == [r.backend for r in ranked(report.rows("cpu"))] \
        == ["fast", "eager", "slow"]


def test_break_even_comes_from_the_paired_speedup_with_its_interval():
    eager, fast, _ = _drifting_rows()
    fast.compile_s = 20.0
    noisy = _paired("noisy", [([1.0, 1.0], [0.80, 0.82]), ([1.0, 1.0], [1.30, 1.28])], compile_s=20.0,
                    first_step_s=1.0)
    free = _paired("free", [([1.0, 1.02], [0.5, 0.52]), ([1.0, 1.01], [0.5, 0.5])], compile_s=0.0, first_step_s=0.55)
    RunReport(environment={}, config=RunConfig(rounds=2), results=[eager, fast, noisy, free])
    saving = stats.eager_step_s([eager, fast, noisy, free]) * (1 - 1 / fast.speedup_vs_eager)
    assert fast.up_front_s == pytest.approx(20.0, abs=0.2)
    assert fast.break_even_steps == math.ceil(fast.up_front_s / saving)
    low, high = fast.break_even_ci
    assert low <= fast.break_even_steps <= high
    assert noisy.speedup_ci[0] < 1 < noisy.speedup_ci[1] and noisy.break_even_steps is None  # never: may save nothing
    assert free.up_front_s == 0 and free.break_even_steps == 0  # nothing to repay


def test_the_noise_floor_is_a_paired_interval_of_the_best_over_the_control():
    """Two overlapping intervals, each of a row against eager, can hide a difference the rounds
    both ran show at the verdict's level: the control's rounds and the best's move together (the same minutes)."""
    rng = random.Random(3)
    rounds_best, rounds_control = [], []
    for _ in range(6):
        minute = rng.gauss(0, 0.08)  # what each round's minutes did to both rows alike
        eager = [1.0] * 6
        rounds_best.append((eager, [math.exp(-minute) / 1.1 * (1 + 0.002 * i) for i in range(6)]))
        rounds_control.append((eager, [math.exp(-minute) * (1 + 0.002 * i) for i in range(6)]))
    eager = _eager(1.0)
    eager.round_samples, eager.rounds = [[1.0] * 4] * 6, [1.0] * 6
    best, control = _paired("best", rounds_best), _paired("eager-control", rounds_control)
    report = RunReport(environment={}, config=RunConfig(rounds=6), results=[eager, best, control])
    assert best.speedup_ci[0] <= control.speedup_ci[1]  # the intervals overlap: the old test said no pick
    low, _high = stats.paired_ratio(stats.paired_of(best), stats.paired_of(control),
                                    stats.round_prior(report.rows("cpu"), best, control))[1:]
    assert low > 1
    v = report.verdicts["cpu"]
    assert not v.below_control and v.pick == "best"


def test_memory_vs_eager_divides_by_the_eager_process_the_row_was_paired_with():
    eager, fast, _ = _drifting_rows()
    eager.peak_rss_steady_mb = 300.0  # its cold cell, alone: another kind of process
    fast.peak_rss_steady_mb, fast.eager_peak_rss_steady_mb = 380.0, 400.0
    RunReport(environment={}, config=RunConfig(rounds=2), results=[eager, fast])
    assert fast.memory_vs_eager == pytest.approx(0.95)  # 5 % less than its eager partner's, not 27 % more


def _serve(path, warmup, steps_s):
    import json
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    stream = sock.makefile("rwb", buffering=0)
    stream.write((json.dumps({"ready": 1, "warmup": warmup}) + "\n").encode())
    for line in stream:
        command = json.loads(line)
        if "steps" not in command:
            break
        stream.write((json.dumps({"samples": [steps_s] * command["steps"]}) + "\n").encode())
    sock.close()


class _FakeChild:
    """Stands in for ``launch.Child``: a thread serving as a cell would, and its ``finish``."""

    def __init__(self, warmup, steps_s):
        self.listener = Listener()
        threading.Thread(target=_serve, args=(self.listener.path, warmup, steps_s), daemon=True).start()
        self.finished = self.closed = False

    def wait_ready(self):
        peer = None
        while peer is None:
            peer = self.listener.accept()
        self.peer = peer
        return peer

    def killed(self):
        return False

    def finish(self):
        from cnncompare.core.run.launch import Outcome

        self.peer.stop()
        self.finished = True
        self.listener.close()
        return Outcome(CellRecord(peak_rss_steady_mb=123.0), 0, None, "")

    def close(self):
        self.closed = True


def test_each_cell_is_paired_with_a_fresh_eager_process_warmed_up_as_long():
    from cnncompare.core.run.cell import Pairing

    started = []

    def start_eager(warmup):
        started.append(warmup)
        started.append(child := _FakeChild(warmup, 1.0))
        return child

    pairing = Pairing(start_eager, steps=4, rng=random.Random(0), timeout_s=10)
    for warmup in (2, 5):
        cell = _FakeChild(warmup, 0.5)
        pairing.drive(cell.wait_ready())
        assert pairing.eager_samples == [1.0] * 4
        assert pairing.eager_outcome.record.peak_rss_steady_mb == 123.0
        cell.peer.stop()
        cell.listener.close()
    warmups, twins = started[::2], started[1::2]
    assert warmups == [2, 5]  # each cell's own warm-up, told in its ready message
    assert len(set(map(id, twins))) == 2 and all(t.finished for t in twins)  # one eager process per cell


def test_the_round_order_is_drawn_per_run_from_a_recorded_seed():
    from cnncompare.core.run.policy import round_order

    names = ["eager", "a", "b", "c", "d", "e"]
    config = RunConfig(rounds=2)

    def orders(seed):
        return [round_order(names, seed, "cpu", k, config.rounds) for k in range(1, 9)]

    assert orders(1) == orders(1)  # a resumed run repeats its rounds
    assert orders(1) != orders(2)
    firsts = {tuple(o) for o in orders(7)}
    assert len(firsts) > 4  # every round, the adaptive ones too, in an order of its own
    again = RunReport.from_json(RunReport(environment={}, config=config, order_seed=99).to_json())
    assert again.order_seed == 99  # the report records it


def test_parity_says_per_step_how_many_tensors_it_judged():
    from dataclasses import replace

    from cnncompare.core.cell.parity import coverage
    from cnncompare.core.records import Parity, StepCoverage

    keys = ["step1/grad:a", "step1/grad:b", "step3/grad:a", "step3/weight:a", "step3/buffer:b", "step3/grad:b"]
    got = coverage(keys, ["step3/grad:a", "step3/weight:a", "step3/buffer:b"])
    assert got == [StepCoverage(1, 2, 2), StepCoverage(3, 1, 4)] and got[1].under_half and not got[0].under_half
    eager, fast, _ = _drifting_rows()
    parity = Parity(passed=True, reference="float64 eager, 3 steps", multiplier=5.0, tolerance=0.01,
                    loss_rel_error=1e-7, grad_rel_error=1e-6, weight_rel_error=1e-3, eager_loss_rel_error=1e-7,
                    eager_grad_rel_error=1e-6, eager_weight_rel_error=1e-3, worst_tensor="step3/grad:b",
                    worst_error=1e-3, worst_limit=1e-2, margin=0.1, step=3, tensors=3, coverage=got)
    eager.parity, fast.parity = parity, replace(parity, coverage=[StepCoverage(1, 2, 2), StepCoverage(3, 2, 4)])
    md = render_markdown(RunReport(environment={}, config=RunConfig(rounds=2), results=[eager, fast]))
    assert "1 of the 4 tensors after step 3" in md  # the fewest any row judged
    assert "| step 1: 2 of 2; step 3: 1 of 4 " in md


def test_eager_as_the_best_of_a_paired_run_needs_the_paired_rounds_not_three():
    """With warm pairs a pick needs two rounds, eager's too when it is the best: the others were
    paired with it (the summary used to ask for a third round, saying the intervals came from one
    process's steps)."""
    eager = _eager(0.5)
    # 4x slower: one row of two rounds has one degree of freedom, whose t at the verdict's level is 100
    slower = _paired("slower", [([0.50, 0.51, 0.50, 0.52], [2.00, 2.02, 2.04, 2.00]),
                                ([0.51, 0.50, 0.52, 0.50], [2.02, 2.00, 2.00, 2.04])], compile_s=0.0)
    report = RunReport(environment={}, config=RunConfig(rounds=2), results=[eager, slower])
    v = report.verdicts["cpu"]
    assert v.best is eager and v.min_rounds == 2 and not v.too_few_rounds and v.pick == "eager", v
    assert "fewer than" not in render_markdown(report)
