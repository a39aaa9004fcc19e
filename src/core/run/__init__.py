"""The parent's side: what runs, where, and how each cell's child is started and watched.

- ``orchestrate`` every cell into the ``RunReport``: plan, rounds of warm pairs, adaptive rounds
- ``cell``        one cell from the parent's side: its child(ren), its warm pair, skip, cold/warm,
                  DDP's single process, the device's parity reference
- ``pairs``       warm interleaved pairs: the socket a serving cell connects to, ``interleave``
- ``launch``      start one child (forked or torchrun), supervise it, read its ``CellRecord``
- ``forkserver``  forks each cell's child from a process that imported torch once (both ends)
- ``torchrun``    the torchrun command for a ``--nproc`` cell, and where DDP can't run
- ``devices``     what ``--devices`` means on this machine
- ``environment`` the machine and library versions recorded with every run
- ``progress``    what the user sees while cells run
"""
