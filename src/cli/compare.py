"""``cnncompare compare BASE.json NEW.json``: two runs row by row (each row's speedup over eager, or
with ``--absolute`` its step time), and a CI gate (``core/report/compare``)."""
from __future__ import annotations

import argparse

from .parser import EXIT_FOUND, EXIT_OK, UsageError
from .select import load_report


def compare_command(args: argparse.Namespace) -> int:
    """Exit 1 (``EXIT_FOUND``) when ``--fail-above`` finds a regression."""
    from ..core.report.compare import compare_runs, regressions, render_comparison

    base, new = load_report("BASE.json", args.base), load_report("NEW.json", args.new)
    if base.config.mode != new.config.mode:
        raise UsageError(f"the runs measured different modes ({base.config.mode} vs {new.config.mode}): a training "
                         f"step and a forward are different work")
    a, b = base.config.workload, new.config.workload
    if (a.name, dict(a.options)) != (b.name, dict(b.options)) and not args.any_workload:
        what = (f"{a.name} vs {b.name}" if a.name != b.name else
                f"{a.name} with other options ({_options_text(a.options)} vs {_options_text(b.options)})")
        raise UsageError(f"the runs trained different workloads ({what}); their step times measure different "
                         f"work (--any-workload compares them anyway)")
    cells = compare_runs(base, new, args.absolute)
    print(render_comparison(base, new, cells, args.alpha, args.fail_above, args.absolute), end="")
    if args.fail_above is not None and regressions(cells, args.fail_above, args.alpha):
        return EXIT_FOUND
    return EXIT_OK


def _options_text(options) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "none"
