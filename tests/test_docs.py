"""The plugin author's guide matches the code: every hook and optional member is documented, every hook tested."""
import inspect
import re
from pathlib import Path

from cnncompare import hookspecs
from cnncompare.backends import base

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "plugins.md").read_text()
HOOKS = {n: f for n, f in vars(hookspecs).items() if n.startswith("cnncompare_") and callable(f)}


def test_every_hook_is_documented_with_its_exact_signature():
    assert HOOKS
    for name, spec in HOOKS.items():
        assert f"{name}{inspect.signature(spec)}" in GUIDE, name


def test_every_hook_has_a_test():
    others = [p.read_text() for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_docs.py"]
    for name in HOOKS:
        assert any(re.search(rf"\b{name}\b", text) for text in others), f"no test mentions {name}"


def test_every_optional_member_is_documented_in_the_guide_and_the_protocol():
    helpers = {"description", "unavailable_reason", "min_warmup", "parity_rtol", "in_all"}
    members = helpers | {"compile_step", "make_train_step", "make_optimizer", "prepare_input"}
    for member in members:
        assert f"`{member}" in GUIDE, member
        assert f"``{member}" in base.Backend.__doc__, member
    for helper in helpers:
        assert hasattr(base, helper)


def test_every_command_line_flag_is_in_the_readme_synopsis():
    from cnncompare.cli import build_parser

    readme = (ROOT / "README.md").read_text()
    synopsis = readme[readme.index("## Command line"):readme.index("- Defaults:")]
    flags = {s for a in build_parser()._actions for s in a.option_strings if s.startswith("--")}
    assert flags and not {f for f in flags if f"[{f}" not in synopsis and f" {f} " not in synopsis}


def _design_layout() -> set[str]:
    """The files docs/design.md's layout lists, as paths under src/ (folders by indentation)."""
    design = (ROOT / "docs" / "design.md").read_text()
    block = design[design.index("## Layout"):].split("```")[1]
    listed, stack = set(), []
    for line in block.strip("\n").splitlines()[1:]:  # the first line is src/ itself
        depth = (len(line) - len(line.lstrip())) // 2 - 1
        name = line.split()[0]
        stack[depth:] = [name.rstrip("/")]
        if name.endswith(".py"):
            listed.add("/".join(stack))
    return listed


def test_the_design_layout_lists_every_module_and_only_those():
    modules = {str(p.relative_to(ROOT / "src")) for p in (ROOT / "src").rglob("*.py")
               if p.name != "__init__.py" or p.parent == ROOT / "src"}
    assert _design_layout() == modules
