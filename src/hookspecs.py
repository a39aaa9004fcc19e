"""The plugin contract: every hook cnncompare calls, in one module.

A plugin is a module (or any object) with functions marked
``@cnncompare.hookimpl`` whose names match the specs below. Third-party
plugins are found through the ``cnncompare`` entry-point group::

    [project.entry-points.cnncompare]
    my_backend = "my_module"

Built-in backends and workloads register through the very same hooks.
"""
import pluggy

from . import PROJECT_NAME

hookspec = pluggy.HookspecMarker(PROJECT_NAME)


@hookspec
def cnncompare_register_backends(register):
    """Register the backends this plugin provides.

    Called once per process, when cnncompare loads its plugins (in the main
    process and again in each measurement child), for every plugin that
    implements it; the call order between plugins is unspecified.

    :param register: a callable taking one backend object. Call it once per
        backend. A backend needs ``name`` (a unique string, used by
        ``--backends`` and shown in reports) and
        ``compile(model, example, device)`` (returns a callable that trains
        ``model``'s parameters; ``example`` is an input batch on ``device``).
        Optional members, with their defaults, are documented on
        ``cnncompare.Backend``. Registering a name that is already taken is
        a startup error naming both plugins.
    :returns: nothing; the return value is ignored.
    """


@hookspec
def cnncompare_register_workloads(register):
    """Register the workloads this plugin provides (what backends train).

    Called once per process, when cnncompare loads its plugins (in the main
    process, and in a measurement child that has to look a workload up by
    name), for every plugin that implements it; the call order between
    plugins is unspecified.

    :param register: a callable taking one workload object. Call it once per
        workload. A workload needs ``name`` (unique, used by ``--workload``),
        ``sample_unit`` (what one sample is, for throughput),
        ``options`` (every option with its default),
        ``build_model(options)``, ``make_batch(options, n, generator, device)``
        and ``loss(output, targets)``; ``description`` and ``check_options``
        are optional. The contract is documented on ``cnncompare.Workload``.
        Registering a name that is already taken is a startup error naming
        both plugins.
    :returns: nothing; the return value is ignored.
    """
