"""Why a compiled step is as fast as it is: dynamo's graphs, breaks and recompiles, and where the
compile time went.

Read from ``torch._dynamo.utils.counters`` (graphs, graph breaks and their
reasons, frames), dynamo's compile-start callbacks (a compile id ``f/n``
with ``n > 0`` is a recompilation of frame ``f``) and torch's compile metrics (``compile_phases``). The child is a fresh
process, so the counters belong to its cell alone; they are read right after
the measured steps, before the parity check compiles anything again.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Optional

from ..records import CompilePhases, DynamoStats


class DynamoWatch:
    """Started before ``backend.compile``; ``report()`` after the measured steps."""

    def __init__(self) -> None:
        self.compile_ids: list[str] = []
        self.fallback_messages: list[str] = []
        self._handler: Optional[logging.Handler] = None

    def start(self) -> "DynamoWatch":
        try:
            from torch._dynamo.callback import callback_handler

            callback_handler.register_start_callback(self._on_start)
        except Exception:  # older torch: recompiles stay unknown (None)
            self.compile_ids = None  # type: ignore[assignment]
        watch = self

        class _Fallback(logging.Handler):
            def emit(self, record: logging.LogRecord) -> None:
                text = record.getMessage()
                if "recompile_limit" in text or "cache_size_limit" in text or "falling back" in text.lower():
                    watch.fallback_messages.append(text.splitlines()[0][:300])

        self._handler = _Fallback(level=logging.WARNING)
        logging.getLogger("torch._dynamo").addHandler(self._handler)
        return self

    def _on_start(self, *args: Any) -> None:
        # torch >= 2.8 passes the compile's arguments (with its compile id); before that, nothing,
        # and the compile context already names the compile in progress.
        if args:
            self.compile_ids.append(str(getattr(args[0], "compile_id", args[0])))
            return
        from torch._guards import CompileContext

        self.compile_ids.append(str(CompileContext.current_compile_id()))

    def compiles(self) -> Optional[int]:
        """The compiles dynamo has started in the cell so far (recompiles included); None where
        this torch has no compile-start callbacks."""
        return None if self.compile_ids is None else len(self.compile_ids)

    def report(self, cuda_index: Optional[int] = None) -> Optional[DynamoStats]:
        """None when dynamo never ran in this cell (eager, TorchScript, …). ``cuda_index``:
        the cell's CUDA device, whose CUDA-graph trees are counted."""
        if "torch._dynamo" not in sys.modules:
            return None
        from torch._dynamo.utils import counters

        frames_total = int(counters["frames"]["total"])
        graphs = int(counters["stats"]["unique_graphs"])
        if frames_total == 0 and graphs == 0:
            return None
        breaks = dict(counters["graph_break"])
        recompiles = None
        if self.compile_ids is not None:
            recompiles = sum(1 for cid in self.compile_ids if _frame_compile_index(cid) > 0)
        result = DynamoStats(
            graphs=graphs,
            graph_breaks=int(sum(breaks.values())),
            recompiles=recompiles,
            frames_compiled=int(counters["frames"]["ok"]),
            frames_seen=frames_total,
            # Dynamo ran but captured nothing, or hit its recompile limit: the step ran (partly) eager.
            fell_back_to_eager=graphs == 0 or bool(self.fallback_messages),
            # The first line of each reason names it; the rest is dynamo's long explanation.
            break_reasons=[f"{reason.strip().splitlines()[0][:200]} (x{n})"
                           for reason, n in sorted(breaks.items(), key=lambda kv: -kv[1])[:5]],
            warnings=self.fallback_messages[:5],
            compile_phases=compile_phases(),
        )
        if "torch._inductor" in sys.modules and cuda_index is not None:
            # Whether CUDA graphs were really used: a mode that asks for them can still skip
            # them (CPU tensors, mutated inputs, dynamic shapes), and inductor only counts skips.
            result.cudagraph_skips = int(counters["inductor"].get("cudagraph_skips", 0))
            result.cudagraphs_recorded = cudagraphs_recorded(cuda_index)
        return result


def compile_phases() -> Optional[CompilePhases]:
    """The cell's compile time by phase (``records.CompilePhases``), from torch's compile metrics;
    None where this torch records none (or their fields have moved)."""
    try:
        from torch._dynamo import utils

        events = list(utils.get_compilation_metrics())
        timed = dict(utils.compilation_time_metrics)
    except Exception:
        return None
    if not events:
        return None

    def us(event: Any, name: str) -> float:
        return float(getattr(event, name, None) or 0) / 1e6

    dynamo = aot = inductor = codegen = 0.0
    for e in events:
        frame, backward = us(e, "dynamo_cumulative_compile_time_us"), us(e, "backward_cumulative_compile_time_us")
        backend, lowering, gen = (us(e, "aot_autograd_cumulative_compile_time_us"),
                                  us(e, "inductor_cumulative_compile_time_us"),
                                  us(e, "inductor_code_gen_cumulative_compile_time_us"))
        # Each total holds the next (a frame's compile holds its backend's, which holds inductor's):
        # the differences are each phase's own. A lazy backward's compile has no dynamo part.
        dynamo += max(frame - backend, 0.0)
        aot += max((backend or backward) - lowering, 0.0)
        inductor += max(lowering - gen, 0.0)
        codegen += gen
    autotune = [sum(v) for k, v in timed.items() if "autotune" in k.lower()]
    return CompilePhases(dynamo, aot, inductor, codegen, sum(autotune) if autotune else None, len(events))


def cudagraphs_recorded(device_index: int) -> Optional[int]:
    """CUDA graphs inductor's CUDA-graph trees recorded on this device in this process (0 when
    none were); None where this torch's private tree API differs."""
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(device_index, create_if_none_exists=False)
        if manager is None:
            return 0
        nodes, count = list(manager.get_roots()), 0
        while nodes:
            node = nodes.pop()
            count += 1
            for children in node.children.values():
                nodes.extend(children)
        return count
    except Exception:
        return None


def _frame_compile_index(compile_id: str) -> int:
    """'0/1' or '[0/1]' (frame 0, second compilation) -> 1; unknown forms -> 0."""
    text = compile_id.strip("[]").split("_")[0]
    try:
        return int(text.split("/")[1])
    except (IndexError, ValueError):
        return 0
