"""The harness, one concern per module.

- ``config``      what is run: the validated ``RunConfig`` dataclass
- ``workload``    the CNN, the seeded batch and the train-step protocol
- ``devices``     which devices exist and what ``--devices`` means
- ``measure``     one cell (backend x device) in its child: timing, memory, parity
- ``child``       the child process's entry point around ``measure``
- ``orchestrate`` runs every cell in its own child, with timeouts, streaming results
- ``results``     result dataclasses, statuses, statistics, derived figures, JSON
- ``environment`` the machine and library versions recorded with every run
- ``report``      markdown and JSON rendering

A new metric goes into ``measure`` (collected) and ``results`` (stored), then
``report`` (shown). A new backend goes into ``cnncompare/backends``.
"""
