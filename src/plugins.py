"""Plugin loading, and the registry of backends and workloads.

Built-ins come from ``BUILTIN_PLUGINS``; third-party plugins from the
``cnncompare`` entry-point group, filtered by the ``CNNCOMPARE_PLUGINS``
environment variable (unset: all; empty: none; else a comma list of
entry-point names). A plugin that fails to import, to validate or to
register is recorded with its error and the run goes on; two plugins
registering one name (of a backend, or of a workload) is a startup error
naming both.
"""
from __future__ import annotations

import importlib
import os
import re
import traceback
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Iterable, Optional

import pluggy

from . import PROJECT_NAME, __version__, hookspecs
from .workloads.base import check_contract as check_workload

#: Built-in plugins: the same hooks and marker as third-party ones, registered from this
#: tuple (not entry points) so an uninstalled checkout and the tests see them too.
BUILTIN_PLUGINS = (
    "cnncompare.backends.eager",
    "cnncompare.backends.torchscript",
    "cnncompare.backends.inductor",
    "cnncompare.backends.dynamo_bridge",
    "cnncompare.backends.deploy",
    "cnncompare.workloads.seed_cnn",
    "cnncompare.workloads.resnet",
    "cnncompare.workloads.transformer",
)

ENV_PLUGINS = "CNNCOMPARE_PLUGINS"
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:+\-]*$")


class PluginError(Exception):
    """A startup error a user must fix (e.g. a duplicate backend name)."""


@dataclass
class PluginInfo:
    """One loaded (or broken) plugin, as ``--list`` and the report show it."""

    name: str
    source: str  # "builtin", "entry point" or "in-process"
    distribution: Optional[str] = None
    version: Optional[str] = None
    hooks: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)
    workloads: list[str] = field(default_factory=list)
    error: Optional[str] = None


@dataclass
class Registry:
    """Backends and workloads by name, with the plugin each came from."""

    backends: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    workloads: dict[str, Any] = field(default_factory=dict)
    workload_origin: dict[str, str] = field(default_factory=dict)
    plugins: list[PluginInfo] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def broken(self) -> list[PluginInfo]:
        return [p for p in self.plugins if p.error]

    def get(self, name: str) -> Any:
        return self.backends[name]


def _short_error(exc: BaseException) -> str:
    last = traceback.format_exception_only(type(exc), exc)[-1].strip()
    return last


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=PROJECT_NAME), key=lambda ep: ep.name)


def selected_entry_point_names(env: Optional[str]) -> Optional[set[str]]:
    """None means 'load every entry point'; a set (maybe empty) limits them."""
    if env is None:
        return None
    return {part.strip() for part in env.split(",") if part.strip()}


def make_plugin_manager() -> pluggy.PluginManager:
    pm = pluggy.PluginManager(PROJECT_NAME)
    pm.add_hookspecs(hookspecs)
    return pm


def load_registry(extra_plugins: Iterable[Any] = (), entry_points: bool = True) -> Registry:
    """Load built-ins, entry-point plugins and ``extra_plugins``; collect their backends and workloads.

    ``extra_plugins`` are objects registered in-process (tests, embedding
    applications). Raises ``PluginError`` for a duplicate name.
    """
    pm = make_plugin_manager()
    registry = Registry()
    candidates: list[tuple[Any, PluginInfo]] = []

    for modname in BUILTIN_PLUGINS:
        # A built-in that fails to import is our bug: let it raise.
        info = PluginInfo(name=modname, source="builtin", distribution=PROJECT_NAME, version=__version__)
        candidates.append((importlib.import_module(modname), info))

    if entry_points:
        wanted = selected_entry_point_names(os.environ.get(ENV_PLUGINS))
        found = set()
        for ep in _entry_points():
            found.add(ep.name)
            if wanted is not None and ep.name not in wanted:
                continue
            dist = getattr(ep, "dist", None)
            info = PluginInfo(
                name=ep.name,
                source="entry point",
                distribution=dist.metadata["Name"] if dist else None,
                version=dist.version if dist else None,
            )
            try:
                candidates.append((ep.load(), info))
            except Exception as exc:
                info.error = f"import of {ep.value!r} failed: {_short_error(exc)}"
                registry.plugins.append(info)
        for missing in sorted((wanted or set()) - found):
            registry.warnings.append(f"{ENV_PLUGINS} names {missing!r}, but no installed plugin has that entry-point name")

    for i, obj in enumerate(extra_plugins):
        name = getattr(obj, "__name__", None) or f"{type(obj).__name__}-{i}"
        candidates.append((obj, PluginInfo(name=name, source="in-process")))

    for obj, info in candidates:
        try:
            pm.register(obj, name=info.name)
        except Exception as exc:  # e.g. a hookimpl whose arguments don't match the spec
            info.error = f"invalid plugin: {_short_error(exc)}"
            registry.plugins.append(info)
            continue
        info.hooks = sorted(caller.name for caller in pm.get_hookcallers(obj) or [])
        registry.plugins.append(info)

    _reject_unknown_hooks(pm, registry)
    _collect(pm, registry, "backend")
    _collect(pm, registry, "workload")
    return registry


