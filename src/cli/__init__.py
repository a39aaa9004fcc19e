"""The ``cnncompare`` command line: ``parser`` is its grammar, one module per command does the
work (``run``, ``listing``, ``compare``, ``render``, ``docs``); ``select`` turns the run's
options into backends, a workload and checked paths.

Exit codes (``cnncompare docs cli``): 0 done, failed cells included (they are results); 1 a
``--fail-on`` status or a ``compare`` regression found; 2 bad usage, nothing run; 3 the
harness failed; 130 / 143 interrupted by SIGINT / SIGTERM (finished cells kept and written).
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from .parser import COMMANDS, EXIT_USAGE, UsageError, build_parser, normalize, subparser

__all__ = ["main", "build_parser"]


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args_list = normalize(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(args_list)
        return _dispatch(args)
    except UsageError as exc:
        command = args_list[0] if args_list and args_list[0] in COMMANDS else None
        failed = subparser(parser, command) if command else parser
        print(f"{failed.format_usage().rstrip()}\n{failed.prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _dispatch(args) -> int:
    if args.command == "run":
        from .run import run_command

        return run_command(args)
    if args.command == "list":
        from .listing import list_command

        return list_command(args)
    if args.command == "compare":
        from .compare import compare_command

        return compare_command(args)
    if args.command == "report":
        from .render import report_command

        return report_command(args)
    from .docs import docs_command

    return docs_command(args)
