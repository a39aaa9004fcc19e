"""The report as data: JSON (the schema is the result dataclasses) and one CSV row per cell."""
from __future__ import annotations

import csv
import io
from typing import Any

from ..results import RunReport

#: CSV columns: the JSON's keys, nested ones dotted. ``step_time_s`` and ``images_per_s`` derive
#: from the speedup (eager's paired step / the speedup); ``step_s.*`` are the row's own processes'
#: steps, unpaired.
CSV_COLUMNS = (
    "backend", "device", "status", "plugin", "speedup_vs_eager", "step_time_s", "images_per_s", "up_front_s",
    "break_even_steps", "loop.total_s", "loop.speedup_vs_eager", "loop.recompiles", "compile_s", "first_step_s",
    "step_s.median", "step_s.q1", "step_s.q3", "step_s.min",
    "step_s.max", "step_s.n", "memory_vs_eager", "allocated_peak_steady_mb", "threads", "peak_rss_mb", "cuda_peak_allocated_mb",
    "cuda_peak_reserved_mb",
    "parity.passed", "parity.margin", "parity.worst_tensor", "parity.loss_rel_error", "parity.grad_rel_error",
    "parity.weight_rel_error", "parity.buffer_rel_error",
    "distributed.nproc", "distributed.global_images_per_s", "distributed.slowest_rank_step_median_s",
    "distributed.scaling_efficiency", "error",
)


def render_json(report: RunReport) -> str:
    return report.to_json()


def render_csv(report: RunReport) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row in report.to_dict()["results"]:
        values = []
        for column in CSV_COLUMNS:
            value: Any = row
            for part in column.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            values.append("" if value is None else value)
        writer.writerow(values)
    return buf.getvalue()
