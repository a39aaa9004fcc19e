"""The harness. Folders say which side of the process boundary code runs on.

- ``run/``      the parent: plans the cells, starts and supervises each cell's child
- ``cell/``     inside a cell's child: measures one backend on one device
- ``report/``   the parent again: markdown, JSON/CSV, charts, comparisons

Shared by both sides, importing nothing from either:

- ``config``    ``RunConfig``: every option's default, flag and bounds, validated once
- ``records``   the typed records that cross the boundary (``CellOrder`` in, ``CellRecord`` out)
- ``codec``     their strict JSON reading
- ``stats``     every statistic and derived figure, thresholds named once
- ``results``   the report's rows and ``RunReport``; what makes two runs comparable
- ``fileio``    atomic writes
- ``processes`` a child never outlives its parent

Where things go: a new metric is measured in ``cell/`` (``measure`` or a
module it calls), carried in ``records.Measured``, derived (if at all) in
``stats`` and shown in ``report/``. A new backend goes in ``cnncompare/backends``
or a plugin; a new workload in ``cnncompare/workloads`` or a plugin.
"""
