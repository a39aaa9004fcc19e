"""The parity reference's cache on disk: computed once, reused by the next run, keyed by what it
depends on, bounded, and said in the report."""
import json
import os
import time

import pytest

from _usage import run_cli
from cnncompare.core.config import RunConfig
from cnncompare.core.records import ReferencePlan, Status
from cnncompare.core.report.markdown import render_markdown
from cnncompare.core.results import RunReport
from cnncompare.core.run import cell, reference_cache
from cnncompare.core.run.devices import DeviceSlot
from cnncompare.core.run.orchestrate import plan_cells, run_cells
from cnncompare.plugins import load_registry
from cnncompare.workloads.factory import FactoryWorkload

PLAN = ReferencePlan(parity_steps=(3,), steps=9)


@pytest.fixture
def cache(fresh_reference_cache):
    return fresh_reference_cache


def _run(config: RunConfig) -> RunReport:
    report = RunReport(environment={}, config=config)
    run_cells(plan_cells(config, [DeviceSlot("cpu")]), config, load_registry(), report, on_result=lambda rep: None)
    return report


def test_a_second_run_reuses_the_reference_and_says_so(cache, monkeypatch, tiny_config):
    config = tiny_config(backends=("eager", "compile"), devices=("cpu",))
    first = _run(config)
    info = first.references["cpu"]
    assert not info.reused and info.seconds > 0 and info.cache and info.computed_at
    entries = [p for p in cache.iterdir() if not p.name.startswith(".")]
    assert [str(p) for p in entries] == [info.cache]
    key = json.loads((entries[0] / "key.json").read_text())
    assert key["workload"]["name"] == "seed-cnn" and key["workload"]["sha256"] and key["torch"]
    assert first.rows("cpu")[0].parity.reference_s == pytest.approx(info.seconds)
    assert "computed once and cached for the next run" in render_markdown(first)

    monkeypatch.setattr(cell, "_REFERENCES", {})  # a new process: only the disk remembers
    second = _run(config)
    again = second.references["cpu"]
    assert again.reused and again.cache == info.cache and again.seconds == info.seconds
    rows = {r.backend: r for r in second.results}
    assert all(r.status is Status.OK and r.parity.passed for r in rows.values()), [(r.backend, r.error) for r in rows.values()]
    # the judgement is the same, from the same reference
    assert rows["eager"].parity.margin == pytest.approx(first.rows("cpu")[0].parity.margin)
    assert rows["eager"].parity.reference_s == 0.0
    md = render_markdown(second)
    assert "reused from the cache" in md and "--no-cache" in md
    assert RunReport.from_json(second.to_json()).references == second.references


def test_no_cache_computes_afresh_and_stores_nothing(cache, tiny_config):
    report = _run(tiny_config(backends=("eager",), devices=("cpu",), reference_cache=False))
    info = report.references["cpu"]
    assert not info.reused and info.cache is None and info.seconds > 0
    assert not cache.exists() or not any(cache.iterdir())
    assert report.results[0].parity.passed


def test_the_key_follows_what_the_reference_depends_on(tmp_path, tiny_config):
    model = tmp_path / "model.py"
    model.write_text("import torch\ndef build():\n    return torch.nn.Linear(4, 2), lambda n, g: None\n")
    workload = FactoryWorkload.__new__(FactoryWorkload)  # its file, without importing it
    workload.name, workload.path, workload.module = f"{model}:build", str(model), None
    config = tiny_config()
    name, described = reference_cache.key(workload, "cpu", config, PLAN)
    assert described["workload"]["file"] == "model.py"
    # what runs, for how long and how it is paired don't change the reference
    for same in (dict(backends=("eager", "compile")), dict(budget_s=30.0), dict(rounds=4), dict(round_s=2.0),
                 dict(reference_cache=False), dict(timeout_s=5.0)):
        assert reference_cache.key(workload, "cpu", tiny_config(**same), PLAN)[0] == name, same
    # what it trains does
    for other in (dict(batch_size=8), dict(seed=1), dict(lr=1e-2), dict(mode="inference"), dict(threads=2)):
        assert reference_cache.key(workload, "cpu", tiny_config(**other), PLAN)[0] != name, other
    assert reference_cache.key(workload, "cpu", config, ReferencePlan((3,), 9, ("bf16",)))[0] != name
    model.write_text(model.read_text() + "# edited\n")  # the user's model changed
    assert reference_cache.key(workload, "cpu", config, PLAN)[0] != name


