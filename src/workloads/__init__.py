"""Built-in workloads: what a backend trains.

Each module here is a pluggy plugin registering workloads through
``cnncompare_register_workloads``, exactly as a third-party plugin would;
they are listed in ``cnncompare.plugins.BUILTIN_PLUGINS``. A new built-in
workload goes in a module here. The contract is ``workloads/base.py``.
"""
