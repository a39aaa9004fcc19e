"""From the run's options to what runs and where it is written: backends (names and patterns),
their options, the workload and its options, writable paths, earlier reports. Every refusal is
a ``UsageError`` naming the flag, raised before any cell runs."""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

from ..core.config import LOOP_KEYS, LoopSpec, RecipeInfo, WorkloadSpec
from .parser import WORKLOAD_OPTION_FLAGS, UsageError, did_you_mean

#: Where a run's report goes when --output doesn't say: outside any committed reports/ folder.
DEFAULT_OUTPUT_DIR = Path("cnncompare-runs")


def registry():
    """The plugin registry; a plugin that can't be loaded at all is a usage error."""
    from ..plugins import PluginError, load_registry

    try:
        return load_registry()
    except PluginError as exc:
        raise UsageError(str(exc)) from None


def backends(spec: str, registry, mode: str = "train") -> list[str]:
    """``all`` is every backend whose ``in_all`` is true and that runs in ``mode`` (a training
    report doesn't list the inference-only deploy paths as skipped, nor an inference report the
    training-only ones); other items are names or globs (``dynamo:*``), kept whatever their modes
    so that a backend asked for by name in a mode it lacks is a ``skipped`` row saying why."""
    from fnmatch import fnmatchcase

    from ..backends import base

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
            raise UsageError(f"--backends: unknown backend {item!r}{did_you_mean(item, list(registry.backends))}; "
                             f"{_known_backends(registry)}")
        chosen += [n for n in expanded if n not in chosen]
    return chosen


def devices(spec: str) -> list[str]:
    """``--devices``'s items, checked (``parse_devices``); an unknown kind gets the closest known
    one suggested."""
    from ..core.run import devices as devmod

    try:
        return devmod.parse_devices(spec)
    except devmod.DeviceError as exc:
        message = str(exc)
        if exc.unknown is not None:
            head, _, known = message.partition("; ")
            message = f"{head}{did_you_mean(exc.unknown, ['all', *devmod.KNOWN_KINDS])}; {known}"
        raise UsageError(f"--devices: {message}") from None


def refuse_dead_end(config, registry, slots, added: list[str]) -> None:
    """A ``UsageError`` when nothing the user asked for could run: every device absent, or no
    backend they named (``added`` are the baseline rows the command line put in) runs in this
    mode on any device here. The line names each one's reason."""
    from ..core.run.cell import unavailable

    present = [s for s in slots if not s.unavailable]
    if not present:
        raise UsageError("--devices: nothing would run: " + "; ".join(f"{s.name}: {s.unavailable}" for s in slots))
    named = [n for n in config.backends if n not in added] or list(config.backends)
    reasons = {}
    for name in named:
        why = [unavailable(registry.backends[name], s.name, config) for s in present]
        if None in why:
            return
        reasons[name] = why[0]
    where = ", ".join(s.name for s in present)
    raise UsageError(f"--backends: none of the backends named runs here ({where}, {config.mode} mode): "
                     + "; ".join(f"{name}: {why}" for name, why in reasons.items()))


def backend_options(items: list[str], selected: list[str], registry) -> dict[str, dict[str, Any]]:
    """``--backend-option NAME:KEY=VALUE`` items, per backend, each handed to the backend's
    ``configure`` here first, so an option it refuses ends the command line before any cell."""
    from ..backends import base

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

    from ..backends import base

    curated = [n for n, b in registry.backends.items() if base.in_all(b)]
    groups = Counter(n.split(":", 1)[0] + ":*" if ":" in n else n
                     for n, b in registry.backends.items() if not base.in_all(b))
    text = "known: " + ", ".join(["all", *curated])
    if groups:
        text += "; outside all: " + ", ".join(f"{g} ({c})" if c > 1 else g for g, c in groups.items())
        text += " ('cnncompare list backends' shows every name)"
    return text


def workload(args: argparse.Namespace, registry) -> WorkloadSpec:
    """The workload named by ``--workload`` (a plugin's, a library model, or the user's factory:
    ``workloads.find``), its options given on the command line checked and the rest filled with
    its defaults. A workload no plugin registers joins ``registry`` so the cells find it."""
    from ..workloads import WorkloadError, find
    from ..workloads.base import OptionError, loop_of, resolve_options, throughput_unit, units_per_sample

    if ":" not in args.workload and args.workload not in registry.workloads:
        raise UsageError(f"--workload: unknown workload {args.workload!r}{did_you_mean(args.workload, list(registry.workloads))}; "
                         f"known: {', '.join(registry.workloads)}, torchvision:<model>, timm:<model>, FILE.py:FUNCTION, "
                         "MODULE:FUNCTION")
    try:
        found, origin = find(args.workload, registry.workloads)
    except WorkloadError as exc:
        raise UsageError(f"--workload {args.workload}: {exc}" if ":" in args.workload else f"--workload: {exc}") from None
    if origin:
        registry.workloads[found.name] = found
        registry.workload_origin[found.name] = origin
    given = {"image_size": args.image_size} if args.image_size is not None else {}
    for item in args.workload_option:
        key, value = _option_value(item, found)
        if key in given and key in WORKLOAD_OPTION_FLAGS:
            raise UsageError(f"--workload-option {key}: given twice (also as {WORKLOAD_OPTION_FLAGS[key]})")
        given[key] = value
    try:
        options = resolve_options(found, given)
        units = units_per_sample(found, options)
    except OptionError as exc:
        label = WORKLOAD_OPTION_FLAGS.get(exc.key) if args.image_size is not None else None
        raise UsageError(f"{label}: {exc.message}" if label else f"--workload-option {exc}") from None
    except WorkloadError as exc:
        raise UsageError(f"--workload {args.workload}: {exc}") from None
    try:
        recipe = recipe_info(found, options)
        declared = loop_of(found, options)
        LoopSpec.of(declared, f"workload {found.name!r}'s loop")
    except (WorkloadError, ValueError, TypeError) as exc:
        raise UsageError(f"--workload {args.workload}: {exc}") from None
    return WorkloadSpec(found.name, options, found.sample_unit, throughput_unit(found), units, recipe,
                        loop_spec(args.loop, declared))


