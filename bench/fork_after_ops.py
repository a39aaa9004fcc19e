"""Can a cell be forked from a warm template? A child forked after torch ran a multi-threaded op.

    python bench/fork_after_ops.py            # writes bench/results/fork-after-ops.txt

Later rounds could skip a process start, the model's build and its compile by forking each
round's cell from a template process kept warm (model built, compiled, warmed up). That template
would have run tensor ops with torch's intra-op thread pool. This forks a child from a process
that ran one matrix product with ``--threads`` threads and has the child run one more, with as many
threads and with one; each child gets ``--timeout`` seconds. cnncompare's fork server imports torch
and runs no op, so its children start with no thread pool to inherit.
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path

OUT = Path(__file__).parent / "results" / "fork-after-ops.txt"


def child_op(threads: int, timeout_s: float) -> str:
    """Fork, run one matrix product with ``threads`` threads in the child: its seconds, or 'hung'."""
    import torch

    a = torch.randn(512, 512)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        torch.set_num_threads(threads)
        start = time.perf_counter()
        (a @ a).sum().item()
        os.write(write, f"{time.perf_counter() - start:.4f} s".encode())
        os._exit(0)
    os.close(write)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.read(read, 100).decode() or "ended without an answer"
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return f"hung (killed after {timeout_s:g} s)"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--timeout", type=float, default=20.0)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    lines = [f"torch {torch.__version__}, {args.threads} threads; {torch.__config__.parallel_info().splitlines()[3].strip()}"]
    lines.append(f"child forked before any op, {args.threads} threads: {child_op(args.threads, args.timeout)}")
    x = torch.randn(512, 512)
    (x @ x).sum().item()  # the parent now has run a multi-threaded op, as a warm template would have
    for threads in (args.threads, 1):
        lines.append(f"child forked after a {args.threads}-thread op, {threads} thread(s): {child_op(threads, args.timeout)}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
