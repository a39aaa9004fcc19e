"""A user's own training loop of seed-cnn, served step by step: what the cell must match.

    python bench/plain_loop.py SOCKET BATCH IMAGE_SIZE THREADS SEED [preload]

``preload``: import what cnncompare's fork server imports before any cell (torch._dynamo,
inductor's compiler) first, as a script that uses ``torch.compile`` somewhere would.

Nothing of cnncompare's step, data or timing: the model (seed-cnn's definition), Adam,
``zero_grad``, forward, NLL loss, backward, ``step``, and a new batch every step, made
before the clock starts, as a data loader hands one over. Each step is timed with
``perf_counter``. It answers the same line protocol as a serving cell (``{"ready": pid}``, then
``{"steps": n}`` -> ``{"samples": [...]}`` until ``{"stop": true}``), so that
``harness_overhead.py`` can interleave it with one.
"""
from __future__ import annotations

import importlib
import json
import os
import socket
import sys
import time

import torch
import torch.nn.functional as F

from cnncompare.workloads.seed_cnn import SeedCNN


def main(path: str, batch: int, image_size: int, threads: int, seed: int, preload: bool = False) -> None:
    if preload:
        for name in ("torch._dynamo", "torch._inductor.compile_fx"):
            importlib.import_module(name)
    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = SeedCNN(image_size)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step() -> float:
        x = torch.randn(batch, 3, image_size, image_size)
        y = torch.randint(0, 10, (batch,))
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = F.nll_loss(model(x), y)  # the model ends in LogSoftmax
        loss.backward()
        optimizer.step()
        return time.perf_counter() - start

    for _ in range(3):  # warm-up, as the cell's
        step()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        stream = sock.makefile("rwb", buffering=0)
        stream.write((json.dumps({"ready": os.getpid()}) + "\n").encode())
        for line in stream:
            command = json.loads(line)
            if "steps" not in command:
                break
            samples = [step() for _ in range(int(command["steps"]))]
            stream.write((json.dumps({"samples": samples}) + "\n").encode())


if __name__ == "__main__":
    main(sys.argv[1], *(int(a) for a in sys.argv[2:6]), preload=sys.argv[6:7] == ["preload"])
