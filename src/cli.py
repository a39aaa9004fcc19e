"""The ``cnncompare`` command line.

Exit codes: 0 every requested cell has a row (failed cells are results);
1 the harness itself failed; 2 usage error (nothing was run); 130 / 143
interrupted by SIGINT / SIGTERM (finished cells are kept and written).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Optional, Sequence

import cnncompare
from cnncompare.core.config import MALLOC_POLICIES

EXIT_OK, EXIT_HARNESS, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """One line for the user; exit 2 before any work."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one clear line, no usage dump
        raise UsageError(message)


def _int_arg(option: str, minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option}: expected a whole number, got {text!r}") from None
        if value < minimum:
            what = "positive" if minimum == 1 else f"at least {minimum}"
            raise argparse.ArgumentTypeError(f"{option}: must be {what}, got {value}")
        return value

    return parse


def _float_arg(option: str, noun: str, valid, requirement: str):
    """A finite float for ``option``; ``valid(value)`` else 'must be <requirement>'."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option}: expected {noun}, got {text!r}") from None
        if not (math.isfinite(value) and valid(value)):
            raise argparse.ArgumentTypeError(f"{option}: must be {requirement}, got {text}")
        return value

    return parse


_seconds_arg = _float_arg("--timeout", "a number of seconds", lambda v: v > 0, "a positive number of seconds")
_percent_arg = _float_arg("--fail-above", "a percentage", lambda v: v >= 0, "a percentage >= 0")
_alpha_arg = _float_arg("--alpha", "a number", lambda v: 0 < v < 1, "between 0 and 1")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="cnncompare",
        description="Compare PyTorch compilation backends on one CNN training step: "
        "time, compile cost, memory and correctness, each cell in its own process.",
        epilog="Other commands: 'cnncompare plugins' lists loaded plugins; 'cnncompare compare BASE.json NEW.json' "
        "compares two runs; 'cnncompare report A.json B.json ...' merges runs into one report. "
        "Exit codes: 0 every requested cell has a row (failed cells are results), "
        "1 the harness failed, 2 usage error, 130/143 interrupted (finished cells kept).",
    )
    p.add_argument("--backends", default="all",
                   help="'all' (the curated set), or a comma list of names and patterns, e.g. all,dynamo:* (default: all)")
    p.add_argument("--devices", default="all", help="'all' (cpu + every CUDA GPU + mps), or a comma list of cpu, cuda, cuda:N, mps (default: all)")
    p.add_argument("--batch-size", type=_int_arg("--batch-size", 1), default=128, help="images per step (default: 128)")
    p.add_argument("--image-size", type=_int_arg("--image-size", 1), default=28, help="square image side in pixels (default: 28)")
    p.add_argument("--steps", type=_int_arg("--steps", 1), default=20, help="measured steps per cell (default: 20)")
    p.add_argument("--warmup", type=_int_arg("--warmup", 0), default=3, help="warm-up steps; a backend may ask for more (default: 3)")
    p.add_argument("--seed", type=_int_arg("--seed", 0), default=0, help="seed for weights and data (default: 0)")
    p.add_argument("--threads", type=_int_arg("--threads", 1), default=None, help="torch CPU threads (default: every available core)")
    p.add_argument("--timeout", type=_seconds_arg, default=600.0, help="seconds per cell before its processes are killed (default: 600)")
    p.add_argument("--max-memory", type=_int_arg("--max-memory", 64), default=None, metavar="MB",
                   help="kill a cell whose processes exceed this RSS, reported as oom (default: no cap)")
    p.add_argument("--compile-cache", choices=("cold", "warm"), default="cold",
                   help="cold: every cell compiles from an empty cache; warm: each cell runs twice sharing its cache, "
                   "reporting the warm run with the cold compile times beside it (default: cold)")
    p.add_argument("--compile-threads", type=_int_arg("--compile-threads", 1), default=1,
                   help="inductor compile workers (TORCHINDUCTOR_COMPILE_THREADS); 1 compiles in-process so its "
                   "memory counts in the cell (default: 1)")
    p.add_argument("--malloc", choices=MALLOC_POLICIES, default="system",
                   help="system: the C library's allocator as your own script gets it; reuse (glibc): freed CPU "
                   "memory is kept for the next step instead of returned to the kernel, so large tensors stop "
                   "paying page faults every step (default: system)")
    dist = p.add_argument_group("distributed (each cell a torchrun job under DistributedDataParallel)")
    dist.add_argument("--nproc", type=_int_arg("--nproc", 1), default=None, metavar="N",
                      help="ranks per node: gloo on the CPU, nccl on CUDA (one GPU per rank); batch size is per "
                      "rank (weak scaling); CPU threads per rank = cores / N unless --threads (default: one process, no DDP)")
    dist.add_argument("--nnodes", type=_int_arg("--nnodes", 1), default=1, help="nodes in the job; run the same command "
                      "on each with its --node-rank (default: 1)")
    dist.add_argument("--node-rank", type=_int_arg("--node-rank", 0), default=0, help="this node's rank (default: 0)")
    dist.add_argument("--rdzv-endpoint", default=None, metavar="HOST:PORT",
                      help="torchrun's c10d rendezvous, the same on every node (default: --standalone on one node)")
    p.add_argument("--output", type=Path, default=None, help="markdown report path (default: reports/cnncompare-<timestamp>.md)")
    p.add_argument("--json", type=Path, default=None, help="JSON report path (default: beside the markdown, .json)")
    p.add_argument("--csv", type=Path, default=None, help="also write one CSV row per result (JSON key names as headers)")
    p.add_argument("--resume", type=Path, default=None, metavar="PATH.json",
                   help="continue an interrupted run: keep its finished cells, run the rest (same options required)")
    p.add_argument("--list", action="store_true", help="list backends, their plugins and availability per device, then exit")
    p.add_argument("--version", action="version", version=f"cnncompare {cnncompare.__version__}")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    except UsageError as exc:
        print(f"cnncompare: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _main(argv: list[str]) -> int:
    commands = {"plugins": plugins_command, "compare": compare_command, "report": report_command}
    if argv and argv[0] in commands:
        return commands[argv[0]](argv[1:])
    args = build_parser().parse_args(argv)

    from cnncompare.core import devices as devmod
    from cnncompare.plugins import PluginError, load_registry

    try:
        device_parts = devmod.parse_devices(args.devices)
    except devmod.DeviceError as exc:
        raise UsageError(f"--devices: {exc}") from None
    try:
        registry = load_registry()
    except PluginError as exc:
        raise UsageError(str(exc)) from None
    for warning in registry.warnings:
        print(f"cnncompare: warning: {warning}", file=sys.stderr)
    for plugin in registry.broken:
        print(f"cnncompare: warning: plugin {plugin.name!r} not loaded: {plugin.error}", file=sys.stderr)

    if args.list:
        print(render_backend_list(registry, devmod.resolve_devices(device_parts)))
        return EXIT_OK

    backends = _select_backends(args.backends, registry)
    from cnncompare.core.config import ConfigError, RunConfig

    try:
        config = RunConfig(
            backends=tuple(backends), devices=tuple(device_parts), batch_size=args.batch_size,
            image_size=args.image_size, steps=args.steps, warmup=args.warmup, seed=args.seed,
            threads=args.threads, timeout_s=args.timeout, max_memory_mb=args.max_memory,
            compile_cache=args.compile_cache, compile_threads=args.compile_threads, malloc=args.malloc, nproc=args.nproc,
            nnodes=args.nnodes, node_rank=args.node_rank, rdzv_endpoint=args.rdzv_endpoint,
        )
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    from cnncompare.core.memory import malloc_supported

    if why_not := malloc_supported(config.malloc):
        raise UsageError(f"--malloc {config.malloc}: {why_not}")
    resumed = _load_report("--resume", args.resume) if args.resume else None
    md_path, json_path = _output_paths(args)
    csv_path = _check_writable("--csv", args.csv) if args.csv is not None else None
    if csv_path is not None and csv_path.resolve() in (md_path.resolve(), json_path.resolve()):
        raise UsageError("--csv: must differ from the markdown and JSON paths")
    return run(config, registry, devmod.resolve_devices(device_parts), md_path, json_path, resumed, csv_path)


def _select_backends(spec: str, registry) -> list[str]:
    """``all`` is every backend whose ``in_all`` is true; other items are names or globs (``dynamo:*``)."""
    from fnmatch import fnmatchcase

    from cnncompare.backends import base

    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise UsageError("--backends: no backend given")
    chosen: list[str] = []
    for item in names:
        if item == "all":
            expanded = [n for n, b in registry.backends.items() if base.in_all(b)]
        else:
            expanded = [n for n in registry.backends if fnmatchcase(n, item)]
        if not expanded:
            raise UsageError(f"--backends: unknown backend {item!r}; {_known_backends(registry)}")
        chosen += [n for n in expanded if n not in chosen]
    return chosen


def _known_backends(registry) -> str:
    """'known: all, a, b; outside all: dynamo:* (13)' (every curated name, the rest by prefix)."""
    from collections import Counter

    from cnncompare.backends import base

    curated = [n for n, b in registry.backends.items() if base.in_all(b)]
    groups = Counter(n.split(":", 1)[0] + ":*" if ":" in n else n
                     for n, b in registry.backends.items() if not base.in_all(b))
    text = "known: " + ", ".join(["all", *curated])
    if groups:
        text += "; outside all: " + ", ".join(f"{g} ({c})" if c > 1 else g for g, c in groups.items())
        text += " (cnncompare --list shows every name)"
    return text


def _check_writable(option: str, path: Path) -> Path:
    path = path.expanduser()
    if path.is_dir():
        raise UsageError(f"{option}: {str(path)!r} is a directory, expected a file path")
    parent = path.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UsageError(f"{option}: can't write {str(path)!r}: {str(existing)!r} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UsageError(f"{option}: can't write {str(path)!r}: permission denied")
    return path


def _output_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.output is not None:
        md_path = _check_writable("--output", args.output)
    elif args.resume is not None:
        md_path = args.resume.with_suffix(".md")
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        md_path = Path("reports") / f"cnncompare-{stamp}.md"
    md_path = _check_writable("--output", md_path)
    json_default = args.resume if args.resume is not None else md_path.with_suffix(".json")
    json_path = _check_writable("--json", args.json if args.json is not None else json_default)
    if json_path.resolve() == md_path.resolve():
        raise UsageError("--json: must differ from the markdown --output path")
    return md_path, json_path


def _check_resumable(resumed, config, environment: dict) -> None:
    from cnncompare.core.config import RunConfig
    from cnncompare.core.environment import COMPARABLE_KEYS

    old = RunConfig.from_dict(resumed.config).workload_key()
    new = config.workload_key()
    changed = [f"{k} {old.get(k)!r} -> {new.get(k)!r}" for k in new if old.get(k) != new.get(k)]
    changed += [
        f"environment {k} {resumed.environment.get(k)!r} -> {environment.get(k)!r}"
        for k in COMPARABLE_KEYS if resumed.environment.get(k) != environment.get(k)
    ]
    if changed:
        raise UsageError("--resume: refused, the run differs from the one being resumed: " + "; ".join(changed))


def run(config, registry, slots, md_path: Path, json_path: Path, resumed=None, csv_path: Optional[Path] = None) -> int:
    from cnncompare.core import environment as envmod
    from cnncompare.core.charts import write_charts
    from cnncompare.core.fileio import write_atomic
    from cnncompare.core.orchestrate import Interrupted, plan_cells, run_cells
    from cnncompare.core.progress import for_stream
    from cnncompare.core.report import render_csv, render_json, render_markdown
    from cnncompare.core.results import RunReport

    environment = envmod.capture(config.resolved_threads)
    if resumed is not None:
        _check_resumable(resumed, config, environment)
        report = resumed
        report.interrupted = False
        report.config = config.to_dict()
        report.notes.append(f"resumed at {environment['date']} with {len(report.results)} finished cells kept")
    else:
        report = RunReport(environment=environment, config=config.to_dict(), started_at=environment["date"])
    report.plugins = [vars(p).copy() for p in registry.plugins]
    report.notes.extend(w for w in registry.warnings if w not in report.notes)

    for path in (md_path, json_path, csv_path):
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)

    def write(rep: RunReport, markdown: Optional[str] = None) -> None:
        write_atomic(json_path, render_json(rep))
        write_atomic(md_path, markdown or render_markdown(rep))
        if csv_path is not None:
            write_atomic(csv_path, render_csv(rep))

    def on_signal(signum, frame):
        raise Interrupted(signum)

    progress = for_stream(sys.stderr)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    exit_code = EXIT_OK
    try:
        run_cells(plan_cells(config, slots), config, registry, report, write, progress)
    except Interrupted as exc:
        report.interrupted = True
        exit_code = exc.exit_code
        progress.message(f"cnncompare: interrupted ({exc}); {len(report.results)} finished cells kept. "
                         f"Continue with --resume {json_path}")
    except Exception:
        report.interrupted = True
        report.notes.append("the harness failed: " + traceback.format_exc().strip().splitlines()[-1])
        traceback.print_exc()
        exit_code = EXIT_HARNESS
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report.finished_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    try:
        charts = write_charts(report, md_path)
    except Exception as exc:  # a chart is not worth losing the report for
        charts = []
        report.notes.append(f"charts could not be drawn: {type(exc).__name__}: {exc}")
    markdown = render_markdown(report, charts, final=True)
    write(report, markdown)
    print(markdown)
    written = ", ".join(str(p) for p in (md_path, json_path, csv_path) if p is not None)
    print(f"cnncompare: wrote {written}" + (f" and {len(charts)} charts" if charts else ""), file=sys.stderr)
    return exit_code


def compare_command(argv: list[str]) -> int:
    """``cnncompare compare BASE.json NEW.json [--fail-above PCT]``: exit 1 when the gate fails."""
    from cnncompare.core.compare import DEFAULT_ALPHA, compare_runs, regressions, render_comparison

    p = _Parser(prog="cnncompare compare",
                description="Compare two runs' step times cell by cell (Mann-Whitney U test on the samples).")
    p.add_argument("base", type=Path, help="the earlier run's JSON report")
    p.add_argument("new", type=Path, help="the later run's JSON report")
    p.add_argument("--fail-above", type=_percent_arg, default=None, metavar="PCT",
                   help="exit 1 when a cell ok in both runs got slower by more than PCT percent (a CI gate)")
    p.add_argument("--alpha", type=_alpha_arg, default=DEFAULT_ALPHA,
                   help=f"significance level of the rank test (default: {DEFAULT_ALPHA})")
    args = p.parse_args(argv)
    base, new = _load_report("base", args.base), _load_report("new", args.new)
    cells = compare_runs(base, new)
    print(render_comparison(base, new, cells, args.alpha, args.fail_above), end="")
    if args.fail_above is not None and regressions(cells, args.fail_above):
        return EXIT_HARNESS  # 1: the gate failed
    return EXIT_OK


def report_command(argv: list[str]) -> int:
    """``cnncompare report A.json B.json ... --output combined.md``: one report from several runs."""
    from cnncompare.core.fileio import write_atomic
    from cnncompare.core.report import render_combined

    p = _Parser(prog="cnncompare report", description="Render one markdown report from several runs' JSON reports.")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN.json")
    p.add_argument("--output", type=Path, default=None, help="write the markdown here (default: print it)")
    args = p.parse_args(argv)
    output = _check_writable("--output", args.output) if args.output is not None else None
    reports = [_load_report("RUN.json", path) for path in args.runs]
    markdown = render_combined(reports)
    if output is None:
        print(markdown, end="")
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(output, markdown)
        print(f"cnncompare: wrote {output}", file=sys.stderr)
    return EXIT_OK


def _load_report(option: str, path: Path):
    from cnncompare.core.results import RunReport

    try:
        return RunReport.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise UsageError(f"{option}: {str(path)!r} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{option}: {str(path)!r} is not a cnncompare JSON report ({exc})") from None


def render_backend_list(registry, slots) -> str:
    import torch
    from tabulate import tabulate

    from cnncompare.backends import base

    rows = []
    for name, backend in registry.backends.items():
        availability = []
        for slot in slots:
            reason = slot.unavailable or base.unavailable_reason(backend, torch.device(slot.name))
            availability.append(f"{slot.name}: {'yes' if not reason else 'no (' + reason + ')'}")
        in_all = "yes" if base.in_all(backend) else "no"
        rows.append([name, registry.origin[name], in_all, base.description(backend), "; ".join(availability)])
    text = tabulate(rows, headers=["backend", "plugin", "in all", "description", "devices"], tablefmt="simple")
    broken = [f"  {p.name}: {p.error}" for p in registry.broken]
    if broken:
        text += "\n\nplugins not loaded:\n" + "\n".join(broken)
    return text


def plugins_command(argv: list[str]) -> int:
    """``cnncompare plugins``: every plugin, its distribution, hooks and backends; broken ones with their error."""
    p = _Parser(prog="cnncompare plugins", description="List loaded plugins (built-in and external) and broken ones.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    from tabulate import tabulate

    from cnncompare.plugins import PluginError, load_registry

    try:
        registry = load_registry()
    except PluginError as exc:
        raise UsageError(str(exc)) from None
    if args.json:
        print(json.dumps([vars(info) for info in registry.plugins], indent=2))
        return EXIT_OK
    rows = []
    for info in registry.plugins:
        dist = f"{info.distribution} {info.version}" if info.distribution else "–"
        what = f"BROKEN: {info.error}" if info.error else ", ".join(info.backends) or "(no backends)"
        rows.append([info.name, info.source, dist, ", ".join(info.hooks) or "–", what])
    print(tabulate(rows, headers=["plugin", "source", "distribution", "hooks", "backends"], tablefmt="simple"))
    for warning in registry.warnings:
        print(f"warning: {warning}")
    return EXIT_OK
