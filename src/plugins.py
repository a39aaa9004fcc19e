"""Plugin loading and the backend registry.

Built-ins come from ``cnncompare.backends.BUILTIN_PLUGINS``; third-party
plugins from the ``cnncompare`` entry-point group, filtered by the
``CNNCOMPARE_PLUGINS`` environment variable (unset: all; empty: none; else a
comma list of entry-point names). A plugin that fails to import, to validate
or to register is recorded with its error and the run goes on; two plugins
registering one backend name is a startup error naming both.
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

from cnncompare import PROJECT_NAME, __version__, hookspecs
from cnncompare.backends import BUILTIN_PLUGINS

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
    error: Optional[str] = None


@dataclass
class Registry:
    """Backends by name, with the plugin each came from."""

    backends: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
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
    """Load built-ins, entry-point plugins and ``extra_plugins``; collect their backends.

    ``extra_plugins`` are objects registered in-process (tests, embedding
    applications). Raises ``PluginError`` for a duplicate backend name.
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
    _collect_backends(pm, registry)
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


def _collect_backends(pm: pluggy.PluginManager, registry: Registry) -> None:
    by_name = {p.name: p for p in registry.plugins}
    # Each plugin's hook is called on its own so a registration can be traced
    # to its plugin (duplicate names name both) and a raising plugin is
    # isolated from the others.
    for impl in pm.hook.cnncompare_register_backends.get_hookimpls():
        info = by_name[impl.plugin_name]
        added: list[str] = []

        def register(backend: Any, _info: PluginInfo = info, _added: list = added) -> None:
            _check_contract(backend, _info.name)
            name = backend.name
            if name in registry.backends:
                raise PluginError(
                    f"backend name {name!r} is registered twice: by plugin "
                    f"{registry.origin[name]!r} and by plugin {_info.name!r}"
                )
            registry.backends[name] = backend
            registry.origin[name] = _info.name
            _added.append(name)

        kwargs = {"register": register}
        try:
            impl.function(*(kwargs[arg] for arg in impl.argnames))
        except PluginError:
            raise
        except Exception as exc:
            info.error = f"cnncompare_register_backends raised {_short_error(exc)}"
            for name in added:  # a half-registered plugin is not trusted
                registry.backends.pop(name, None)
                registry.origin.pop(name, None)
            added.clear()
        info.backends = list(added)


def _check_contract(backend: Any, plugin: str) -> None:
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not _NAME_RE.match(name):
        raise ValueError(
            f"a backend's name must be a non-empty string of letters, digits and '-_.:+', got {name!r}"
        )
    if not callable(getattr(backend, "compile", None)):
        raise ValueError(f"backend {name!r} has no callable compile(model, example, device)")
