"""``cnncompare list [backends|workloads|plugins]``: what is installed and where it runs."""
from __future__ import annotations

import argparse
import json
from typing import Optional

from ..core.config import DEFAULT_WORKLOAD
from . import select
from .parser import EXIT_OK


def list_command(args: argparse.Namespace) -> int:
    from ..core.run import devices as devmod

    slots = devmod.resolve_devices(select.devices(args.devices))
    registry = select.registry()
    if args.json:
        print(json.dumps(_as_json(registry, slots, args.what), indent=2))
        return EXIT_OK
    if args.what == "plugins":
        print(render_plugins(registry))
    elif args.what == "backends":
        print(render_backends(registry, slots))
    elif args.what == "workloads":
        print(render_workloads(registry))
    else:
        print(render_list(registry, slots))
    return EXIT_OK


def _unavailable(backend, slots) -> dict[str, Optional[str]]:
    """Per device, why ``backend`` can't run there (None: it can)."""
    import torch

    from ..backends import base

    return {s.name: s.unavailable or base.unavailable_reason(backend, torch.device(s.name)) for s in slots}


def _as_json(registry, slots, what) -> object:
    from ..backends import base
    from ..workloads.base import description

    backends = [{"name": name, "plugin": registry.origin[name], "in_all": base.in_all(b), "modes": list(base.modes(b)),
                 "description": base.description(b), "use_it": base.use_it(b, plugin=registry.origin[name]),
                 "unavailable": _unavailable(b, slots)}
                for name, b in registry.backends.items()]
    workloads = [{"name": name, "plugin": registry.workload_origin[name], "sample_unit": w.sample_unit,
                  "options": dict(w.options), "description": description(w)} for name, w in registry.workloads.items()]
    plugins = [vars(info) for info in registry.plugins]
    everything = {"backends": backends, "workloads": workloads, "plugins": plugins}
    return everything[what] if what else everything


def render_backends(registry, slots) -> str:
    """Every backend as a short block: its name, plugin, modes and whether ``all`` has it; what it
    is; the code a user writes to get it ("use it"); where it runs (why not, where it doesn't).
    Blocks, not a table: the descriptions and code lines would make a table hundreds of
    characters wide."""
    from ..backends import base

    blocks = []
    for name, backend in registry.backends.items():
        plugin = registry.origin[name]
        tags = [plugin, " and ".join(base.modes(backend))] + ([] if base.in_all(backend) else ["not in all"])
        availability = "; ".join(f"{device}: {'yes' if not reason else 'no (' + reason + ')'}"
                                 for device, reason in _unavailable(backend, slots).items())
        lines = [f"{name}  ({', '.join(tags)})"]
        if about := base.description(backend):
            lines.append(f"  {about}")
        lines += [f"  use it: {base.use_it(backend, plugin=plugin)}", f"  runs on: {availability}"]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks)


def render_workloads(registry) -> str:
    """Every registered workload as a short block (its options with their defaults first), and
    the ones found by name."""
    from ..workloads.base import description

    blocks = []
    for name, w in registry.workloads.items():
        options = ", ".join(f"{k}={v}" for k, v in w.options.items()) or "no options"
        default = ", the default" if name == DEFAULT_WORKLOAD else ""
        lines = [f"{name} ({registry.workload_origin[name]}{default}): {options}"]
        if about := description(w):
            lines.append(f"  {about}")
        lines.append(f"  one sample: one {w.sample_unit}")
        blocks.append("\n".join(lines))
    return ("\n\n".join(blocks)
            + "\n\nAlso: --workload torchvision:<model> or timm:<model> (when the library is installed), and your "
            "own model as FILE.py:FUNCTION or MODULE:FUNCTION ('cnncompare docs workloads').")


def render_plugins(registry) -> str:
    """Every plugin, its distribution, hooks and what it registers; broken ones with their error."""
    from tabulate import tabulate

    rows = []
    for info in registry.plugins:
        dist = f"{info.distribution} {info.version}" if info.distribution else "–"
        what = f"BROKEN: {info.error}" if info.error else ", ".join(info.backends + info.workloads) or "(nothing)"
        rows.append([info.name, info.source, dist, ", ".join(info.hooks) or "–", what])
    text = tabulate(rows, headers=["plugin", "source", "distribution", "hooks", "registers"], tablefmt="simple")
    return "\n".join([text, *(f"warning: {w}" for w in registry.warnings)])


def render_list(registry, slots) -> str:
    """Backends, then workloads, then plugins that failed to load."""
    text = render_backends(registry, slots) + "\n\n" + render_workloads(registry)
    broken = [f"  {p.name}: {p.error}" for p in registry.broken]
    if broken:
        text += "\n\nplugins not loaded:\n" + "\n".join(broken)
    return text
