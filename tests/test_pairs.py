"""Warm interleaved pairs: the statistics over them, the verdict from them, and the line protocol
between the parent and a serving cell (``run/pairs.py``, ``cell/serve.py``)."""
import random
import threading

import pytest

from cnncompare.core import stats
from cnncompare.core.records import Status
from cnncompare.core.results import CellResult
from cnncompare.core.run.pairs import MAX_PAIRS, Listener, PeerLost, interleave, round_size


def _paired(name, rounds):
    """A row from ``[(eager steps, its steps), ...]`` per round ([] for a round it sat out)."""
    row = CellResult(backend=name, device="cpu", status=Status.OK,
                     step_s=stats.StepStats.from_samples([s for _, b in rounds for s in b]))
    row.round_samples = [list(b) for _, b in rounds]
    row.round_eager_samples = [list(e) for e, _ in rounds]
    row.rounds = [sorted(b)[len(b) // 2] if b else None for _, b in rounds]
    return row


def _rounds(rng, ratio, n_rounds=4, pairs=8, within=0.08, between=0.0):
    out = []
    for _ in range(n_rounds):
        shift = rng.gauss(0, between)
        out.append(([rng.lognormvariate(0, within) for _ in range(pairs)],
                    [rng.lognormvariate(shift, within) / ratio for _ in range(pairs)]))
    return out


def test_the_speedup_is_the_geometric_mean_of_step_pair_ratios_with_an_interval_over_rounds():
    rounds = (((1.0, 1.0), (0.5, 0.5)), ((2.0, 2.0), (1.0, 1.0)))  # round 2 on a machine twice as slow
    assert stats.paired_speedup(rounds) == pytest.approx((2.0, 2.0, 2.0))
    rng = random.Random(0)
    noisy = tuple((tuple(e), tuple(b)) for e, b in _rounds(rng, 1.5))
    speedup, low, high = stats.paired_speedup(noisy)
    assert low < speedup < high and low < 1.5 < high
    assert stats.paired_speedup(noisy) == (speedup, low, high)  # seeded
    # The rounds' own speeds widen it: the same steps with a spread between rounds give a wider interval.
    rng = random.Random(0)
    apart = tuple((tuple(e), tuple(b)) for e, b in _rounds(rng, 1.5, between=0.1))
    _, low2, high2 = stats.paired_speedup(apart)
    assert high2 / low2 > high / low
    assert stats.half_width(2.0, 1.9, 2.2) == pytest.approx(0.1)
    # Two rounds whose means agree by chance still carry their steps' scatter: no zero-width interval.
    lucky = (((1.0, 1.2, 0.8), (0.5, 0.5, 0.5)), ((1.2, 0.8, 1.0), (0.5, 0.5, 0.5)))
    speedup, low, high = stats.paired_speedup(lucky)
    assert low < speedup < high and high / low > 1.5  # t with 1 degree of freedom is 12.7
    # A third round narrows it most (t falls from 12.7 to 4.3).
    third = lucky + (((1.0, 1.0, 1.0), (0.5, 0.5, 0.5)),)
    _, low3, high3 = stats.paired_speedup(third)
    assert high3 / low3 < high / low


def test_the_rounds_variance_pooled_over_rows_narrows_two_rounds_and_still_covers():
    """Rows with this machine's noise (a step pair's log ratio 0.075, a process pair's 0.032; 2
    rounds of 4 step pairs): each row's own t has 1 degree of freedom (12.7); pooled with the
    other rows' rounds it has dozens, and the interval still covers the true ratio."""
    rng = random.Random(3)
    rows = [tuple((tuple(e), tuple(b)) for e, b in _rounds(rng, 1.3, n_rounds=2, pairs=4, within=0.075, between=0.032))
            for _ in range(40)]
    covered = narrower = 0
    for i, r in enumerate(rows):
        prior = stats.Pooled.of(rows[:i] + rows[i + 1:])
        assert prior is not None and prior.df == 39
        _, low, high = stats.paired_speedup(r, prior)
        _, own_low, own_high = stats.paired_speedup(r)
        covered += low < 1.3 < high
        narrower += high / low < own_high / own_low
    assert narrower == 40 and covered >= 35  # 95 % of 40 is 38
    # One round with a prior gets the pooled interval, not a bootstrap over its own steps.
    _, low, high = stats.paired_speedup(rows[0][:1], stats.Pooled.of(rows[1:]))
    assert low < 1.3 < high
    assert stats.Pooled.of([rows[0][:1]]) is None  # one round says nothing about rounds


def test_an_empty_or_unequal_round_pairs_with_nothing():
    rounds = (((1.0,), (0.5,)), ((), ()), ((1.0, 2.0), (0.5,)), ((1.0,), (0.5,)))
    assert stats.paired_speedup(rounds) == pytest.approx((2.0, 2.0, 2.0))
    with pytest.raises(ValueError):
        stats.paired_speedup(((), ()),)


def test_the_best_over_a_contender_is_judged_in_the_rounds_both_ran():
    rng = random.Random(1)
    fast, close, slow = (_paired(n, _rounds(rng, r, n_rounds=5, pairs=10, within=0.03))
                         for n, r in (("fast", 1.5), ("close", 1.49), ("slow", 1.2)))
    eager = _paired("eager", [(b, b) for _, b in _rounds(rng, 1.0, n_rounds=5)])
    eager.round_eager_samples = None  # eager's own row has no pairs
    rows = [eager, fast, close, slow]
    stats.derive(rows, units_per_step=1, target_pct=3.0)
    assert fast.target_reached is True or fast.target_reached is False
    v = stats.verdict("cpu", rows, rounds=5)
    assert v.best in (fast, close) and "slow" not in v.tied_with
    assert {v.best.backend, *v.tied_with} >= {"fast", "close"}  # 1 % apart: a tie, not a pick


def test_one_round_of_pairs_picks_nothing_and_two_may():
    rng = random.Random(2)
    eager = _paired("eager", [([1.0] * 5, [1.0] * 5)] * 2)
    eager.round_eager_samples = None
    fast = _paired("fast", _rounds(rng, 2.0, n_rounds=2, within=0.01))
    stats.derive([eager, fast], units_per_step=1, target_pct=3.0)
    assert stats.verdict("cpu", [eager, fast], rounds=2).pick == "fast"
    assert stats.verdict("cpu", [eager, fast], rounds=1).pick is None


def test_rounds_to_target_estimates_how_many_rounds_narrow_an_interval_to_it():
    """From 3 rounds of this machine's noise, the estimate of the rounds a ±3 % half-width needs;
    rows then run that many rounds reach about ±3 % (an estimate: the median within 25 %)."""
    rng = random.Random(5)
    sim = dict(within=0.075, between=0.032, pairs=4)
    rows = [tuple((tuple(e), tuple(b)) for e, b in _rounds(rng, 1.2, n_rounds=3, **sim)) for _ in range(30)]
    reached = []
    for i, r in enumerate(rows):
        prior = stats.Pooled.of(rows[:i] + rows[i + 1:])
        needed = stats.rounds_to_target(*stats.paired_speedup(r, prior), 3, 0.03)
        assert needed > 3
        longer = r + tuple((tuple(e), tuple(b)) for e, b in _rounds(rng, 1.2, n_rounds=needed - 3, **sim))
        reached.append(stats.half_width(*stats.paired_speedup(longer, prior)))
    assert 0.03 * 0.75 < sorted(reached)[len(reached) // 2] < 0.03 * 1.25
    assert stats.rounds_to_target(1.0, 0.99, 1.01, 3, 0.03) == 3  # already there: no more
    assert stats.rounds_to_target(1.0, 1 / 1.06, 1.06, 2, 0.03) == 8  # twice as wide: four times the rounds


def test_the_rounds_line_says_what_reaching_the_target_would_take_at_the_rounds_cost():
    from cnncompare.core.config import RunConfig
    from cnncompare.core.report.summary import rounds_line
    from cnncompare.core.results import RoundInfo

    rng = random.Random(6)
    eager = _paired("eager", [([1.0] * 4, [1.0] * 4)] * 3)
    eager.round_eager_samples = None
    rows = [eager] + [_paired(f"b{i}", _rounds(rng, 1.1, n_rounds=3, pairs=4, within=0.075, between=0.032))
                      for i in range(3)]
    for r in rows[1:]:
        # Round 1 compiled cold (30 s more than a warm round's compile and first step): 10 s a round.
        r.wall_s, r.round_compile_s, r.round_first_step_s = 60.0, [20.5, 0.5, 0.5], [11.0, 1.0, 1.0]
        assert stats.later_round_s(r) == pytest.approx(10.0)
    stats.derive(rows, units_per_step=1, target_pct=3.0)
    cost = stats.target_cost(rows, 3.0)
    assert cost is not None and cost.widest in {"b0", "b1", "b2"}
    expected = sum((stats.rounds_to_target(r.speedup_vs_eager, *r.speedup_ci, 3, 0.03) - 3) * 10.0 for r in rows[1:])
    assert cost.extra_s == pytest.approx(expected) and cost.extra_s > 0
    config = RunConfig(target=3.0, budget_s=540.0)
    line = rounds_line("cpu", [RoundInfo(order=[])] * 3, rows, config)
    assert f"`--budget {540 + cost.extra_s:.0f}`" in line and f"about {cost.rounds} rounds" in line
    for r in rows[1:]:
        r.wall_s = None  # a round's cost unknown: no estimate rather than a wrong one
    assert stats.target_cost(rows, 3.0) is None and "--budget" not in rounds_line("cpu", [RoundInfo(order=[])] * 3, rows, config)


def _serve(listener_path, replies, stop_after=None):
    """A stand-in serving cell: answers each steps command with ``replies(n)``."""
    import json
    import socket

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(listener_path)
    stream = sock.makefile("rwb", buffering=0)
    stream.write(b'{"ready": 1}\n')
    served = 0
    for line in stream:
        command = json.loads(line)
        if "steps" not in command or (stop_after is not None and served >= stop_after):
            break
        served += command["steps"]
        stream.write((json.dumps({"samples": replies(command["steps"])}) + "\n").encode())
    sock.close()


def _peer(replies, stop_after=None):
    listener = Listener()
    thread = threading.Thread(target=_serve, args=(listener.path, replies, stop_after), daemon=True)
    thread.start()
    peer = None
    while peer is None:
        peer = listener.accept()
    return listener, peer


def test_interleave_alternates_one_step_each_in_a_random_order_and_a_lost_peer_says_so():
    order = []
    a_listener, a = _peer(lambda n: order.append("a") or [0.5] * n)
    b_listener, b = _peer(lambda n: order.append("b") or [1.0] * n)
    mine, theirs = interleave(a, b, 6, random.Random(0), timeout_s=10)
    assert mine == [0.5] * 6 and theirs == [1.0] * 6
    assert all(sorted(order[i:i + 2]) == ["a", "b"] for i in range(0, 12, 2))  # one of each per pair
    assert order[::2] != ["a"] * 6 and order[::2] != ["b"] * 6  # the order inside a pair is drawn
    a.stop()
    b.stop()
    c_listener, c = _peer(lambda n: [0.1] * n, stop_after=2)
    with pytest.raises(PeerLost):
        for _ in range(3):
            c.steps(1, timeout_s=10)
    assert c.lost
    for listener in (a_listener, b_listener, c_listener):
        listener.close()


def test_fast_steps_get_more_pairs_in_chunks_and_slow_ones_keep_steps_one_at_a_time():
    assert round_size(0.6, 4, 2.0) == (4, 1)  # seed-cnn: --steps pairs, step by step
    assert round_size(0.01, 4, 2.0) == (200, 5)  # 2 s of 10 ms steps, 50 ms at a time
    assert round_size(1e-5, 4, 2.0) == (MAX_PAIRS, MAX_PAIRS)
    assert round_size(0.01, 4, 0.0) == (4, 4)  # --round-time 0: --steps pairs
    sizes = []
    a_listener, a = _peer(lambda n: sizes.append(n) or [0.5] * n)
    b_listener, b = _peer(lambda n: [1.0] * n)
    mine, theirs = interleave(a, b, 7, random.Random(0), timeout_s=10, chunk=3)
    assert mine == [0.5] * 7 and theirs == [1.0] * 7 and sizes == [3, 3, 1]
    for peer, listener in ((a, a_listener), (b, b_listener)):
        peer.stop()
        listener.close()
