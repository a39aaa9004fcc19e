"""How far identical processes' steady peak RSS scatter: what one pair's memory ratio can tell.

    python bench/memory_scatter.py [--processes 6] [--batch 128] [--image-size 28] [--threads 2]

No cnncompare cell, pairing or server: seed-cnn's training step (Adam, NLL loss, a new batch
each step) in a bare loop, 3 warm-up steps, then the peak RSS of 4 steps (``VmHWM`` after
``/proc/self/clear_refs``, as a cell measured its steady peak), then the allocated peak of one
more step (``allocated_peak_mb``, what a cell measures now). Run two ways: each process started
afresh, and each forked from one parent that imported torch first (as cnncompare's fork server
does). Every process runs the same code on the same data, so any spread is the process's own:
RSS carries the C library's heap, its arenas and when it returns memory to the OS; the
allocated peak does not. Prints a markdown table; Linux with glibc 2.33+.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys

STEADY = """
import sys
import torch
import torch.nn.functional as F

from cnncompare.core.cell.memory import allocated_peak_mb, peak_rss_mb, reset_peak_rss
from cnncompare.workloads.seed_cnn import SeedCNN


def steady_peak(batch, size, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = SeedCNN(size)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step():
        x, y = torch.randn(batch, 3, size, size), torch.randint(0, 10, (batch,))
        optimizer.zero_grad()
        F.nll_loss(model(x), y).backward()
        optimizer.step()

    for _ in range(3):
        step()
    reset_peak_rss()
    for _ in range(4):
        step()
    import time
    start = time.perf_counter()
    allocated = allocated_peak_mb(step)
    return peak_rss_mb(), allocated, time.perf_counter() - start
"""

FORKED = STEADY + """
import os
batch, size, threads, n = map(int, sys.argv[1:5])
for _ in range(n):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, ("%.1f %.3f %.2f\\n" % steady_peak(batch, size, threads)).encode())
        os._exit(0)
    os.close(write)
    print(os.read(read, 64).decode().strip().replace(" ", ","), flush=True)
    os.waitpid(pid, 0)
"""

FRESH = STEADY + """
print("%.1f,%.3f,%.2f" % steady_peak(*map(int, sys.argv[1:4])))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, default=6)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--image-size", type=int, default=28)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    shape = [str(args.batch), str(args.image_size), str(args.threads)]
    def peaks(stdout: str) -> list[tuple[float, ...]]:
        """(steady peak RSS, allocated peak, the seconds allocated_peak_mb took) per process."""
        return [tuple(float(v) for v in line.split(",")) for line in stdout.split()]

    fresh = [peaks(subprocess.run([sys.executable, "-c", FRESH, *shape], check=True, capture_output=True,
                                  text=True).stdout)[0] for _ in range(args.processes)]
    forked = peaks(subprocess.run([sys.executable, "-c", FORKED, *shape, str(args.processes)], check=True,
                                  capture_output=True, text=True).stdout)
    print(f"seed-cnn, batch {args.batch}, {args.image_size}x{args.image_size}, {args.threads} threads, "
          f"{os.cpu_count()} cores; {args.processes} identical processes each way: the steady peak RSS of 4 steps, "
          "then the allocated peak of a step (cnncompare.core.cell.memory.allocated_peak_mb)\n")
    print("| processes | measure | each process (MB) | median | range, % of the median |")
    print("| --- | --- | --- | --- | --- |")
    for name, runs in (("each started afresh", fresh), ("forked from one parent", forked)):
        for i, (measure, digits) in enumerate((("steady peak RSS", 0), ("allocated peak", 3))):
            values = [run[i] for run in runs]
            mid = statistics.median(values)
            print(f"| {name} | {measure} | {', '.join(f'{v:.{digits}f}' for v in values)} | {mid:.{digits}f} | "
                  f"{100 * (max(values) - min(values)) / mid:.2g} % |")
    took = statistics.median(run[2] for run in fresh + forked)
    print(f"\nallocated_peak_mb's two extra steps took {took:.2f} s (median over the processes).")

if __name__ == "__main__":
    main()
