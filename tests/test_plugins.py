"""The plugin contract: in-process registration, faked entry points, errors that name the culprit."""
import sys
import types
from importlib.metadata import EntryPoint

import pytest

import cnncompare
from cnncompare import plugins
from cnncompare.plugins import PluginError, load_registry

#: The built-ins in registration order; ``all`` in training (the default mode) is every one but the
#: inference-only deploy paths, and in inference every one but the training-only two.
TRAIN_BUILTINS = ["eager", "eager-fused", "channels-last", "jit-trace", "jit-script", "compile", "compile-step",
                  "compile-reduce-overhead", "compile-max-autotune", "compile-max-autotune-no-cudagraphs",
                  "aot-eager", "compile-channels-last", "compile-dynamic", "compile-mark-dynamic", "compile-regional"]
DEPLOY_BUILTINS = ["jit-freeze", "compile-freezing", "export-aot-inductor"]
BUILTINS = TRAIN_BUILTINS + DEPLOY_BUILTINS
#: Registered in this order; eager-control (the A/A row the command line adds beside eager) is not in `all`.
REGISTERED = ["eager", "eager-control", *BUILTINS[1:]]


def curated(reg):
    """The built-ins' curated set (the dynamo bridge adds dynamo:* names)."""
    return [n for n in reg.backends if not n.startswith("dynamo:")]


def _plugin_module(name, backends=(), hook_name="cnncompare_register_backends", raises=None):
    mod = types.ModuleType(name)

    def hook(register):
        for b in backends:
            register(b)
        if raises:
            raise raises

    setattr(mod, hook_name, cnncompare.hookimpl(hook))
    return mod


class _B:
    def __init__(self, name):
        self.name = name

    def compile(self, model, example, device):
        return model


def test_builtins_register_through_the_hook_in_order():
    reg = load_registry(entry_points=False)
    assert curated(reg) == REGISTERED
    assert reg.origin["compile"] == "cnncompare.backends.inductor"
    hooks = {p.name: p.hooks for p in reg.plugins}
    for workload in ("seed_cnn", "resnet", "transformer"):
        assert hooks.pop(f"cnncompare.workloads.{workload}") == ["cnncompare_register_workloads"]
    assert all(h == ["cnncompare_register_backends"] for h in hooks.values())


def test_in_process_plugin_registers_a_minimal_backend():
    reg = load_registry(extra_plugins=[_plugin_module("mine", [_B("my-backend")])], entry_points=False)
    assert reg.get("my-backend").name == "my-backend"
    assert reg.origin["my-backend"] == "mine"


def test_duplicate_backend_name_names_both_plugins():
    with pytest.raises(PluginError) as info:
        load_registry(extra_plugins=[_plugin_module("copycat", [_B("eager")])], entry_points=False)
    assert "'eager'" in str(info.value)
    assert "cnncompare.backends.eager" in str(info.value) and "copycat" in str(info.value)


@pytest.mark.parametrize("bad, expected", [
    (_B(""), "non-empty string"),
    (_B("a,b"), "non-empty string"),
    (types.SimpleNamespace(name="nocompile"), "no callable compile"),
])
def test_contract_violations_break_only_that_plugin(bad, expected):
    reg = load_registry(extra_plugins=[_plugin_module("bad", [_B("fine-one"), bad])], entry_points=False)
    (broken,) = reg.broken
    assert broken.name == "bad" and expected in broken.error
    assert "fine-one" not in reg.backends  # a half-registered plugin is not trusted
    assert curated(reg) == REGISTERED


def test_raising_hook_is_recorded():
    reg = load_registry(extra_plugins=[_plugin_module("raiser", raises=ValueError("kaput"))], entry_points=False)
    assert "kaput" in reg.broken[0].error


def test_misspelled_hook_fails_loudly():
    reg = load_registry(extra_plugins=[_plugin_module("typo", hook_name="cnncompare_register_backend")], entry_points=False)
    (broken,) = reg.broken
    assert broken.name == "typo" and "unknown hook" in broken.error


@pytest.fixture
def fake_entry_points(monkeypatch):
    good = _plugin_module("fake_good_plugin", [_B("from-entry-point")])
    monkeypatch.setitem(sys.modules, "fake_good_plugin", good)
    eps = [
        EntryPoint(name="good", value="fake_good_plugin", group="cnncompare"),
        EntryPoint(name="broken", value="no_such_module_for_cnncompare", group="cnncompare"),
    ]
    monkeypatch.setattr(plugins, "_entry_points", lambda: eps)
    monkeypatch.delenv(plugins.ENV_PLUGINS, raising=False)


def test_entry_point_plugins_load_and_an_import_failure_is_named(fake_entry_points):
    reg = load_registry()
    assert reg.origin["from-entry-point"] == "good"
    (broken,) = reg.broken
    assert broken.name == "broken" and "no_such_module_for_cnncompare" in broken.error
    assert broken.source == "entry point"


def test_env_var_limits_external_plugins(fake_entry_points, monkeypatch):
    monkeypatch.setenv(plugins.ENV_PLUGINS, "")
    reg = load_registry()
    assert curated(reg) == REGISTERED and not reg.broken
    monkeypatch.setenv(plugins.ENV_PLUGINS, "good, nonexistent")
    reg = load_registry()
    assert "from-entry-point" in reg.backends and not reg.broken
    assert any("nonexistent" in w for w in reg.warnings)


def test_hookimpl_is_exported_and_every_hookspec_is_documented():
    from cnncompare import hookspecs

    assert cnncompare.hookimpl.project_name == "cnncompare"
    specs = [getattr(hookspecs, n) for n in dir(hookspecs) if n.startswith("cnncompare_")]
    assert specs and all(len((s.__doc__ or "").strip()) > 200 for s in specs)


def test_a_backend_still_declaring_the_old_absolute_tolerance_is_warned_about():
    old = _B("old-tolerance")
    old.parity_tolerance = 1e-2
    reg = load_registry(extra_plugins=[_plugin_module("old", [old])], entry_points=False)
    assert "old-tolerance" in reg.backends
    assert any("'old-tolerance' sets parity_tolerance" in w and "parity_rtol" in w for w in reg.warnings)
