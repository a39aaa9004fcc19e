"""The parent's side: what runs, where, and how each cell's child is started and watched.

- ``orchestrate`` every cell into the ``RunReport``: plan, skip, cold/warm, DDP's single process
- ``launch``      start one child (forked or torchrun), supervise it, read its ``CellRecord``
- ``forkserver``  forks each cell's child from a process that imported torch once (both ends)
- ``torchrun``    the torchrun command for a ``--nproc`` cell, and where DDP can't run
- ``devices``     what ``--devices`` means on this machine
- ``environment`` the machine and library versions recorded with every run
- ``progress``    what the user sees while cells run
"""
