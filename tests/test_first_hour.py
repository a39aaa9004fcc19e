"""A newcomer's first hour: a run that would measure nothing is refused, repeated flags combine or
are refused, eager is measured whenever a speedup is asked for, --dry-run checks what a run
would, unknown names get a suggestion, the pick is told as code, and the report's first table
fits a screen."""
import re
from pathlib import Path

import pytest
import torch

from _usage import run_cli as _run
from _usage import usage_error
from cnncompare.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("argv, fragment", [
    (["--devices", "mps"], "--devices: nothing would run: mps: no MPS device on this machine"),
    (["--mode", "inference", "--backends", "eager-fused,compile-step"],
     "--backends: none of the backends named runs here (cpu, inference mode): eager-fused: eager-fused runs in train "
     "mode only, not inference; compile-step: compile-step runs in train mode only, not inference"),
    (["--mode", "train", "--backends", "jit-freeze"], "jit-freeze runs in inference mode only, not train"),
])
@pytest.mark.parametrize("dry", [True, False])
def test_a_run_that_would_measure_nothing_exits_2_before_any_work(capsys, tmp_path, argv, fragment, dry):
    if "mps" in argv and getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        pytest.skip("this machine has an MPS device")
    args = [*argv, "--devices", "cpu"] if "--devices" not in argv else list(argv)
    code, out, err = _run(capsys, *args, "--output", str(tmp_path / "r.md"), *(["--dry-run"] if dry else []))
    assert code == 2 and out == "" and fragment in usage_error(err)
    assert not (tmp_path / "r.md").exists() and not (tmp_path / "r.json").exists()