def test_the_least_recently_used_entries_go_first(cache, monkeypatch):
    monkeypatch.setattr(reference_cache, "MAX_ENTRIES", 2)
    made = []
    for i in range(3):
        staged = reference_cache.staging()
        (staged / "reference-cpu.pt").write_bytes(b"x" * 10)
        (staged / "reference-cpu.json").write_text("{}")
        made.append(reference_cache.publish(staged, f"entry{i}", {"i": i}))
        old = time.time() - 100 * (3 - i)
        os.utime(made[-1], (old, old))
    assert reference_cache.lookup("entry0", "cpu") is None and reference_cache.lookup("entry1", "cpu") is not None
    assert sorted(p.name for p in cache.iterdir()) == ["entry1", "entry2"]
    monkeypatch.setattr(reference_cache, "MAX_BYTES", reference_cache._size(made[1]))  # one entry's worth
    assert reference_cache.lookup("entry1", "cpu") is not None  # used now: the most recent
    assert [p.name for p in reference_cache.evict()] == ["entry2"]
    (made[1] / "reference-cpu.pt").unlink()  # a file deleted by hand: the entry is made again
    assert reference_cache.lookup("entry1", "cpu") is None and not made[1].exists()


def test_a_cache_that_cant_be_written_costs_only_the_reuse(monkeypatch, tmp_path, tiny_config):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(reference_cache.ENV_DIR, str(blocker / "cache"))  # under a file: no directory can be made
    monkeypatch.setattr(cell, "_REFERENCES", {})
    report = _run(tiny_config(backends=("eager",), devices=("cpu",)))
    info = report.references["cpu"]
    assert report.results[0].parity.passed and info.cache is None and not info.reused
    assert "can't be used" in info.note and "computed for this run only" in render_markdown(report)


def test_the_command_line_reuses_and_no_cache_recomputes(cache, tmp_path, capsys, monkeypatch):
    """From the command line, as a user runs it twice (each run a new process: the in-process
    table is cleared between them), then once with ``--no-cache``."""
    args = ["--backends", "eager", "--devices", "cpu", "--batch-size", "4", "--image-size", "8", "--steps", "2",
            "--warmup", "0", "--rounds", "1", "--round-time", "0", "--threads", "1", "--no-control"]
    seen = []
    for i, extra in enumerate(([], [], ["--no-cache"])):
        monkeypatch.setattr(cell, "_REFERENCES", {})
        code, _, err = run_cli(capsys, *args, *extra, "--output", str(tmp_path / f"run{i}.md"))
        assert code == 0, err
        data = json.loads((tmp_path / f"run{i}.json").read_text())
        assert data["results"][0]["parity"]["passed"]
        seen.append((data["config"]["reference_cache"], data["references"]["cpu"]["reused"],
                     data["references"]["cpu"]["cache"] is not None))
    assert seen == [(True, False, True), (True, True, True), (False, False, False)]
    assert "reused from the cache" in (tmp_path / "run1.md").read_text()


def test_an_evicted_entry_this_process_remembers_is_made_again(cache, tiny_config):
    """The in-process table remembers where a reference lies; the cache may evict it meanwhile
    (other runs publish newer entries): the next run makes it again instead of linking nothing."""
    import shutil

    config = tiny_config(backends=("eager",), devices=("cpu",))
    first = _run(config).references["cpu"]
    shutil.rmtree(first.cache)
    second = _run(config)
    again = second.references["cpu"]
    assert second.results[0].status is Status.OK and second.results[0].parity.passed, second.results[0].error
    assert not again.reused and again.cache == first.cache and os.path.isdir(again.cache)
