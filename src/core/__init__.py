"""The harness, one concern per module.

What is run
- ``config``      the validated ``RunConfig`` dataclass
- ``workload``    the CNN, the seeded batch and the train-step protocol
- ``devices``     which devices exist and what ``--devices`` means

Measurement (inside each cell's child process)
- ``child``       the child's entry point: payload in, JSON result out
- ``forkserver``  forks each cell's child from a process that has imported torch and dynamo
- ``measure``     one cell: timing, memory phases, parity against float64 eager
- ``memory``      peak RSS per phase, per-step OS costs, the `--malloc` policy
- ``diagnostics`` what dynamo did: graphs, breaks, recompiles
- ``roofline``    FLOPs of a step and a matmul peak to hold them against

Orchestration
- ``orchestrate`` every cell in its own child: timeouts, memory watchdog, warm/cold cache
- ``distributed`` ``--nproc``: a cell as a torchrun job under DDP (the ranks' side)
- ``progress``    what the user sees while cells run

Results and reports
- ``results``     result dataclasses, statistics, derived figures, JSON round trip
- ``environment`` the machine and library versions recorded with every run
- ``report``      markdown, JSON, CSV, merged reports
- ``charts``      PNG charts (optional matplotlib)
- ``compare``     two runs cell by cell, with a rank test
- ``fileio``      atomic writes

A new metric is collected in ``measure`` (or a module it calls), stored in
``results`` and shown in ``report``. A new backend goes in ``cnncompare/backends``.
"""
