"""Charts beside the report (or a hint without matplotlib), and the progress displays."""
import io

import pytest

from _tiny import TINY_WORKLOAD
from cnncompare.core.config import RunConfig
from cnncompare.core.records import Status
from cnncompare.core.report import charts
from cnncompare.core.report.markdown import render_markdown
from cnncompare.core.results import CellResult, RunReport
from cnncompare.core.run.progress import BarProgress, LineProgress, for_stream
from cnncompare.core.stats import StepStats

CONFIG = RunConfig(batch_size=4, workload=TINY_WORKLOAD, steps=3, warmup=1)


def _report():
    rows = [CellResult(backend="eager", device="cpu", status=Status.OK, compile_s=0.0, first_step_s=0.2,
                       step_s=StepStats.from_samples([0.1, 0.11, 0.12])),
            CellResult(backend="compile", device="cpu", status=Status.OK, compile_s=3.0, first_step_s=30.0,
                       step_s=StepStats.from_samples([0.05, 0.06, 0.07])),
            CellResult(backend="broken", device="cpu", status=Status.CRASHED)]
    return RunReport(environment={"cpu": "x", "threads": 1}, config=CONFIG, results=rows)


@pytest.mark.skipif(not charts.matplotlib_available(), reason="matplotlib not installed (cnncompare[plot])")
def test_charts_are_pngs_linked_from_the_report(tmp_path):
    report = _report()
    written = charts.write_charts(report, tmp_path / "run.md")
    assert [name for _, name in written] == ["run-speedup.png", "run-step-time.png", "run-compile-vs-step.png"]
    for _, name in written:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = render_markdown(report, written, final=True)
    assert "![Speedup over eager](run-speedup.png)" in md and "![Step time per backend](run-step-time.png)" in md
    assert charts.PLOT_HINT not in md
    # Without a speedup to draw (eager alone), no speedup chart.
    alone = RunReport(environment={"cpu": "x", "threads": 1}, config=CONFIG, results=report.results[:1])
    assert [name for _, name in charts.write_charts(alone, tmp_path / "alone.md")] == \
        ["alone-step-time.png", "alone-compile-vs-step.png"]


def test_without_matplotlib_the_report_says_how_to_get_charts(tmp_path, monkeypatch):
    monkeypatch.setattr(charts, "matplotlib_available", lambda: False)
    report = _report()
    assert charts.write_charts(report, tmp_path / "run.md") is None
    assert list(tmp_path.iterdir()) == []
    assert charts.PLOT_HINT in render_markdown(report, None, final=True)
    assert charts.PLOT_HINT not in render_markdown(report)  # streamed, not final: charts come at the end


def test_plain_progress_is_quiet_for_quick_phases_and_beats_for_slow_ones(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("cnncompare.core.run.progress.time.monotonic", lambda: clock[0])
    out = io.StringIO()
    p = LineProgress(out)
    p.start_cell(1, 2, "compile on cpu")
    p.phase("compile", 0, 1)
    clock[0] += 5
    p.phase("first_step", 0, 1)
    assert out.getvalue() == "[1/2] compile on cpu ...\n"
    clock[0] += 21
    p.phase("first_step", 0, 1)
    assert out.getvalue().splitlines()[-1] == "[1/2] compile on cpu: still in first step (lazy compilers compile here), 21 s"
    clock[0] += 21
    p.phase("steps", 4, 20)
    assert out.getvalue().splitlines()[-1] == "[1/2] compile on cpu: still in measured steps, 4/20, 0 s"
    p.end_cell("compile on cpu", "ok")
    assert out.getvalue().splitlines()[-1] == "[1/2] compile on cpu: ok"


def test_terminal_gets_a_bar_with_cell_and_phase():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    out = Tty()
    p = for_stream(out)
    assert isinstance(p, BarProgress)
    p.start_run(2)
    p.start_cell(1, 2, "eager on cpu")
    p.phase("steps", 3, 20)
    p.bar.refresh()
    assert "eager on cpu" in out.getvalue() and "measured steps 3/20" in out.getvalue()
    p.end_cell("eager on cpu", "ok  median 1 s/step")
    p.end_run()
    assert "eager on cpu: ok  median 1 s/step" in out.getvalue()
    assert isinstance(for_stream(io.StringIO()), LineProgress)