def _reject_unknown_hooks(pm: pluggy.PluginManager, registry: Registry) -> None:
    """A misspelled hook would silently never run: make its plugin broken, loudly."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin)
            pm.unregister(exc.plugin)
            for info in registry.plugins:
                if info.name == name:
                    info.error = f"unknown hook: {exc}"


def _collect(pm: pluggy.PluginManager, registry: Registry, kind: str) -> None:
    """Call every plugin's ``cnncompare_register_<kind>s`` hook into the registry."""
    hook_name = f"cnncompare_register_{kind}s"
    table, origin = ((registry.backends, registry.origin) if kind == "backend"
                     else (registry.workloads, registry.workload_origin))
    check = _check_contract if kind == "backend" else check_workload
    by_name = {p.name: p for p in registry.plugins}
    # Each plugin's hook is called on its own so a registration can be traced
    # to its plugin (duplicate names name both) and a raising plugin is
    # isolated from the others.
    for impl in getattr(pm.hook, hook_name).get_hookimpls():
        info = by_name[impl.plugin_name]
        if info.error:  # broken by an earlier hook: none of its objects is trusted
            continue
        added: list[str] = []

        def register(obj: Any, _info: PluginInfo = info, _added: list = added) -> None:
            _check_name(obj, kind)
            check(obj)
            name = obj.name
            if name in table:
                raise PluginError(f"{kind} name {name!r} is registered twice: by plugin "
                                  f"{origin[name]!r} and by plugin {_info.name!r}")
            table[name] = obj
            origin[name] = _info.name
            _added.append(name)
            if hasattr(obj, "parity_tolerance") and not hasattr(obj, "parity_rtol"):
                registry.warnings.append(
                    f"backend {name!r} sets parity_tolerance (schema 1's absolute RMSE floor), which is no longer "
                    "read: it is judged with the default relative tolerance; declare parity_rtol (docs/parity.md)")

        kwargs = {"register": register}
        try:
            impl.function(*(kwargs[arg] for arg in impl.argnames))
        except PluginError:
            raise
        except Exception as exc:
            info.error = f"{hook_name} raised {_short_error(exc)}"
            _forget(registry, info.name)
            info.backends, info.workloads = [], []
            added.clear()
        (info.backends if kind == "backend" else info.workloads)[:] = added


def _forget(registry: Registry, plugin: str) -> None:
    """A half-registered plugin is not trusted: drop everything it registered."""
    for table, origin in ((registry.backends, registry.origin), (registry.workloads, registry.workload_origin)):
        for name in [n for n, p in origin.items() if p == plugin]:
            table.pop(name, None)
            origin.pop(name, None)


def _check_name(obj: Any, kind: str) -> None:
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(f"a {kind}'s name must be a non-empty string of letters, digits and '-_.:+', got {name!r}")


def _check_contract(backend: Any) -> None:
    name = backend.name
    if not callable(getattr(backend, "compile", None)):
        raise ValueError(f"backend {name!r} has no callable compile(model, example, device)")
