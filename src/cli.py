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
import typing
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from . import __version__
from .core.config import DEFAULT_WORKLOAD, ConfigError, RunConfig, WorkloadSpec, flagged_fields

EXIT_OK, EXIT_HARNESS, EXIT_USAGE = 0, 1, 2

#: Workload options with a flag of their own (the seed study's); others come with the workload.
WORKLOAD_OPTION_FLAGS = {"image_size": "--image-size"}


class UsageError(Exception):
    """One line for the user; exit 2 before any work."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> typing.NoReturn:  # one clear line, no usage dump
        raise UsageError(message)


def _number(option: str, kind: type) -> Callable[[str], Any]:
    """Text to ``kind`` (int or a finite-or-not float) for ``option``; bounds are the config's to check."""
    noun = "a whole number" if kind is int else "a number"

    def parse(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{option}: expected {noun}, got {text!r}") from None

    return parse


def _bounded_float(option: str, valid: Callable[[float], bool], requirement: str) -> Callable[[str], float]:
    """A finite float for ``option`` of the commands outside a run's config (compare's gates)."""
    to_float = _number(option, float)

    def parse(text: str) -> float:
        value = to_float(text)
        if not (math.isfinite(value) and valid(value)):
            raise argparse.ArgumentTypeError(f"{option}: must be {requirement}, got {text}")
        return value

    return parse


def _batch_sizes(text: str) -> tuple[int, ...]:
    """``--batch-size``: one whole number, or a comma list of distinct ones (a sweep), in order."""
    parse = _number("--batch-size", int)
    sizes = tuple(parse(part.strip()) for part in text.split(","))
    if len(set(sizes)) != len(sizes):
        raise argparse.ArgumentTypeError(f"--batch-size: {text!r} names a size twice")
    return sizes


def _field_type(annotation: Any) -> type:
    """int, float or str from a config field's type (``Optional[int]`` is int)."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    return args[0] if args else annotation


def build_parser() -> argparse.ArgumentParser:
    """The command line: the run's options come from ``RunConfig``'s fields (flag, help,
    default, choices), the rest choose what runs and where the report goes."""
    p = _Parser(
        prog="cnncompare",
        description="Compare PyTorch compilation backends on one training step of a workload: "
        "time, compile cost, memory and correctness, each cell in its own process.",
        epilog="Other commands: 'cnncompare plugins' lists loaded plugins; 'cnncompare compare BASE.json NEW.json' "
        "compares two runs; 'cnncompare report A.json B.json ...' merges runs into one report. "
        "Exit codes: 0 every requested cell has a row (failed cells are results), "
        "1 the harness failed, 2 usage error, 130/143 interrupted (finished cells kept).",
    )
    p.add_argument("--backends", default="all",
                   help="'all' (the curated set), or a comma list of names and patterns, e.g. all,dynamo:* (default: all)")
    p.add_argument("--devices", default="all", help="'all' (cpu + every CUDA GPU + mps), or a comma list of cpu, cuda, cuda:N, mps (default: all)")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, metavar="NAME",
                   help="what every backend trains: a workload --list shows, torchvision:<model>, timm:<model>, "
                   f"or your own FILE.py:FUNCTION or MODULE:FUNCTION (docs/workloads.md) (default: {DEFAULT_WORKLOAD})")
    p.add_argument("--workload-option", action="append", default=[], metavar="KEY=VALUE",
                   help="a workload option (repeat for several); --list shows each workload's options and defaults")
    p.add_argument("--backend-option", action="append", default=[], metavar="NAME:KEY=VALUE",
                   help="an option for one selected backend's configure() (repeat for several), e.g. "
                   "dynamo:openvino:aot_autograd=true (torch.compile's options); VALUE is read as JSON where it is "
                   "JSON (true, 3, \"x\"), else as text")
    p.add_argument("--image-size", type=_number("--image-size", int), default=None, metavar="N",
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
            kwargs.update(choices=meta["choices"], metavar=None)
        elif f.name == "batch_size":
            kwargs.update(type=_batch_sizes, metavar="N[,N...]",
                          help=f"{meta['help']}; several sizes (16,32,64) sweep: the matrix runs at each, each "
                          f"size's report beside a summary of throughput against batch size (default: {shown})")
        elif (kind := _field_type(hints[f.name])) in (int, float):
            kwargs["type"] = _number(meta["flag"], kind)
        target.add_argument(meta["flag"], **kwargs)
    p.add_argument("--output", type=Path, default=None, help="markdown report path (default: reports/cnncompare-<timestamp>.md)")
    p.add_argument("--json", type=Path, default=None, help="JSON report path (default: beside the markdown, .json)")
    p.add_argument("--csv", type=Path, default=None, help="also write one CSV row per result (JSON key names as headers)")
    p.add_argument("--resume", type=Path, default=None, metavar="PATH.json",
                   help="continue an interrupted run: keep its finished cells, run the rest (same options required)")
    p.add_argument("--list", action="store_true", help="list backends and workloads, their plugins and availability "
                   "per device, then exit")
    p.add_argument("--version", action="version", version=f"cnncompare {__version__}")
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

    from .core.run import devices as devmod

    try:
        device_parts = devmod.parse_devices(args.devices)
    except devmod.DeviceError as exc:
        raise UsageError(f"--devices: {exc}") from None
    registry = _registry()
    for warning in registry.warnings:
        print(f"cnncompare: warning: {warning}", file=sys.stderr)
    for plugin in registry.broken:
        print(f"cnncompare: warning: plugin {plugin.name!r} not loaded: {plugin.error}", file=sys.stderr)

    if args.list:
        print(render_list(registry, devmod.resolve_devices(device_parts)))
        return EXIT_OK

    backends = _select_backends(args.backends, registry, args.mode)
    backend_options = _backend_options(args.backend_option, backends, registry)
    workload = _select_workload(args, registry)
    sizes = args.batch_size if isinstance(args.batch_size, tuple) else (args.batch_size,)
    try:
        configs = [RunConfig(backends=tuple(backends), devices=tuple(device_parts), workload=workload,
                             backend_options=backend_options,
                             **{f.name: getattr(args, f.name) for f in flagged_fields()} | {"batch_size": size})
                   for size in sizes]
        configs[0].check_here()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    config = configs[0]
    if len(configs) > 1 and args.resume:
        raise UsageError("--resume: resume one size of a sweep: its own report (…-bs32.json) with --batch-size 32")
    resumed = _load_report("--resume", args.resume) if args.resume else None
    md_path, json_path = _output_paths(args)
    csv_path = _check_writable("--csv", args.csv) if args.csv is not None else None
    if csv_path is not None and csv_path.resolve() in (md_path.resolve(), json_path.resolve()):
        raise UsageError("--csv: must differ from the markdown and JSON paths")
    slots = devmod.resolve_devices(device_parts)
    if len(configs) > 1:
        return sweep(configs, registry, slots, md_path, json_path, csv_path)
    return run(config, registry, slots, md_path, json_path, resumed, csv_path)[0]


def _registry():
    from .plugins import PluginError, load_registry

    try:
        return load_registry()
    except PluginError as exc:
        raise UsageError(str(exc)) from None


def _select_backends(spec: str, registry, mode: str = "train") -> list[str]:
    """``all`` is every backend whose ``in_all`` is true and that runs in ``mode`` (a training
    report doesn't list the inference-only deploy paths as skipped, nor an inference report the
    training-only ones); other items are names or globs (``dynamo:*``), kept whatever their modes
    so that a backend asked for by name in a mode it lacks is a ``skipped`` row saying why."""
    from fnmatch import fnmatchcase

    from .backends import base

    names = [part.strip() for part in spec.split(",") if part.strip()]
    if not names:
        raise UsageError("--backends: no backend given")
    chosen: list[str] = []
    for item in names:
        if item == "all":
            expanded = [n for n, b in registry.backends.items() if base.in_all(b) and mode in base.modes(b)]
        else:
            expanded = [n for n in registry.backends if fnmatchcase(n, item)]
        if not expanded:
            raise UsageError(f"--backends: unknown backend {item!r}; {_known_backends(registry)}")
        chosen += [n for n in expanded if n not in chosen]
    return chosen


def _backend_options(items: list[str], selected: list[str], registry) -> dict[str, dict[str, Any]]:
    """``--backend-option NAME:KEY=VALUE`` items, per backend, each handed to the backend's
    ``configure`` here first, so an option it refuses ends the command line before any cell."""
    from .backends import base

    options: dict[str, dict[str, Any]] = {}
    for item in items:
        target, sep, text = item.partition("=")
        name, colon, key = target.rpartition(":")
        if not sep or not colon or not name or not key.strip():
            raise UsageError(f"--backend-option: expected NAME:KEY=VALUE, got {item!r}")
        if name not in selected:
            raise UsageError(f"--backend-option {name}: not among the selected backends ({', '.join(selected)})")
        try:
            value = json.loads(text)
        except ValueError:
            value = text
        options.setdefault(name, {})[key.strip()] = value
    for name, given in options.items():
        try:
            base.configure(registry.backends[name], given)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"--backend-option {name}: {exc}") from None
    return options


def _known_backends(registry) -> str:
    """'known: all, a, b; outside all: dynamo:* (13)' (every curated name, the rest by prefix)."""
    from collections import Counter

    from .backends import base

    curated = [n for n, b in registry.backends.items() if base.in_all(b)]
    groups = Counter(n.split(":", 1)[0] + ":*" if ":" in n else n
                     for n, b in registry.backends.items() if not base.in_all(b))
    text = "known: " + ", ".join(["all", *curated])
    if groups:
        text += "; outside all: " + ", ".join(f"{g} ({c})" if c > 1 else g for g, c in groups.items())
        text += " (cnncompare --list shows every name)"
    return text


def _select_workload(args: argparse.Namespace, registry) -> WorkloadSpec:
    """The workload named by ``--workload`` (a plugin's, a library model, or the user's factory:
    ``workloads.find``), its options given on the command line checked and the rest filled with
    its defaults. A workload no plugin registers joins ``registry`` so the cells find it."""
    from .workloads import WorkloadError, find
    from .workloads.base import OptionError, resolve_options, throughput_unit, units_per_sample

    try:
        workload, origin = find(args.workload, registry.workloads)
    except WorkloadError as exc:
        raise UsageError(f"--workload {args.workload}: {exc}" if ":" in args.workload else f"--workload: {exc}") from None
    if origin:
        registry.workloads[workload.name] = workload
        registry.workload_origin[workload.name] = origin
    given = {"image_size": args.image_size} if args.image_size is not None else {}
    for item in args.workload_option:
        key, value = _option_value(item, workload)
        if key in given and key in WORKLOAD_OPTION_FLAGS:
            raise UsageError(f"--workload-option {key}: given twice (also as {WORKLOAD_OPTION_FLAGS[key]})")
        given[key] = value
    try:
        options = resolve_options(workload, given)
        units = units_per_sample(workload, options)
    except OptionError as exc:
        label = WORKLOAD_OPTION_FLAGS.get(exc.key) if args.image_size is not None else None
        raise UsageError(f"{label}: {exc.message}" if label else f"--workload-option {exc}") from None
    except WorkloadError as exc:
        raise UsageError(f"--workload {args.workload}: {exc}") from None
    return WorkloadSpec(workload.name, options, workload.sample_unit, throughput_unit(workload), units)


def _option_value(item: str, workload: Any) -> tuple[str, Any]:
    """``KEY=VALUE`` as the option's type (its default's); a key the workload lacks keeps its
    text, for ``resolve_options`` to refuse naming the workload's options."""
    key, sep, text = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--workload-option: expected KEY=VALUE, got {item!r}")
    default = workload.options.get(key)
    if isinstance(default, bool):
        words = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
        if text.lower() not in words:
            raise UsageError(f"--workload-option {key}: expected true or false, got {text!r}")
        return key, words[text.lower()]
    if isinstance(default, (int, float)):
        try:
            return key, type(default)(text)
        except ValueError:
            noun = "a whole number" if type(default) is int else "a number"
            raise UsageError(f"--workload-option {key}: expected {noun}, got {text!r}") from None
    return key, text


