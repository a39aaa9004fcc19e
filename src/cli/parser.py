"""The command line's grammar: one ``argparse`` parser with a subparser per command.

``run`` takes the run's options from ``RunConfig``'s fields (flag, help, default, choices), so a
new option is declared once, in ``core/config.py``. A bare ``cnncompare [options]`` means
``run`` (``normalize``). Errors take argparse's conventional form: the command's usage line,
then ``PROG: error: MESSAGE`` naming the flag once, exit 2 (``UsageError``).
"""
from __future__ import annotations

import argparse
import difflib
import math
import typing
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import __version__
from ..core.config import DEFAULT_WORKLOAD, LOOP_KEYS, RunConfig, flagged_fields
from ..core.records import Status

#: Exit codes, the command line's contract with scripts and CI jobs (``cnncompare docs cli``).
EXIT_OK, EXIT_FOUND, EXIT_USAGE, EXIT_HARNESS = 0, 1, 2, 3
#: Interrupted: 128 + the signal (SIGINT 130, SIGTERM 143); finished cells are kept.
EXIT_SIGNAL_BASE = 128

COMMANDS = ("run", "list", "compare", "report", "docs")
#: Workload options with a flag of their own (seed-cnn's); others come with the workload.
WORKLOAD_OPTION_FLAGS = {"image_size": "--image-size"}
#: ``--fail-on failed``: every status that means the backend did not deliver a correct step.
FAILED = tuple(s.value for s in Status if s not in (Status.OK, Status.SKIPPED))


class UsageError(Exception):
    """Bad usage, found by argparse or after it (a backend that doesn't exist, an unwritable
    path): the command's usage line and one message, exit 2, before any work."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:
        raise UsageError(message)


def did_you_mean(word: str, names: Sequence[str]) -> str:
    """' (did you mean a or b?)' naming the registered names closest to ``word``, or ''."""
    close = difflib.get_close_matches(word, list(names), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(close)}?)" if close else ""


#: Flags whose values are lists: given twice, they combine (``--devices cpu --devices mps`` is
#: ``cpu,mps``). Every other flag that takes a value may be given once: a second is refused,
#: never a silent last-wins.
COMBINED = ("backends", "devices", "fail_on")


class _Once(argparse._StoreAction):
    """A flag that takes one value: given twice, a usage error naming it."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", set())
        if self.dest in given:
            raise argparse.ArgumentError(self, "given twice; give it once")
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


class _Combine(argparse._StoreAction):
    """A list flag: each time it is given its items join the earlier ones' (the default is
    replaced by the first)."""

    def __call__(self, parser, namespace, values, option_string=None):
        given = namespace.__dict__.setdefault("_given", set())
        if self.dest in given:
            earlier = getattr(namespace, self.dest)
            values = earlier | values if isinstance(earlier, frozenset) else f"{earlier},{values}"
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


def _guard_repeats(parser: argparse.ArgumentParser) -> None:
    """Every value-taking flag of ``parser`` either combines (``COMBINED``) or is refused when
    repeated. Done here, after the flags are declared, so no flag can be added without it."""
    for action in parser._actions:
        if type(action) is argparse._StoreAction and action.option_strings:
            action.__class__ = _Combine if action.dest in COMBINED else _Once


def _choice(choices: Sequence[str]) -> Callable[[str], str]:
    """One of ``choices``, or an error that suggests the closest."""

    def parse(text: str) -> str:
        if text not in choices:
            raise argparse.ArgumentTypeError(f"invalid choice: {text!r}{did_you_mean(text, choices)}; choose from "
                                             f"{', '.join(choices)}")
        return text

    return parse


def _number(kind: type) -> Callable[[str], Any]:
    """Text to ``kind`` (int or float); bounds are the config's to check. argparse names the flag."""
    noun = "a whole number" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None

    return parse


def _bounded_float(valid: Callable[[float], bool], requirement: str) -> Callable[[str], float]:
    """A finite float for the options outside a run's config (compare's gates)."""
    to_float = _number(float)

    def parse(text: str) -> float:
        value = to_float(text)
        if not (math.isfinite(value) and valid(value)):
            raise argparse.ArgumentTypeError(f"must be {requirement}, got {text}")
        return value

    return parse


def _batch_sizes(text: str) -> tuple[int, ...]:
    """``--batch-size``: one whole number, or a comma list of distinct ones (a sweep), in order."""
    parse = _number(int)
    sizes = tuple(parse(part.strip()) for part in text.split(","))
    if len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"{text!r} names a size twice")
    return sizes


def _statuses(text: str) -> frozenset[str]:
    """``--fail-on``: a comma list of cell statuses, ``failed`` standing for every failure."""
    known = [s.value for s in Status]
    chosen: set[str] = set()
    for item in (part.strip() for part in text.split(",")):
        if item == "failed":
            chosen.update(FAILED)
        elif item in known:
            chosen.add(item)
        else:
            raise argparse.ArgumentTypeError(f"unknown status {item!r}; known: failed, {', '.join(known)}")
    return frozenset(chosen)


