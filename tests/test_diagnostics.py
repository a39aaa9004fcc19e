"""What the diagnostics say about CUDA graphs, checked without a GPU on fake CUDA-graph trees."""
from types import SimpleNamespace

import pytest

from cnncompare.core.cell import diagnostics
from cnncompare.core.config import RunConfig
from cnncompare.core.records import DynamoStats, Status
from cnncompare.core.report.markdown import render_markdown
from cnncompare.core.results import CellResult, RunReport
from cnncompare.core.stats import StepStats

# Importing torch._inductor imports TorchScript pieces that warn of their deprecation.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _node(*children):
    return SimpleNamespace(children={"f": list(children)} if children else {})


def test_cudagraphs_recorded_counts_every_node_of_every_tree(monkeypatch):
    from torch._inductor import cudagraph_trees

    manager = SimpleNamespace(get_roots=lambda: iter([_node(_node(), _node(_node())), _node()]))
    monkeypatch.setattr(cudagraph_trees, "get_manager", lambda index, create_if_none_exists: manager)
    assert diagnostics.cudagraphs_recorded(0) == 5
    monkeypatch.setattr(cudagraph_trees, "get_manager", lambda index, create_if_none_exists: None)
    assert diagnostics.cudagraphs_recorded(0) == 0  # inductor never made a tree: no CUDA graphs


def test_cudagraphs_recorded_is_unknown_where_the_private_api_differs(monkeypatch):
    from torch._inductor import cudagraph_trees

    def moved(*args, **kwargs):
        raise AttributeError("get_manager moved")

    monkeypatch.setattr(cudagraph_trees, "get_manager", moved)
    assert diagnostics.cudagraphs_recorded(0) is None


@pytest.mark.parametrize("recorded, shown", [(0, "CUDA graphs 0 recorded, 2 skipped"), (None, "CUDA graphs ? recorded")])
def test_report_says_whether_cuda_graphs_were_used(recorded, shown):
    dynamo = DynamoStats(graphs=1, graph_breaks=0, recompiles=0, frames_compiled=1, frames_seen=1, fell_back_to_eager=False,
                         cudagraph_skips=2, cudagraphs_recorded=recorded)
    row = CellResult(backend="compile-reduce-overhead", device="cuda:0", status=Status.OK, step_s=StepStats.from_samples([0.01]),
                     dynamo=dynamo)
    md = render_markdown(RunReport(environment={}, config=RunConfig(batch_size=4, warmup=1, steps=1),
                                   results=[row]))
    assert shown in md
