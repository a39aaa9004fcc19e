"""The docs match the code: every hook and optional member in the plugin guide, every flag of every
command in docs/cli.md (and nothing there that isn't a flag), every link inside the repository."""
import inspect
import re
from pathlib import Path

from cnncompare import hookspecs
from cnncompare.backends import base

ROOT = Path(__file__).resolve().parents[1]
GUIDE = (ROOT / "docs" / "plugins.md").read_text()
CLI_DOC = (ROOT / "docs" / "cli.md").read_text()
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
    helpers = {"description", "use_it", "unavailable_reason", "min_warmup", "parity_rtol", "in_all"}
    members = helpers | {"compile_step", "make_train_step", "make_optimizer", "prepare_input"}
    for member in members:
        assert f"`{member}" in GUIDE, member
        assert f"``{member}" in base.Backend.__doc__, member
    for helper in helpers:
        assert hasattr(base, helper)


def _synopsis() -> dict[str, str]:
    """docs/cli.md's synopsis block, per command: its text from ``cnncompare [run]`` or
    ``cnncompare <command>`` to the next command."""
    block = CLI_DOC.split("```")[1]
    parts = re.split(r"^cnncompare (\[run\]|list|compare|report|docs|--version)", block, flags=re.M)
    return {("run" if name == "[run]" else name): text for name, text in zip(parts[1::2], parts[2::2])}


def _as_help_prints(action) -> str:
    """One option as argparse's usage prints it: ``[--flag METAVAR]``, or a positional's metavar."""
    from cnncompare.cli.parser import build_parser

    formatter = build_parser()._get_formatter()
    if not action.option_strings:
        return formatter._format_args(action, formatter._get_default_metavar_for_positional(action))
    args = formatter._format_args(action, formatter._get_default_metavar_for_optional(action)) if action.nargs != 0 else ""
    return f"[{action.option_strings[0]}{' ' + args if args else ''}]"


def test_every_flag_of_every_command_is_documented_as_help_prints_it_and_every_documented_flag_is_real():
    from cnncompare.cli.parser import build_parser, options_of

    documented = {name: " ".join(text.split()) for name, text in _synopsis().items()}
    commands = options_of(build_parser())
    assert set(commands) <= set(documented), set(commands) - set(documented)
    for name, actions in commands.items():
        assert actions
        for action in actions:
            assert _as_help_prints(action) in documented[name], (name, _as_help_prints(action))
        real = {s for a in actions for s in a.option_strings}
        assert set(re.findall(r"--[a-z][a-z-]*", documented[name])) <= real, (name, documented[name])


def _links(path: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return re.findall(r"\]\(([^)\s]+)\)", text)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors in ``path``."""
    out = set()
    for heading in re.findall(r"^#+ (.+)$", re.sub(r"```.*?```", "", path.read_text(), flags=re.S), flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().strip()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_link_in_readme_docs_and_reports_resolves_inside_the_repository():
    pages = [ROOT / "README.md", ROOT / "reports" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for page in pages:
        for link in _links(page):
            assert "://" not in link and not link.startswith("mailto:"), f"{page.name}: {link} leaves the repository"
            target, _, anchor = link.partition("#")
            resolved = (page.parent / target).resolve() if target else page
            assert resolved.exists(), f"{page.name}: {link} does not exist"
            assert ROOT in resolved.parents or resolved == ROOT, f"{page.name}: {link} is outside the repository"
            if anchor and resolved.suffix == ".md":
                assert anchor in _anchors(resolved), f"{page.name}: {link}: no such heading"
            checked += 1
    assert checked > 30


def test_no_doc_names_a_path_outside_the_repository_or_an_issue_number():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = page.read_text()
        assert "shared/" not in text and not re.search(r"\bissue \d+", text, flags=re.I), page.name


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 220
    first_screen = "\n".join(readme.splitlines()[:30])
    for command in ("pip install", "cnncompare --workload examples/my_model.py:build", "cnncompare docs"):
        assert command in first_screen, command


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


def test_the_reports_index_is_generated_from_the_committed_json_and_current():
    import importlib.util

    spec = importlib.util.spec_from_file_location("reports_index", ROOT / "bench" / "reports_index.py")
    index = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(index)
    assert len(index.rows()) >= 15
    assert index.main(["--check"]) == 0, "run: python bench/reports_index.py"
    # each row quotes its report's own summary, not a verdict derived again
    for row in index.rows():
        stem = re.match(r"\| \[([^\]]+)\]", row).group(1)
        assert index.summary_of((ROOT / "reports" / f"{stem}.md").read_text()) in row


def _report_stem(name: str) -> str:
    """The report a file in reports/ belongs to: its charts and CSV are its report's."""
    stem = name.split(".", 1)[0]
    return re.sub(r"-(speedup|step-time|compile-vs-step|throughput)$", "", stem)


def test_every_file_in_reports_is_cited_by_readme_docs_or_the_index():
    """reports/ holds what is current: a file no page cites is a superseded experiment (git keeps it)."""
    pages = [ROOT / "README.md", ROOT / "reports" / "README.md", *(ROOT / "docs").glob("*.md"),
             *(ROOT / "plugins").glob("*/README.md")]
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages)
    uncited = sorted({name for name in (p.name for p in (ROOT / "reports").iterdir()) if name != "README.md"
                      if not re.search(rf"\b{re.escape(_report_stem(name))}(\.md|\.txt|\.json|\]|`|\b)", text)})
    assert not uncited, f"cited by no page (remove, or cite): {uncited}"


