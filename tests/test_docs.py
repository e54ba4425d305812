"""The documentation: the site builds with --strict (no broken link or anchor), its CLI
reference is generated from the app and lists every verb and option, every page is in the
nav, and the README stays a front door."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys

import pytest

from gptcli.cli.app import VERBS, verb_command
from tests.helpers import ROOT


def _hook():
    spec = importlib.util.spec_from_file_location(
        "cli_reference", ROOT / "docs" / "hooks" / "cli_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cli_reference_lists_every_verb_and_option_with_its_help():
    page = _hook().reference()
    for name in VERBS:
        assert f"## `gptcli {name}`" in page
        for param in verb_command(name).params:
            if param.param_type_name == "option":
                assert f"`{param.opts[0]}`" in page, (name, param.opts)
                assert param.help.replace("<", "&lt;").replace(">", "&gt;").replace("|", "\\|") in page


def test_every_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = {p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").glob("*.md")}
    assert pages and all(p in nav for p in pages), pages


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 12_500
    for link in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / link).is_file(), link


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_the_site_builds_strict(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr
    assert (tmp_path / "site" / "reference" / "cli" / "index.html").is_file()
