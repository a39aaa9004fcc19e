"""Reports of a finished (or interrupted) run, in the parent: they format, ``stats`` computes.

- ``markdown``  the report people read, and the combined report of several runs
  (assembled from ``tables``, ``summary``'s sentences, ``legend`` and ``formatting``)
- ``data``      JSON and CSV
- ``charts``    PNG charts (optional matplotlib)
- ``compare``   two runs cell by cell, tested round by round
"""
