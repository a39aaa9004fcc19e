"""``cnncompare [run]``: measure every selected backend on every device and write the report.

The lifecycle: options checked (``select``), the plan printed and nothing run (``--dry-run``),
or the cells run (``core/run/orchestrate``) with the report rewritten after each
(``core/report/writer``); then the summary on stdout (``--print-report``: the whole report),
and the exit code from what happened (``--fail-on``).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import signal
import sys
import traceback
from pathlib import Path
from typing import Any, Optional

from ..core.config import ConfigError, RunConfig, flagged_fields
from ..core.report.writer import Outputs, write_report, write_sweep
from ..core.stats import CONTROL
from . import select
from .parser import EXIT_FOUND, EXIT_HARNESS, EXIT_OK, UsageError


def run_command(args: argparse.Namespace) -> int:
    from ..core.run import devices as devmod

    device_parts = select.devices(args.devices)
    registry = select.registry()
    for warning in registry.warnings:
        print(f"cnncompare: warning: {warning}", file=sys.stderr)
    for plugin in registry.broken:
        print(f"cnncompare: warning: plugin {plugin.name!r} not loaded: {plugin.error}", file=sys.stderr)
    if args.list:  # the earlier spelling of 'cnncompare list'
        from .listing import render_list

        print(render_list(registry, devmod.resolve_devices(device_parts)))
        return EXIT_OK

    configs, added = _configs(args, registry, device_parts)
    if len(configs) > 1 and args.resume:
        raise UsageError("--resume: resume one size of a sweep: its own report (…-bs32.json) with --batch-size 32")
    slots = devmod.resolve_devices(device_parts)
    # Everything a run would refuse, --dry-run refuses too: nothing to run, files to read, paths to write
    # (a dry run makes no folder).
    select.refuse_dead_end(configs[0], registry, slots, added)
    resumed = select.load_report("--resume", args.resume) if args.resume else None
    md_path, json_path = select.output_paths(args, make=not args.dry_run)
    csv_path = select.writable("--csv", args.csv, make=not args.dry_run) if args.csv is not None else None
    if csv_path is not None and csv_path.resolve() in (md_path.resolve(), json_path.resolve()):
        raise UsageError("--csv: must differ from the markdown and JSON paths")
    from .plan import render_plan

    plan = render_plan(configs, registry, slots, md_path.parent, added)
    if args.dry_run:
        print(plan)
        return EXIT_OK
    print(plan, file=sys.stderr)
    outputs = Outputs(md_path, json_path, csv_path)
    if len(configs) > 1:
        print(f"cnncompare: a sweep over batch sizes {', '.join(str(c.batch_size) for c in configs)}: one report per "
              f"size ({md_path.stem}-bs<N>.md) and their summary at {md_path}", file=sys.stderr)
        return sweep(configs, registry, slots, outputs, args.print_report, args.fail_on)
    code, report = run(config=configs[0], registry=registry, slots=slots, outputs=outputs, resumed=resumed,
                       print_report=args.print_report)
    return _verdict_code(code, [report], args.fail_on)


def _configs(args: argparse.Namespace, registry, device_parts) -> tuple[list[RunConfig], list[str]]:
    """One ``RunConfig`` per batch size (one, or a sweep's), checked here and now, and the
    backends the user didn't name that were added: eager, the baseline every speedup needs, and
    beside it ``eager-control``, the noise floor (unless ``--no-control``)."""
    backends = select.backends(args.backends, registry, args.mode)
    if args.no_control and CONTROL in backends:
        raise UsageError(f"--no-control: {CONTROL} is named in --backends; drop one of the two")
    options = select.backend_options(args.backend_option, backends, registry)
    added = []
    if "eager" not in backends:
        backends.insert(0, "eager")
        added.append("eager")
    if CONTROL not in backends and not args.no_control:
        backends.insert(backends.index("eager") + 1, CONTROL)
        added.append(CONTROL)
    workload = select.workload(args, registry)
    sizes = args.batch_size if isinstance(args.batch_size, tuple) else (args.batch_size,)
    try:
        configs = [RunConfig(backends=tuple(backends), devices=tuple(device_parts), workload=workload,
                             backend_options=options, reference_cache=not args.no_cache,
                             **{f.name: getattr(args, f.name) for f in flagged_fields()} | {"batch_size": size})
                   for size in sizes]
        configs[0].check_here()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    return configs, added


def _verdict_code(code: int, reports: list, fail_on: frozenset) -> int:
    """A harness failure or an interruption wins; else 1 when a cell ended in a ``--fail-on`` status."""
    if code != EXIT_OK:
        return code
    hits = [f"{r.backend} on {r.device}: {r.status.value}" for rep in reports for r in rep.results
            if r.status.value in fail_on]
    if hits:
        print(f"cnncompare: --fail-on: {len(hits)} cell(s) ended in a failing status: {'; '.join(hits)}", file=sys.stderr)
        return EXIT_FOUND
    return EXIT_OK


def sweep(configs: list[RunConfig], registry, slots, outputs: Outputs, print_report: bool = False,
          fail_on: frozenset = frozenset()) -> int:
    """``--batch-size 16,32,64``: one whole run per size (``run``), each written beside the
    summary as ``<stem>-bs<N>.md/.json`` (and .csv), then the summary, rewritten after each size
    so an interrupted sweep keeps the sizes it finished."""
    from ..core.report.sweep import SweepPoint

    def beside(path: Optional[Path], tag: str) -> Optional[Path]:
        return path.with_name(path.stem + tag + path.suffix) if path is not None else None

    points: list[SweepPoint] = []
    code = EXIT_OK
    for config in configs:
        tag = f"-bs{config.batch_size}"
        size = Outputs(outputs.markdown.with_name(outputs.markdown.stem + tag + outputs.markdown.suffix),
                       beside(outputs.json, tag), beside(outputs.csv, tag))
        print(f"cnncompare: batch size {config.batch_size} ({len(points) + 1} of {len(configs)})", file=sys.stderr)
        size_code, report = run(config, registry, slots, size, echo=False)
        code = max(code, size_code)
        points.append(SweepPoint(config.batch_size, report, size.markdown, size.json or size.markdown))
        done = len(points) == len(configs) or code >= 128
        written = write_sweep(points, outputs, final=done)
        if code >= 128:  # interrupted: the sizes not yet run stay out
            break
    print(written.markdown if print_report else _summary(written.markdown))
    print(f"cnncompare: wrote the sweep's summary {', '.join(str(p) for p in outputs.paths())}", file=sys.stderr)
    return _verdict_code(code, [p.report for p in points], fail_on)


def run(config: RunConfig, registry, slots, outputs: Outputs, resumed=None, echo: bool = True,
        print_report: bool = False) -> tuple[int, Any]:
    """One run: every cell of ``config``, its report written as it goes and at the end; the
    summary (or with ``print_report`` the whole report) printed when ``echo``. Returns the exit
    code and the final ``RunReport``."""
    from ..core.results import RunReport, differences
    from ..core.run import environment as envmod
    from ..core.run.orchestrate import Interrupted, plan_cells, run_cells
    from ..core.run.progress import for_stream

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

    def on_signal(signum, frame):
        raise Interrupted(signum)

    def write(rep: RunReport) -> None:  # after each cell: the text formats, no charts yet
        write_report(rep, outputs)

    progress = for_stream(sys.stderr)
    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    exit_code = EXIT_OK
    try:
        run_cells(plan_cells(config, slots), config, registry, report, write, progress)
    except Interrupted as exc:
        report.interrupted = True
        exit_code = exc.exit_code
        progress.message(f"cnncompare: interrupted ({exc}); {len(report.results)} finished cells kept. "
                         f"Continue with --resume {outputs.json}")
    except Exception:
        report.interrupted = True
        report.notes.append("the harness failed: " + traceback.format_exc().strip().splitlines()[-1])
        traceback.print_exc()
        exit_code = EXIT_HARNESS
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    report.finished_at = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    written = write_report(report, outputs, final=True)
    if echo:
        print(written.markdown if print_report else _summary(written.markdown))
    charts = f" and {len(written.charts)} charts" if written.charts else ""
    print(f"cnncompare: wrote {', '.join(str(p) for p in outputs.paths())}{charts}", file=sys.stderr)
    return exit_code, report


def _summary(markdown: str) -> str:
    """The report's first lines and its Summary section's verdicts (not the setup list): what
    stdout shows of a run."""
    head, _, rest = markdown.partition("\n## Summary\n")
    body = rest.split("\n## ", 1)[0].split("\nSetup:\n", 1)[0]
    lines = [line for line in body.strip().splitlines() if not line.startswith("![")]
    return "\n".join([head.strip(), "", *[line for line in lines if line.strip()]])
