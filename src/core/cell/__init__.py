"""Inside a cell's child process: everything here runs after the fork, never in the parent.

- ``main``        the entry point: a ``CellOrder`` in, a ``CellRecord`` out
- ``measure``     the phases of one cell: compile, first step, warm-up, steps, parity
- ``training``    the step protocol over the workload: seeded model and batch, its recipe, the step
- ``timing``      synchronised timing, CUDA events
- ``memory``      peak RSS per phase, per-step OS costs, the ``--malloc`` policy
- ``diagnostics`` what dynamo did: graphs, breaks, recompiles, CUDA graphs
- ``parity``      the training trajectory (losses, gradients, weights, buffers) against float64 eager
- ``roofline``    FLOPs of a step and a matmul peak to hold them against
- ``rank``        a DDP rank's side of a ``--nproc`` cell

Nothing here imports the parent's side (``core/run``).
"""