def _field_type(annotation: Any) -> type:
    """int, float or str from a config field's type (``Optional[int]`` is int)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def _add_run_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--backends", default="all", metavar="NAMES",
                   help="'all' (the curated set), or a comma list of names and patterns, e.g. all,dynamo:* (default: all)")
    p.add_argument("--devices", default="all",
                   help="'all' (cpu + every CUDA GPU + mps), or a comma list of cpu, cuda, cuda:N, mps (default: all)")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, metavar="NAME",
                   help="what every backend runs: a workload 'cnncompare list workloads' shows, torchvision:<model>, "
                   "timm:<model>, or your own FILE.py:FUNCTION or MODULE:FUNCTION ('cnncompare docs workloads') "
                   f"(default: {DEFAULT_WORKLOAD})")
    p.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a workload option (repeat for several); 'cnncompare list workloads' shows each workload's "
                   "options and defaults")
    p.add_argument("--loop", action="append", default=[], metavar="KEY=VALUE",
                   help="the training loop each row's loop figures project (repeat for several keys): "
                   + "; ".join(f"{k}: {v}" for k, v in LOOP_KEYS.items())
                   + " (default: the workload's, else 1 epoch of 1000 full steps, no evaluation)")
    p.add_argument("--backend-option", action="append", default=[], metavar="NAME:KEY=VALUE",
                   help="an option for one selected backend's configure() (repeat for several), e.g. "
                   "dynamo:openvino:aot_autograd=true (torch.compile's options); VALUE is read as JSON where it is "
                   "JSON (true, 3, \"x\"), else as text")
    p.add_argument("--image-size", type=_number(int), default=None, metavar="N",
                   help="square image side in pixels, for a workload with an image_size option (default: the "
                   "workload's, 28 for seed-cnn)")
    hints = typing.get_type_hints(RunConfig)
    groups: dict[str, Any] = {}
    for f in flagged_fields():
        meta = f.metadata
        target = p if meta["group"] is None else groups.setdefault(meta["group"], p.add_argument_group(meta["group"]))
        shown = meta["shown_default"] or f.default
        kwargs: dict[str, Any] = dict(dest=f.name, default=f.default,
                                      metavar=meta["metavar"] or meta["flag"][2:].upper().replace("-", "_"),
                                      help=f"{meta['help']} (default: {shown})")
        if meta["choices"]:
            kwargs.update(type=_choice(meta["choices"]), metavar="{" + ",".join(meta["choices"]) + "}")
        elif f.name == "batch_size":
            kwargs.update(type=_batch_sizes, metavar="N[,N...]",
                          help=f"{meta['help']}; several sizes (16,32,64) make a sweep: the matrix runs at each, each "
                          f"size's report beside a summary of throughput against batch size (default: {shown})")
        elif (kind := _field_type(hints[f.name])) in (int, float):
            kwargs["type"] = _number(kind)
        target.add_argument(meta["flag"], **kwargs)
    p.add_argument("--no-control", action="store_true",
                   help="leave out eager-control, eager measured again like any backend, whose speedup over eager "
                   "is the run's noise floor; the verdict picks no backend that doesn't clear it (default: added "
                   "beside eager)")
    p.add_argument("--no-cache", action="store_true",
                   help="compute the parity reference afresh instead of reusing the one an earlier run cached for the "
                   "same workload, config, code, torch and device (default: reuse; the report says which; the cache "
                   "is $CNNCOMPARE_CACHE_DIR, else $XDG_CACHE_HOME/cnncompare or ~/.cache/cnncompare)")
    out = p.add_argument_group("output")
    out.add_argument("--output", type=Path, default=None, metavar="PATH.md",
                     help="markdown report path (default: cnncompare-runs/cnncompare-<timestamp>.md)")
    out.add_argument("--json", type=Path, default=None, metavar="PATH.json",
                     help="JSON report path (default: beside the markdown, .json)")
    out.add_argument("--csv", type=Path, default=None, metavar="PATH.csv",
                     help="also write one CSV row per result (JSON key names as headers)")
    out.add_argument("--print-report", action="store_true",
                     help="print the whole markdown report on stdout (default: the summary and where the report is)")
    out.add_argument("--resume", type=Path, default=None, metavar="PATH.json",
                     help="continue an interrupted run: keep its finished cells, run the rest (same options required)")
    out.add_argument("--fail-on", type=_statuses, default=frozenset(), metavar="STATUS[,STATUS...]",
                     help="exit 1 when any cell ends in one of these statuses (a CI gate); 'failed' is every "
                     f"failure ({', '.join(FAILED)}) (default: none)")
    out.add_argument("--dry-run", action="store_true",
                     help="print the plan (cells, rounds, an estimate of the time from earlier runs in the output "
                     "folder) and exit without running anything")
    # Earlier spellings, kept working for scripts; 'cnncompare list' replaced it.
    p.add_argument("--list", action="store_true", help=argparse.SUPPRESS)


def build_parser() -> argparse.ArgumentParser:
    """The whole command line (``cnncompare --help`` lists the commands)."""
    p = _Parser(prog="cnncompare", usage="cnncompare [run] [options] | cnncompare COMMAND ...",
                description="Which PyTorch compilation backend makes this training (or inference) step fastest "
                "on this machine, at what compile cost and memory, and does it still compute the same thing? "
                "Each backend runs in its own process; the report is markdown, JSON, CSV and charts.",
                epilog="A bare 'cnncompare [options]' is 'cnncompare run [options]'. Exit codes: 0 done (failed "
                "cells are results), 1 a --fail-on status or a compare regression found, 2 bad usage, 3 the "
                "harness failed, 130/143 interrupted (finished cells kept). 'cnncompare docs' lists the manual's "
                "topics.")
    p.add_argument("--version", action="version", version=f"cnncompare {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    run = sub.add_parser("run", prog="cnncompare", usage="cnncompare [run] [options]",
                         help="measure every backend on every device (the default command)",
                         description="Measure every selected backend on every device, each cell in its own process: "
                         "step time, compile cost, memory and parity against float64.")
    _add_run_options(run)
    _guard_repeats(run)

    ls = sub.add_parser("list", prog="cnncompare list", help="list backends, workloads and plugins",
                        description="List what is installed: backends (with availability per device), workloads "
                        "(with their options) and plugins (with broken ones and why).")
    ls.add_argument("what", nargs="?", metavar="WHAT", choices=("backends", "workloads", "plugins"), default=None,
                    help="backends, workloads or plugins (default: backends and workloads)")
    ls.add_argument("--devices", default="all", help="devices to show availability for (default: all)")
    ls.add_argument("--json", action="store_true", help="print JSON instead of tables")
    _guard_repeats(ls)

    cmp = sub.add_parser("compare", prog="cnncompare compare", help="compare two runs' JSON reports (a CI gate)",
                         description="Compare two runs row by row: each row's speedup over eager as its run's verdict "
                         "measured it (paired inside each run), the change with its 95 %% interval from both runs' "
                         "intervals; --absolute compares step times instead (unpaired: Welch's t-test on the rounds' "
                         "log medians).")
    cmp.add_argument("base", type=Path, metavar="BASE.json", help="the earlier run's JSON report")
    cmp.add_argument("new", type=Path, metavar="NEW.json", help="the later run's JSON report")
    cmp.add_argument("--fail-above", type=_bounded_float(lambda v: v >= 0, "a percentage >= 0"), default=None,
                     metavar="PCT", help="exit 1 when a row ok in both runs got slower by more than PCT percent and "
                     "the change is beyond noise (its 95 %% interval excludes no change; --absolute: p < --alpha)")
    from ..core.stats import DEFAULT_ALPHA

    cmp.add_argument("--absolute", action="store_true",
                     help="compare step times (eager's too: across machines or torch releases), unpaired, instead of "
                     "each row's speedup over eager")
    cmp.add_argument("--alpha", type=_bounded_float(lambda v: 0 < v < 1, "between 0 and 1"), default=DEFAULT_ALPHA,
                     help=f"significance level of --absolute's test (default: {DEFAULT_ALPHA})")
    cmp.add_argument("--any-workload", action="store_true",
                     help="compare runs of different workloads (or of one workload with other options) cell by cell")
    _guard_repeats(cmp)

    rep = sub.add_parser("report", prog="cnncompare report", help="render a report from runs' JSON reports",
                         description="Render one markdown report from several runs' JSON reports "
                         "(from one, that run's own report, as the run wrote it, with its charts).")
    rep.add_argument("runs", type=Path, nargs="+", metavar="RUN.json", help="JSON reports")
    rep.add_argument("--output", type=Path, default=None, metavar="PATH.md",
                     help="write the markdown here (default: print it)")
    _guard_repeats(rep)

    docs = sub.add_parser("docs", prog="cnncompare docs", help="read the manual: cnncompare docs TOPIC",
                          description="Print one topic of the manual (the docs/ folder this package was built "
                          "from); without a topic, list them.")
    docs.add_argument("topic", nargs="?", default=None, metavar="TOPIC", help="a topic 'cnncompare docs' lists")
    return p


def normalize(argv: Sequence[str]) -> list[str]:
    """A bare ``cnncompare [options]`` is ``run``; ``cnncompare plugins [--json]`` (an earlier
    spelling) is ``list plugins``."""
    argv = list(argv)
    if argv and argv[0] == "plugins":
        return ["list", "plugins", *argv[1:]]
    if not argv or (argv[0] not in COMMANDS and argv[0] not in ("-h", "--help", "--version")):
        return ["run", *argv]
    return argv


def subparser(parser: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    """The parser of ``command`` (for its usage line in an error)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices[command]
    raise KeyError(command)


def options_of(parser: argparse.ArgumentParser) -> dict[str, list[argparse.Action]]:
    """Each command's visible actions, for the documentation tests: ``{'run': [...], ...}``."""
    out: dict[str, list[argparse.Action]] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out[name] = [a for a in sub._actions if a.help != argparse.SUPPRESS and not isinstance(a, argparse._HelpAction)]
    return out