def _check_writable(option: str, path: Path) -> Path:
    """``path`` as a file this run can write, its folder created; else one line and exit 2.

    Only writing tells (a read-only or virtual filesystem answers permission
    checks and still refuses), so the folder is made and a new file is
    created and removed here, before any cell runs.
    """
    path = path.expanduser()
    # os.path, not pathlib: pathlib re-raises EACCES from stat() (a folder we may not enter).
    if os.path.isdir(path):
        raise UsageError(f"{option}: {str(path)!r} is a directory, expected a file path")
    existing = path.parent
    while not os.path.exists(existing):
        existing = existing.parent
    if not os.path.isdir(existing):
        raise UsageError(f"{option}: can't write {str(path)!r}: {str(existing)!r} is not a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "r+b"):
                pass
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(path)
    except OSError as exc:
        reason = "permission denied" if isinstance(exc, PermissionError) else (exc.strerror or str(exc)).lower()
        raise UsageError(f"{option}: can't write {str(path)!r}: {reason}") from None
    return path


def _output_paths(args: argparse.Namespace) -> tuple[Path, Path]:
    if args.output is not None:
        md_path = args.output
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


def sweep(configs: list[RunConfig], registry, slots, md_path: Path, json_path: Path,
          csv_path: Optional[Path] = None) -> int:
    """``--batch-size 16,32,64``: one whole run per size (``run``), each written beside
    ``md_path`` as ``<stem>-bs<N>.md/.json`` (and .csv), then the summary at ``md_path`` and
    ``json_path``, rewritten after each size so an interrupted sweep keeps the sizes it finished."""
    from .core.fileio import write_atomic
    from .core.report.sweep import SweepPoint, render_sweep_json, render_sweep_markdown, write_sweep_chart

    points: list[SweepPoint] = []
    code = EXIT_OK
    for config in configs:
        tag = f"-bs{config.batch_size}"
        size_md, size_json = (p.with_name(p.stem + tag + p.suffix) for p in (md_path, json_path))
        size_csv = csv_path.with_name(csv_path.stem + tag + csv_path.suffix) if csv_path is not None else None
        print(f"cnncompare: batch size {config.batch_size} ({len(points) + 1} of {len(configs)})", file=sys.stderr)
        size_code, report = run(config, registry, slots, size_md, size_json, None, size_csv, echo=False)
        code = max(code, size_code)
        points.append(SweepPoint(config.batch_size, report, size_md, size_json))
        final = len(points) == len(configs) or code >= 128
        chart = None
        if final:
            try:
                chart = write_sweep_chart(points, md_path)
            except Exception as exc:  # a chart is not worth losing the summary for
                print(f"cnncompare: the sweep's chart could not be drawn: {type(exc).__name__}: {exc}", file=sys.stderr)
        write_atomic(md_path, render_sweep_markdown(points, md_path, chart, final=len(points) == len(configs)))
        write_atomic(json_path, render_sweep_json(points, md_path))
        if code >= 128:  # interrupted: the sizes not yet run stay out
            break
    print(md_path.read_text(encoding="utf-8"))
    print(f"cnncompare: wrote the sweep's summary {md_path}, {json_path}", file=sys.stderr)
    return code


def run(config: RunConfig, registry, slots, md_path: Path, json_path: Path, resumed=None,
        csv_path: Optional[Path] = None, echo: bool = True) -> tuple[int, Any]:
    """One run: every cell of ``config``, its report written as it goes and at the end (printed
    when ``echo``). Returns the exit code and the final ``RunReport``."""
    from .core.fileio import write_atomic
    from .core.report.charts import write_charts
    from .core.report.data import render_csv, render_json
    from .core.report.markdown import render_markdown
    from .core.results import RunReport, differences
    from .core.run import environment as envmod
    from .core.run.orchestrate import Interrupted, plan_cells, run_cells
    from .core.run.progress import for_stream

    environment = envmod.capture(config.resolved_threads)
    report = RunReport(environment=environment, config=config, started_at=environment["date"])
    if resumed is not None:
        if changed := differences(resumed, report):
            raise UsageError("--resume: refused, the run differs from the one being resumed: " + "; ".join(changed))
        report = resumed
        report.interrupted = False
        report.config = config
        report.notes.append(f"resumed at {environment['date']} with {len(report.results)} finished cells kept")
    report.plugins = [vars(p).copy() for p in registry.plugins]
    report.notes.extend(w for w in registry.warnings if w not in report.notes)

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
    charts: Optional[list[tuple[str, str]]]
    try:
        charts = write_charts(report, md_path)
    except Exception as exc:  # a chart is not worth losing the report for
        charts = []
        report.notes.append(f"charts could not be drawn: {type(exc).__name__}: {exc}")
    markdown = render_markdown(report, charts, final=True)
    write(report, markdown)
    if echo:
        print(markdown)
    written = ", ".join(str(p) for p in (md_path, json_path, csv_path) if p is not None)
    print(f"cnncompare: wrote {written}" + (f" and {len(charts)} charts" if charts else ""), file=sys.stderr)
    return exit_code, report


def compare_command(argv: list[str]) -> int:
    """``cnncompare compare BASE.json NEW.json [--fail-above PCT]``: exit 1 when the gate fails."""
    from .core.report.compare import compare_runs, regressions, render_comparison
    from .core.stats import DEFAULT_ALPHA

    p = _Parser(prog="cnncompare compare",
                description="Compare two runs' step times cell by cell (Mann-Whitney U test on the samples).")
    p.add_argument("base", type=Path, help="the earlier run's JSON report")
    p.add_argument("new", type=Path, help="the later run's JSON report")
    p.add_argument("--fail-above", type=_bounded_float("--fail-above", lambda v: v >= 0, "a percentage >= 0"), default=None, metavar="PCT",
                   help="exit 1 when a cell ok in both runs got slower by more than PCT percent (a CI gate)")
    p.add_argument("--alpha", type=_bounded_float("--alpha", lambda v: 0 < v < 1, "between 0 and 1"), default=DEFAULT_ALPHA,
                   help=f"significance level of the rank test (default: {DEFAULT_ALPHA})")
    p.add_argument("--any-workload", action="store_true",
                   help="compare runs of different workloads (or of one workload with other options) cell by cell")
    args = p.parse_args(argv)
    base, new = _load_report("base", args.base), _load_report("new", args.new)
    if base.config.mode != new.config.mode:
        raise UsageError(f"the runs measured different modes ({base.config.mode} vs {new.config.mode}): a training "
                         f"step and a forward are different work")
    a, b = base.config.workload, new.config.workload
    if (a.name, dict(a.options)) != (b.name, dict(b.options)) and not args.any_workload:
        what = (f"{a.name} vs {b.name}" if a.name != b.name else
                f"{a.name} with other options ({_options_text(a.options)} vs {_options_text(b.options)})")
        raise UsageError(f"the runs trained different workloads ({what}); their step times measure different "
                         f"work (--any-workload compares them anyway)")
    cells = compare_runs(base, new)
    print(render_comparison(base, new, cells, args.alpha, args.fail_above), end="")
    if args.fail_above is not None and regressions(cells, args.fail_above):
        return EXIT_HARNESS  # 1: the gate failed
    return EXIT_OK


def _options_text(options) -> str:
    return ", ".join(f"{k}={v}" for k, v in options.items()) or "none"


def report_command(argv: list[str]) -> int:
    """``cnncompare report A.json B.json ... --output combined.md``: one report from several runs.

    One run re-renders that run's own report from its JSON (with its charts, drawn beside
    ``--output``), so a committed report can be regenerated after the renderer changes."""
    from .core.fileio import write_atomic
    from .core.report.charts import write_charts
    from .core.report.markdown import render_combined, render_markdown

    p = _Parser(prog="cnncompare report",
                description="Render one markdown report from several runs' JSON reports "
                            "(from one, that run's own report, as the run wrote it).")
    p.add_argument("runs", type=Path, nargs="+", metavar="RUN.json")
    p.add_argument("--output", type=Path, default=None, help="write the markdown here (default: print it)")
    args = p.parse_args(argv)
    output = _check_writable("--output", args.output) if args.output is not None else None
    reports = [_load_report("RUN.json", path) for path in args.runs]
    if len(reports) == 1:
        charts = write_charts(reports[0], output) if output is not None else []
        markdown = render_markdown(reports[0], charts, final=output is not None)
    else:
        markdown = render_combined(reports)
    if output is None:
        print(markdown, end="")
    else:
        write_atomic(output, markdown)
        print(f"cnncompare: wrote {output}", file=sys.stderr)
    return EXIT_OK


def _load_report(option: str, path: Path):
    from .core.results import RunReport

    try:
        text = path.read_text(encoding="utf-8")
        if '"kind": "batch-size sweep"' in text:
            raise UsageError(f"{option}: {str(path)!r} is a batch-size sweep's summary; use one size's report "
                             f"beside it ({path.stem}-bs<N>.json)")
        return RunReport.from_json(text)
    except FileNotFoundError:
        raise UsageError(f"{option}: {str(path)!r} does not exist") from None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UsageError(f"{option}: {str(path)!r} is not a cnncompare JSON report ({exc})") from None


def render_list(registry, slots) -> str:
    """``--list``: every backend with its plugin and availability per device, then the workloads."""
    import torch
    from tabulate import tabulate

    from .backends import base
    from .workloads.base import description

    rows = []
    for name, backend in registry.backends.items():
        availability = []
        for slot in slots:
            reason = slot.unavailable or base.unavailable_reason(backend, torch.device(slot.name))
            availability.append(f"{slot.name}: {'yes' if not reason else 'no (' + reason + ')'}")
        in_all = "yes" if base.in_all(backend) else "no"
        rows.append([name, registry.origin[name], in_all, ", ".join(base.modes(backend)), base.description(backend),
                     "; ".join(availability)])
    text = tabulate(rows, headers=["backend", "plugin", "in all", "modes", "description", "devices"],
                    tablefmt="simple")
    workloads = [[name + (" (default)" if name == DEFAULT_WORKLOAD else ""), registry.workload_origin[name],
                  w.sample_unit, ", ".join(f"{k}={v}" for k, v in w.options.items()) or "–", description(w)]
                 for name, w in registry.workloads.items()]
    text += "\n\n" + tabulate(workloads, headers=["workload", "plugin", "sample", "options (defaults)", "description"],
                              tablefmt="simple")
    text += ("\n\nAlso: --workload torchvision:<model> or timm:<model> (when the library is installed), and your "
             "own model as FILE.py:FUNCTION or MODULE:FUNCTION (docs/workloads.md).")
    broken = [f"  {p.name}: {p.error}" for p in registry.broken]
    if broken:
        text += "\n\nplugins not loaded:\n" + "\n".join(broken)
    return text


def plugins_command(argv: list[str]) -> int:
    """``cnncompare plugins``: every plugin, its distribution, hooks, backends and workloads; broken ones
    with their error."""
    p = _Parser(prog="cnncompare plugins", description="List loaded plugins (built-in and external) and broken ones.")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = p.parse_args(argv)
    from tabulate import tabulate

    registry = _registry()
    if args.json:
        print(json.dumps([vars(info) for info in registry.plugins], indent=2))
        return EXIT_OK
    rows = []
    for info in registry.plugins:
        dist = f"{info.distribution} {info.version}" if info.distribution else "–"
        what = f"BROKEN: {info.error}" if info.error else ", ".join(info.backends + info.workloads) or "(nothing)"
        rows.append([info.name, info.source, dist, ", ".join(info.hooks) or "–", what])
    print(tabulate(rows, headers=["plugin", "source", "distribution", "hooks", "registers"], tablefmt="simple"))
    for warning in registry.warnings:
        print(f"warning: {warning}")
    return EXIT_OK
