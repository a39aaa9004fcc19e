"""The drift sentinel: a short fixed CPU probe timed at the start of every round.

The same work every time (fp32 matmuls at the run's thread count, in the
parent, between cells), so a change in its time is the machine's: frequency
scaling, another job on the cores, thermal limits. The report shows how far it
moved over the run beside the verdict it qualifies. It probes the host CPU
whatever the device: an accelerator's step time depends on the host that
launches its work too, and the parent never touches an accelerator.
"""
from __future__ import annotations

import statistics
import time

#: Matrix side and matmuls per repeat: about 12 ms a repeat on this project's 2-core CPU.
SIZE = 384
MATMULS = 20
REPEATS = 7


def sentinel_s(threads: int) -> float:
    """The median seconds of ``REPEATS`` repeats of ``MATMULS`` ``SIZE``² fp32 matmuls."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(SIZE, SIZE, generator=gen)
        b = torch.randn(SIZE, SIZE, generator=gen)
        torch.mm(a, b)  # first call: allocations, thread pool start
        times = []
        for _ in range(REPEATS):
            start = time.perf_counter()
            for _ in range(MATMULS):
                torch.mm(a, b)
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        torch.set_num_threads(before)