def _shell_blocks(text: str) -> list[str]:
    return re.findall(r"```sh\n(.*?)```", text, flags=re.S)


def test_every_cnncompare_command_in_the_readme_parses_and_names_real_flags():
    import shlex

    from cnncompare.cli.parser import build_parser, normalize

    readme = (ROOT / "README.md").read_text()
    commands = [line.split("  #")[0].strip() for block in _shell_blocks(readme) for line in block.splitlines()
                if line.startswith("cnncompare")]
    commands += re.findall(r"`(cnncompare [^`]*)`", readme)
    assert len(commands) > 10 and "cnncompare --backends all" in commands
    placeholders = {"BASE.json": "a.json", "NEW.json": "b.json", "A.json": "a.json", "B.json": "b.json",
                    "PATH.json": "x.json", "SECONDS": "60", "TOPIC": "reading"}
    parser = build_parser()
    parsed = 0
    for command in commands:
        if "[" in command:  # a synopsis (`cnncompare [run] [options]`), not a command
            continue
        argv = [placeholders.get(a, a) for a in shlex.split(command)[1:]]
        args = parser.parse_args(normalize(argv))  # a UsageError names what doesn't parse
        assert args.command in ("run", "list", "compare", "report", "docs"), command
        parsed += 1
    assert parsed > 10


def test_the_readme_quickstart_goes_from_a_clone_to_a_verdict_in_order():
    readme = (ROOT / "README.md").read_text()
    quickstart = _shell_blocks(readme.split("## Quickstart", 1)[1])[0]
    steps = ["git clone", "python3 -m venv", "pip install torch --index-url https://download.pytorch.org/whl/cpu",
             "pip install -e .", "cnncompare --workload examples/my_model.py:build"]
    where = [quickstart.index(step) for step in steps]
    assert where == sorted(where), quickstart


#: A speedup with its interval, as reports print it: 1.39x [1.30, 1.48].
SPEEDUP = re.compile(r"(\d+\.\d\d)[x×] \[(\d+\.\d\d), (\d+\.\d\d)\]")


def _normalized(text: str) -> str:
    return " ".join(text.replace("×", "x").split())


def _reports_linked(page: Path, text: str) -> list[Path]:
    return [page.parent / link for link in re.findall(r"\]\(([^)#\s]*reports/[^)#\s]+\.md)", text)]


def test_figures_in_readme_and_docs_agree_with_the_report_they_cite():
    """A paragraph that links a report quotes it: a blockquote is the text of the report the paragraph
    before links, and each speedup with its interval appears in a report its paragraph (or, for a
    table or a quote, the paragraph that introduces it) links."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    checked = 0
    for page in pages:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        paragraphs = re.split(r"\n\s*\n", text)
        for i, paragraph in enumerate(paragraphs):
            cited = _reports_linked(page, paragraph)
            if paragraph.lstrip().startswith(">"):  # a quote cites the paragraph before it
                cited = _reports_linked(page, paragraphs[i - 1])
                assert cited, f"{page.name}: a quote without the report it comes from: {paragraph[:80]}"
                quote = _normalized(re.sub(r"^\s*> ?", "", paragraph, flags=re.M))
                assert any(quote in _normalized(c.read_text()) for c in cited), f"{page.name}: {quote[:100]}"
                checked += 1
                continue
            if paragraph.lstrip().startswith("|"):  # a table: introduced by the paragraph before it
                cited += _reports_linked(page, paragraphs[i - 1])
            if not cited:
                continue
            reports = " ".join(_normalized(c.read_text()) for c in cited)
            for figure in SPEEDUP.finditer(_normalized(paragraph)):
                assert f"{figure[1]}x [{figure[2]}, {figure[3]}]" in reports, f"{page.name}: {figure[0]} is not in {cited}"
                checked += 1
    assert checked >= 3


def test_the_figure_check_can_fail(tmp_path):
    report = tmp_path / "reports" / "r.md"
    report.parent.mkdir()
    report.write_text("- **cpu**: pick **x**, 1.26x [1.21, 1.30] eager.")
    assert SPEEDUP.search(_normalized("it picked x at 1.26× [1.21, 1.30]"))
    assert "1.27x [1.21, 1.30]" not in _normalized(report.read_text())


def test_reading_md_holds_the_legend_the_reports_print():
    from cnncompare.core.report.legend import with_legend

    page = (ROOT / "docs" / "reading.md").read_text()
    assert with_legend(page) == page, "run: python -m cnncompare.core.report.legend docs/reading.md"
