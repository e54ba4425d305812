"""The rooms of the architecture (README, Architecture) hold: what each may import."""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.helpers import ROOT

PKG = ROOT / "gptcli"


def imported(path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def test_only_the_cli_knows_rich_and_typer_and_only_render_draws():
    for path in PKG.rglob("*.py"):
        tops = {n.split(".")[0] for n in imported(path)}
        where = path.relative_to(PKG).as_posix()
        if not where.startswith("cli/"):
            assert not tops & {"rich", "typer"}, where
            assert "print(" not in path.read_text(), where  # the core reports, it does not print
        elif not where.startswith("cli/render/"):
            assert "rich" not in tops, where


def test_reports_and_the_cli_entry_import_no_torch():
    code = "import sys, gptcli.reports, gptcli.cli.app; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_checkpoint_and_hf_do_not_import_each_other():
    assert "gptcli.store.hf" not in imported(PKG / "store" / "checkpoint.py")
    assert "gptcli.store.checkpoint" not in imported(PKG / "store" / "hf.py")


def test_only_public_modules_of_libraries_are_imported():
    """No private module of a library (typer._click, torch.distributed._composable, ...): a
    user's environment may hold another version of it, where private modules move."""
    for path in PKG.rglob("*.py"):
        for name in imported(path):
            parts = name.split(".")
            private = [p for p in parts[1:] if p.startswith("_") and not p.startswith("__")]
            assert parts[0] == "gptcli" or not private, f"{path.relative_to(PKG)} imports {name}"
