"""Every verb is a declaration: its options are generated from its settings' fields (and the
run config's, for pretrain and finetune), so --help says each default as the dataclass
holds it, and nothing about a flag is written twice."""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
from dataclasses import MISSING, fields

import pytest

from gptcli.cli.app import VERBS, verb_command, verb_parts
from gptcli.config import default_text, field_default


def _click(verb: str):
    return verb_command(verb)


def _declared(verb: str):
    """(field, the default --help must show) of every option of a verb."""
    settings, _, overrides = verb_parts(verb)
    for f in fields(settings):
        yield f, None
    for group in overrides:
        for f in group.fields():
            own = group.helps.get(f.name)
            yield f, own[1] if own else default_text(f, getattr(group.defaults, f.name, MISSING)
                                                     if group.defaults is not None else MISSING)  # fmt: skip


@pytest.mark.parametrize("verb", list(VERBS))
def test_each_options_help_says_the_default_its_dataclass_holds(verb):
    params = {p.name: p for p in _click(verb).params}
    for f, shown in _declared(verb):
        param = params[f.name]
        if f.metadata.get("argument"):
            assert param.help == f.metadata["help"], f.name
            continue
        expected = shown if shown is not None else default_text(f)
        assert param.help.endswith(f"(default: {expected})."), (f.name, param.help)
        assert param.help.count("(default:") == 1, param.help  # said once, by the generator
        names = {*param.opts, *param.secondary_opts}
        assert set(f.metadata["flag"].split("/")) <= names and (f.metadata.get("short") or "--") in names | {
            "--"
        }


@pytest.mark.parametrize("verb", list(VERBS))
def test_a_verbs_defaults_are_its_dataclasss(verb):
    """An option the verb fills in itself defaults to the field's default (a list: none
    given); an option that overrides a run config defaults to None, 'not given'."""
    settings, _, overrides = verb_parts(verb)
    params = {p.name: p for p in _click(verb).params}
    for f in fields(settings):
        if f.default is MISSING and f.default_factory is MISSING:
            assert params[f.name].required, f.name
        elif f.default_factory is MISSING:
            assert params[f.name].default == field_default(f), f.name
    for group in overrides:
        for f in group.fields():
            assert params[f.name].default is None, f.name


def test_the_help_screens_say_every_default_and_nothing_twice():
    from tests.helpers import run

    for verb in VERBS:
        text = run(verb, "--help").output
        assert "[default:" not in text, verb  # Click's own default display is off: ours says it
        assert not re.search(r"\(default: [^)]*\)[^\n]*\(default:", text), verb


def test_a_settings_range_is_checked_once_with_the_flags_name():
    from tests.helpers import assert_usage_error, run

    assert_usage_error(run("sample", "--temp", "-1"), "--temp must be >= 0, got -1.0")
    assert_usage_error(run("beam", "x", "--beams", "0"), "--beams must be >= 1, got 0")


def test_an_example_too_wide_for_the_terminal_has_its_note_under_it_not_wrapped():
    import os
    import subprocess
    import sys

    from gptcli.cli.declare import fit_examples

    doc = "Do it.\n\n    gptcli x --long-flag value      what it does\n    gptcli y  short"
    assert fit_examples(doc, 40).splitlines()[2:] == [  # all of them, once one does not fit
        "    gptcli x --long-flag value",
        "        what it does",
        "    gptcli y",
        "        short",
    ]
    assert fit_examples(doc, 120) == doc
    # the width is the terminal's when the verbs are declared: a process of its own
    env = {**os.environ, "COLUMNS": "80"}
    args = [sys.executable, "-m", "gptcli", "sample", "--help"]
    shown = subprocess.run(args, capture_output=True, text=True, env=env, check=True).stdout.splitlines()
    assert "newest run, start of a document" in [line.strip() for line in shown]
    assert max(len(line) for line in shown) <= 80


def test_a_paragraph_of_prose_in_a_verbs_help_is_wrapped_at_the_terminals_width():
    """Typer keeps a help's line breaks: a docstring line wider than the terminal broke in two,
    leaving a few words on a line of their own (`beam --help` at 80 columns: "the end")."""
    import os
    import subprocess
    import sys

    from gptcli.cli.declare import prose_on_one_line

    doc = "Do it.\n\nKeeps the best\nones, and then\nstops.\n\ngptcli x   first\ngptcli y   second"
    assert (
        prose_on_one_line(doc)
        == "Do it.\n\nKeeps the best ones, and then stops.\n\ngptcli x   first\ngptcli y   second"
    )
    env = {**os.environ, "COLUMNS": "80"}
    args = [sys.executable, "-m", "gptcli", "beam", "--help"]
    shown = [
        ln.strip()
        for ln in subprocess.run(
            args, capture_output=True, text=True, env=env, check=True
        ).stdout.splitlines()
    ]
    prose = shown[next(i for i, ln in enumerate(shown) if ln.startswith("Keeps")) :]
    prose = prose[: prose.index("")]
    assert len(prose) >= 2 and all(len(line) > 60 for line in prose[:-1]), prose


@pytest.mark.parametrize("verb", list(VERBS))
def test_the_summary_gptcli_help_lists_is_the_first_paragraph_of_the_verbs_help(verb):
    """`gptcli --help` lists the verbs from VERBS without importing them: each summary there
    is what Typer would list from the command itself."""
    first = inspect.cleandoc(verb_command(verb).help).split("\n\n")[0]
    assert VERBS[verb].summary == first.replace("\n", " ").strip()


def test_gptcli_help_imports_no_verb():
    code = (
        "import sys\n"
        "from gptcli.cli.app import VERBS, main\n"
        "sys.argv = ['gptcli', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "loaded = [v.module for v in VERBS.values() if 'gptcli.cli.' + v.module in sys.modules]\n"
        "print(loaded, file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "tokenize" in done.stdout and "chat" in done.stdout  # the list itself
    assert done.stderr.strip().splitlines()[-1] == "[]"
