"""The stopping rule (``run/policy.py`` with ``stats.verdict``) on simulated step pairs: a clear
winner stops early, a true tie or a field that nothing beats names a pick no more often than the
rule's stated 5 %, and the rounds go to the contenders only. The simulator is
``bench/stopping_rule.py``'s, which feeds the real policy, derive and verdict round by round."""
import importlib.util
import random
import sys
from pathlib import Path

import pytest

from cnncompare.core import stats
from cnncompare.core.config import RunConfig
from cnncompare.core.run.policy import Decide, Precise, policy_for

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def sim():
    spec = importlib.util.spec_from_file_location("stopping_rule", ROOT / "bench" / "stopping_rule.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_a_clear_winner_is_picked_within_a_few_rounds(sim):
    rng, draw = random.Random(1), sim.normal_draw()
    outcomes = [sim.simulate({"a": 1.4, "b": 1.1, "c": 0.9}, draw, rng) for _ in range(30)]
    assert all(o.pick == "a" for o in outcomes)
    assert max(o.rounds for o in outcomes) <= 5 and min(o.rounds for o in outcomes) >= 2


@pytest.mark.parametrize("truth", [{"a": 1.2, "b": 1.2, "c": 1.0}, {"a": 1.0, "b": 1.0}],
                         ids=["tie-at-the-top", "nothing-beats-eager"])
def test_a_true_tie_names_a_pick_no_more_often_than_the_stated_rate(sim, truth):
    """Up to 13 rounds (looks after 2, 3, 5, 8 and 13), 120 runs: the rule promises a wrong pick
    in at most 5 % of runs; Bonferroni over the looks makes it rarer still, so 6 of 120 (5 %)
    is the most this allows."""
    rng, draw = random.Random(2), sim.normal_draw()
    outcomes = [sim.simulate(truth, draw, rng, max_rounds=13) for _ in range(120)]
    assert sum(sim.wrong(truth, o.pick) for o in outcomes) <= 6
    undecided = [o for o in outcomes if o.pick is None]
    assert undecided and all(o.rounds == 13 and len(o.undecided_between) >= 2 for o in undecided)


def test_rounds_after_a_look_go_to_the_contenders_only(sim):
    """A row clearly slower than the best gets no round after the first look; the best and the
    row tied with it do, and the control in every round."""
    rng, draw = random.Random(3), sim.normal_draw(process=0.0, step=0.01)
    truth = {"a": 1.3, "b": 1.3, "slow": 0.7}
    outcome = sim.simulate(truth, draw, rng, max_rounds=4)
    assert outcome.pick is None and set(outcome.undecided_between) == {"a", "b"}
    policy = Decide(first=2)
    assert [k for k in range(1, 40) if policy.looks_after(k)] == [2, 3, 5, 8, 13, 21, 34]
    assert Decide(first=4).looks_after(4) and not Decide(first=4).looks_after(3)


def test_the_verdict_tests_at_a_level_that_covers_every_look():
    assert stats.VERDICT_CONFIDENCE == pytest.approx(1 - 0.05 / stats.MAX_LOOKS)
    assert stats.MAX_LOOKS == len(stats.LOOKS) + 1


def test_the_policy_follows_the_flags():
    assert isinstance(policy_for(RunConfig()), Decide)
    assert isinstance(policy_for(RunConfig(target=3.0)), Precise)
    assert policy_for(RunConfig(rounds=1)) is None


def test_the_summary_says_when_the_pick_was_decided_or_what_would_decide_it(sim):
    from cnncompare.core.report.markdown import render_markdown

    decided = sim.simulate({"a": 1.4, "b": 1.1}, sim.normal_draw(), random.Random(4))
    text = render_markdown(decided.report)
    assert decided.pick == "a" and f"Decided after {decided.rounds} rounds" in text
    assert "99.4 %" in text  # the level the verdict tested at, in the rounds line
    tied = sim.simulate({"a": 1.2, "b": 1.12}, sim.normal_draw(), random.Random(5), max_rounds=3, control=False)
    text = render_markdown(tied.report)
    assert tied.pick is None and "Undecided between **a** and **b** after 3 rounds" in text
    assert "separating them would take about" in text and "`--budget" in text
    assert tied.report.verdicts["cpu"].rounds_to_separate > 3


def test_a_round_the_budget_pays_only_for_the_best_is_not_run(sim):
    """Compared with nothing, the best's round decides nothing (unless eager is what it must still
    clear: every round has eager's processes); the device stops instead."""
    tied = sim.simulate({"a": 1.2, "b": 1.19}, sim.normal_draw(), random.Random(5), max_rounds=3, control=False)
    v = tied.report.verdicts["cpu"]
    assert v.pick is None and "eager" not in v.undecided_between and len(v.undecided_between) == 2
    rows = tied.report.rows("cpu")
    assert Decide(first=2).next_round(4, rows, v, 10.0, lambda name: 6.0) == []
    assert Decide(first=2).next_round(4, rows, v, 12.0, lambda name: 6.0) == v.undecided_between