def test_cuda_asked_for_without_a_gpu_is_refused(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, _, err = _run(capsys, "--devices", "cuda", "--dry-run")
    assert code == 2 and "--devices: nothing would run: cuda: no CUDA device on this machine" in usage_error(err)


def test_list_flags_given_twice_combine_and_single_ones_are_refused(capsys):
    code, out, _ = _run(capsys, "--devices", "cpu", "--devices", "mps", "--backends", "eager", "--backends", "compile",
                        "--dry-run")
    assert code == 0 and "- cpu: 3 cells x 2 rounds: eager, eager-control, compile" in out and "- mps: 0 cells" in out
    for flag, a, b in (("--seed", "1", "2"), ("--mode", "train", "inference"), ("--workload", "resnet", "seed-cnn"),
                       ("--output", "a.md", "b.md")):
        code, _, err = _run(capsys, flag, a, flag, b, "--dry-run")
        assert code == 2 and f"argument {flag}: given twice; give it once" in usage_error(err)
    code, _, err = _run(capsys, "list", "--devices", "cpu", "--json", "--devices", "cpu")
    assert code == 0


def test_backends_named_without_eager_get_eager_as_their_baseline_and_the_plan_says_so(capsys):
    code, out, _ = _run(capsys, "--backends", "compile", "--devices", "cpu", "--dry-run")
    assert code == 0
    assert "- added eager: the baseline every speedup is measured against" in out
    assert "- added eager-control: eager measured again like any backend" in out
    assert "- cpu: 3 cells x 2 rounds: eager, eager-control, compile" in out
    code, out, _ = _run(capsys, "--backends", "compile", "--devices", "cpu", "--no-control", "--dry-run")
    assert code == 0 and "cpu: 2 cells x 2 rounds: eager, compile" in out and "added eager-control" not in out


def test_no_control_with_the_control_named_is_refused(capsys):
    code, _, err = _run(capsys, "--no-control", "--backends", "eager,eager-control", "--dry-run")
    assert code == 2 and "--no-control: eager-control is named in --backends; drop one of the two" in usage_error(err)


def test_the_plan_says_the_warm_up_that_runs(capsys):
    code, out, err = _run(capsys, "--warmup", "0", "--backends", "eager", "--devices", "cpu", "--dry-run")
    assert code == 0 and err == ""
    assert "2 warm-up in round 1 (parity judges step 3; --warmup 0 applies to later rounds)" in out
    code, out, _ = _run(capsys, "--warmup", "5", "--backends", "eager", "--devices", "cpu", "--dry-run")
    assert ", 5 warm-up + 4 measured steps" in out


def test_dry_run_checks_the_files_a_run_reads_and_the_paths_it_writes_and_makes_nothing(capsys, tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code, _, err = _run(capsys, "--resume", str(tmp_path / "nonexist.json"), "--dry-run")
    assert code == 2 and "--resume: " in usage_error(err) and "does not exist" in err
    code, _, err = _run(capsys, "--resume", str(a_file), "--dry-run")
    assert code == 2 and "is not a cnncompare JSON report" in usage_error(err)
    for flag in ("--output", "--json", "--csv"):
        code, _, err = _run(capsys, flag, str(a_file / "sub" / "r.x"), "--backends", "eager", "--dry-run")
        assert code == 2 and f"{flag}: can't write" in usage_error(err) and "is not a directory" in err
    code, _, err = _run(capsys, "--workload", str(tmp_path / "missing.py") + ":build", "--dry-run")
    assert code == 2 and "--workload" in usage_error(err)
    new = tmp_path / "new" / "deeper" / "r.md"
    code, out, _ = _run(capsys, "--output", str(new), "--backends", "eager", "--devices", "cpu", "--dry-run")
    assert code == 0 and out.startswith("Plan:") and not (tmp_path / "new").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # the writability probe left nothing


@pytest.mark.parametrize("argv, fragment", [
    (["--backends", "compiel"], "--backends: unknown backend 'compiel' (did you mean compile or compile-step?); known: "),
    (["--backends", "eager-fussed"], "(did you mean eager-fused"),
    (["--workload", "resnt"], "--workload: unknown workload 'resnt' (did you mean resnet?); known: seed-cnn"),
    (["--devices", "cdua"], "--devices: unknown device 'cdua' (did you mean cuda?); known: all, cpu, cuda, mps"),
    (["--mode", "trian"], "argument --mode: invalid choice: 'trian' (did you mean train?); choose from train, inference"),
    (["--malloc", "resue"], "argument --malloc: invalid choice: 'resue' (did you mean reuse?)"),
    (["--backends", "zzzz"], "--backends: unknown backend 'zzzz'; known: "),  # nothing close: no guess
])
def test_an_unknown_name_gets_the_closest_registered_ones(capsys, argv, fragment):
    code, _, err = _run(capsys, *argv, "--dry-run")
    assert code == 2 and fragment in usage_error(err)


def _backends():
    from cnncompare.plugins import load_registry

    return load_registry()


def test_every_built_in_and_both_plugins_say_how_to_use_them(capsys, monkeypatch):
    from cnncompare.backends import base

    monkeypatch.delenv("CNNCOMPARE_PLUGINS")  # the installed plugins, as a user has them

    registry = _backends()
    # the built-ins, and the two plugins under plugins/ (entry points "amp" and "onnxruntime")
    mine = {n: b for n, b in registry.backends.items() if registry.origin[n].startswith("cnncompare.")
            or registry.origin[n] in ("amp", "onnxruntime")}
    for plugin in ("amp", "onnxruntime"):
        assert plugin in registry.origin.values(), f"the {plugin} plugin is not installed"
    code, listed, _ = _run(capsys, "list", "backends", "--devices", "cpu")
    guide = (ROOT / "docs" / "backends.md").read_text()
    for name, backend in mine.items():
        declared = getattr(backend, "use_it", "")
        assert declared and "\n" not in declared, name
        assert f"use it: {base.use_it(backend, plugin=registry.origin[name])}" in listed, name
        if not name.startswith("dynamo:"):
            assert f"`{declared}`" in guide, f"docs/backends.md lacks {name}'s use-it line"


def test_a_plugin_without_a_use_it_line_gets_its_description_and_where_to_read():
    from cnncompare.backends import base

    class Bare:
        name = "bare"
        description = "something fast"

    assert base.use_it(Bare(), "cuda:1", "acme") == "(no code line declared; see plugin 'acme''s documentation: something fast)"

    class Autocast:
        name = "ac"
        use_it = 'with torch.autocast("{device}"): y = model(x)'

    assert base.use_it(Autocast(), "cuda:1") == 'with torch.autocast("cuda"): y = model(x)'


def _committed(name: str):
    from cnncompare.core.results import RunReport

    return RunReport.from_json((ROOT / "reports" / f"{name}.json").read_text())


def test_the_summary_tells_the_pick_as_code_and_the_report_opens_with_the_verdict_then_the_setup():
    from cnncompare.core.report.markdown import render_markdown

    report = _committed("cpu-my-model")  # the quickstart's run, which picked
    pick = report.verdicts["cpu"].pick
    assert pick
    for r in report.results:
        r.use_it = f"code for {r.backend}"
    md = render_markdown(report)
    head = md.split("\n## cpu\n")[0]
    assert head.index("## Summary") < head.index(f"  Use it: `code for {pick}`") < head.index("Setup:\n\n- **machine**")
    assert len(head.splitlines()) < 20 and max(map(len, head.splitlines())) < 400


def test_the_first_table_of_the_default_report_fits_160_characters_and_explains_its_star():
    from cnncompare.core.report.markdown import render_markdown

    tables = {}
    for name in ("cpu-seed", "cpu-seed-pairs"):  # the default run, and one with --target (stars)
        md = render_markdown(_committed(name))
        section = md.split("\n## cpu\n")[1]
        first = section.strip().split("\n\n")[0].splitlines()
        assert first[0].startswith("| backend") and len(first) > 10
        assert max(len(line) for line in first) <= 160
        tables[name] = md, section, first
    assert "*" not in "".join(tables["cpu-seed"][2])
    md, section, first = tables["cpu-seed-pairs"]
    after = section.strip().split("\n\n")[1]
    assert "*" in "".join(first) and after.startswith("`*`: the speedup's 95 % interval is wider than `--target`")
    summary = md.split("## Summary")[1].split("Setup:")[0]  # where a * first appears, it is explained
    assert summary.index("]*") < summary.index("`*`: the speedup's 95 % interval")


def test_the_summary_on_stdout_names_the_picks_use_it_line_from_a_real_run(tmp_path):
    import json
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "cnncompare", "--backends", "eager", "--devices", "cpu", "--no-control",
                           "--batch-size", "4", "--image-size", "8", "--steps", "2", "--warmup", "0", "--rounds", "1",
                           "--round-time", "0", "--threads", "1", "--output", str(tmp_path / "r.md")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith("Plan: seed-cnn")  # a real run prints its plan too
    row = json.loads((tmp_path / "r.json").read_text())["results"][0]
    assert row["use_it"] == "model  # as written: nothing to change"


#: Words that belong to how this project was made, not to its users: no text a user can reach says them.
INTERNAL = re.compile(r"\bmemo\b|seed study|seed config|seed CNN|grew from|\blent\b|minutes in all|seed's", re.I)


def _user_texts(capsys) -> dict[str, str]:
    from cnncompare.cli.parser import build_parser, subparser
    from cnncompare.core.report.legend import how_to_read

    texts = {str(p.relative_to(ROOT)): p.read_text() for p in
             [ROOT / "README.md", ROOT / "reports" / "README.md", *sorted((ROOT / "docs").glob("*.md")),
              *sorted((ROOT / "plugins").glob("*/README.md"))]}
    parser = build_parser()
    texts["--help"] = parser.format_help()
    for command in ("run", "list", "compare", "report", "docs"):
        texts[f"{command} --help"] = subparser(parser, command).format_help()
    for what in ("backends", "workloads", "plugins"):
        main(["list", what, "--devices", "cpu"])
        texts[f"list {what}"] = capsys.readouterr().out
    texts["legend"] = how_to_read("train") + how_to_read("inference")
    return texts


def test_no_text_a_user_can_reach_speaks_of_how_the_project_was_made(capsys):
    texts = _user_texts(capsys)
    assert len(texts) > 20
    found = {where: INTERNAL.findall(text) for where, text in texts.items() if INTERNAL.search(text)}
    assert not found, found


def test_the_internal_words_check_can_fail():
    assert INTERNAL.search("the blog memo this project grew from") and INTERNAL.search("at the seed config")
    assert not INTERNAL.search("memory vs eager, seed-cnn at the default config")
