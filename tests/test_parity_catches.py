"""Parity catches backends that compute something else, and passes correct ones with margin.

Each wrong backend (tests/wrong_backends.py) is written from the documented contract only. The
tiny config runs whole cells in child processes, as a user's run does, long enough (8 steps)
for a backend that stops training after step 4 to show. The same backends at the default
config (batch 128, 28x28), where the correct built-ins' margins are held to at most half their
limit, are bench/parity_margins.py's (output committed in reports/parity-margins.md): its float64
reference alone takes a minute on 2 cores, more than the suite's budget gives one test.
"""
import pytest

import wrong_backends
from cnncompare.core.config import RunConfig
from cnncompare.core.records import Status
from cnncompare.core.results import RunReport
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry

pytestmark = pytest.mark.e2e

WRONG = tuple(cls.name for cls in wrong_backends.WRONG)


def _run(config: RunConfig) -> dict:
    registry = load_registry(extra_plugins=[wrong_backends], entry_points=False)
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, registry, report, on_result=lambda rep: None)
    return {r.backend: r for r in report.results}


def _assert_verdicts(rows: dict, correct: tuple, wrong: tuple, max_margin: float, steps: int) -> None:
    for name in wrong:
        r = rows[name]
        assert r.status is Status.FAIL_ACCURACY and not r.parity.passed, (name, r.status, r.error, r.error_tail)
        assert r.parity.margin > 2, (name, r.parity)  # not a near miss: wrong by a clear multiple of the limit
        assert r.error.startswith("parity: ")
        assert r.parity.worst_tensor.split(":")[-1] in r.error
    for name in correct:
        r = rows[name]
        assert r.status is Status.OK and r.parity.passed, (name, r.error, r.error_tail)
        assert r.parity.margin <= max_margin, (name, r.parity.worst_tensor, r.parity.margin)
        assert r.parity.step == 3 and r.parity.tensors > 30 and r.parity.check_s > 0
        assert r.parity.precision == "fp32" and r.parity.trajectory_steps == steps


def test_wrong_backends_fail_and_correct_ones_pass_at_the_tiny_config(tiny_config, fresh_reference_cache):
    correct = ("eager", "eager-fused", "channels-last")
    rows = _run(tiny_config(backends=correct + WRONG, devices=("cpu",), steps=5))
    _assert_verdicts(rows, correct, WRONG, max_margin=0.5, steps=8)
    # The reference was computed once, in a process of its own; its cost is on the first row.
    assert rows["eager"].parity.reference_s > 0
    assert all(rows[name].parity.reference_s is None for name in correct[1:] + WRONG)