def loop_spec(items: list[str], declared: Mapping[str, Any]) -> LoopSpec:
    """The loop: ``--loop KEY=VALUE`` items over the workload's ``declared`` keys, over
    ``LoopSpec``'s defaults; a ``UsageError`` naming the bad item."""
    given: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--loop: expected KEY=VALUE, got {item!r}; the keys are {', '.join(LOOP_KEYS)}")
        if key not in LOOP_KEYS:
            raise UsageError(f"--loop: unknown key {key!r}{did_you_mean(key, list(LOOP_KEYS))}; the keys are "
                             f"{', '.join(LOOP_KEYS)}")
        if key in given:
            raise UsageError(f"--loop {key}: given twice")
        try:
            given[key] = int(text)
        except ValueError:
            raise UsageError(f"--loop {key}: expected a whole number, got {text!r}") from None
    try:
        return LoopSpec.of({**declared, **given}, "--loop")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def recipe_info(workload: Any, options: Mapping[str, Any]) -> RecipeInfo:
    """What the report says of the workload's recipe: its optimizer and scheduler built once over
    a stand-in parameter (so a factory that can't build them fails here, before any cell)."""
    import torch

    from ..workloads.base import describe_optimizer, recipe_of

    recipe = recipe_of(workload, options)
    clip = None if recipe.clip_grad_norm is None else float(recipe.clip_grad_norm)
    if recipe.optimizer is None and recipe.scheduler is None:  # nothing of the user's to build
        return RecipeInfo("", "", clip, recipe.accumulation_steps)
    try:
        optimizer = recipe.build_optimizer([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        described = describe_optimizer(optimizer)  # before a scheduler sets its first values (OneCycleLR's)
        scheduler = recipe.scheduler(optimizer) if recipe.scheduler else None
    except Exception as exc:
        raise ValueError(f"the recipe's optimizer or scheduler raised {type(exc).__name__}: {exc}") from exc
    return RecipeInfo(described if recipe.optimizer else "", type(scheduler).__name__ if scheduler is not None else "",
                      clip, recipe.accumulation_steps)


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


def writable(option: str, path: Path, make: bool = True) -> Path:
    """``path`` as a file this run can write, its folder created; else a ``UsageError``. With
    ``make`` false (``--dry-run``) nothing is made: the nearest existing folder must take a new
    file, so the run could make the rest.

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
        if make:
            path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            with open(path, "r+b"):
                pass
        elif make:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            os.unlink(path)
        else:  # the folder that exists must take a new file
            handle, probe = tempfile.mkstemp(dir=existing, prefix=".cnncompare-check-")
            os.close(handle)
            os.unlink(probe)
    except OSError as exc:
        reason = "permission denied" if isinstance(exc, PermissionError) else (exc.strerror or str(exc)).lower()
        raise UsageError(f"{option}: can't write {str(path)!r}: {reason}") from None
    return path


def output_paths(args: argparse.Namespace, make: bool = True) -> tuple[Path, Path]:
    """The markdown and JSON paths of a run: ``--output``/``--json``, beside ``--resume``'s
    report, or a new timestamped pair in ``DEFAULT_OUTPUT_DIR``; checked writable (``writable``,
    their folders made unless not ``make``)."""
    if args.output is not None:
        md_path = args.output
    elif args.resume is not None:
        md_path = args.resume.with_suffix(".md")
    else:
        stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
        md_path = DEFAULT_OUTPUT_DIR / f"cnncompare-{stamp}.md"
    json_path = args.json if args.json is not None else (args.resume or md_path.with_suffix(".json"))
    md_path, json_path = writable("--output", md_path, make), writable("--json", json_path, make)
    if json_path.resolve() == md_path.resolve():
        raise UsageError("--json: must differ from the markdown --output path")
    return md_path, json_path


def load_report(option: str, path: Path):
    """A run's JSON report (``RunReport``); a missing or foreign file is a ``UsageError``."""
    from ..core.results import RunReport

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
