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


# what `gptcli --help` need not wait for: torch (seconds), and what the verbs use only once
# they run (PyYAML, Rich's progress bars, hashlib and socket: about 35 ms of its 0.2 to 0.4 s)
NOT_AT_START = ("torch", "yaml", "rich.progress", "hashlib", "socket")


def test_reports_and_the_cli_entry_import_no_torch_nor_what_only_running_verbs_need():
    code = (
        f"import sys, gptcli.reports, gptcli.cli.app; print([m for m in {NOT_AT_START} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


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


# Who may import whom, room by room (a room is a package under gptcli/, or a top-level module):
# data flows one way, CLI -> config -> core -> reports -> render. A room not listed imports
# only the base rooms.
BASE = {"errors", "messages", "paths", "reports", "files", "cpuinfo", "__version__"}
MAY_IMPORT: dict[str, set[str]] = {
    "config": {"data", "trackers"},  # data.inputs to read a file; trackers' names to check --tracker
    "data": set(),
    "model": {"config"},
    "lora": {"config"},
    "runtime": set(),
    "store": {"config", "data", "model", "lora"},
    "tasks": {"config", "data", "model"},
    "infer": {"config", "data", "model"},
    "inspect": {"config", "data", "model"},
    "evals": {"config", "data", "model", "tasks"},
    "trackers": {"data"},
    "train": {"config", "data", "model", "lora", "runtime", "store", "tasks", "infer", "evals"},
    "cli": {
        "config",
        "data",
        "model",
        "lora",
        "runtime",
        "store",
        "tasks",
        "infer",
        "inspect",
        "evals",
        "trackers",
        "train",
    },
}


def _room(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "gptcli"


def _imports(path) -> set[str]:
    """Every gptcli module a file imports, at its top or inside a function."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("gptcli")
            and node.level == 0
        ):
            out |= {f"gptcli.{a.name}" for a in node.names} if node.module == "gptcli" else {node.module}
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("gptcli")}
    return out


def test_each_room_imports_only_the_rooms_below_it():
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        room = rel.parts[0]
        if room in ("__init__", "__main__"):
            continue
        allowed = BASE | MAY_IMPORT.get(room, set()) | {room}
        for module in _imports(path):
            assert _room(module) in allowed, f"{rel} imports {module}"


def test_no_import_circle_between_modules():
    """Module by module (imports inside functions included), no module reaches itself."""
    graph = {}
    for path in PKG.rglob("*.py"):
        rel = path.relative_to(PKG).with_suffix("")
        name = ".".join(("gptcli", *rel.parts)).removesuffix(".__init__")
        graph[name] = {m for m in _imports(path) if m != name}
    graph = {k: {m for m in v if m in graph} for k, v in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if nxt.startswith(node + "."):  # a package importing its own modules (its face)
                continue
            assert state.get(nxt) != 1, " -> ".join([*path, node, nxt])
            if nxt not in state:
                visit(nxt, [*path, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])


def test_every_file_the_package_reads_at_run_time_is_in_its_wheel():
    """A file under gptcli/ that is not Python (the attention page, the C decoding step) is
    shipped only if pyproject's package-data names it: each must match a pattern there."""
    import fnmatch

    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((PKG.parent / "pyproject.toml").read_text())
    declared = pyproject["tool"]["setuptools"]["package-data"]
    for path in PKG.rglob("*"):
        if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
            continue
        package = ".".join(path.parent.relative_to(PKG.parent).parts)
        assert any(fnmatch.fnmatch(path.name, p) for p in declared.get(package, [])), (
            f"{path.relative_to(PKG.parent)} is not in [tool.setuptools.package-data]"
        )
