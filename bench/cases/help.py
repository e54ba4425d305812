"""bench case: `gptcli --help` against the floor of a two-command Typer app on this machine."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench.common import Result, installed_env, scratch

MINIMAL_TYPER_APP = """
import typer
app = typer.Typer()
@app.command()
def a(x: int = 1):
    "A."
@app.command()
def b(y: int = 2):
    "B."
app()
"""


def run(args) -> list[Result]:
    """`gptcli --help` against the floor of any Typer CLI on this machine: a two-command
    Typer app's --help, interleaved, each after a warm-up run (bytecode cached:
    installed_env)."""
    exe = shutil.which("gptcli") or str(Path(sys.executable).parent / "gptcli")
    minimal = scratch() / "app.py"
    minimal.write_text(MINIMAL_TYPER_APP)

    def once(cmd: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True, env=installed_env())
        return time.perf_counter() - t0

    ours_cmd, floor_cmd = [exe, "--help"], [sys.executable, str(minimal), "--help"]
    once(ours_cmd), once(floor_cmd)
    ours, floor = [], []
    for _ in range(7):
        ours.append(once(ours_cmd))
        floor.append(once(floor_cmd))
    t, f = statistics.median(ours), statistics.median(floor)
    peer = "a two-command Typer app's --help"
    return [Result("`gptcli --help` wall time", t, f, "s", peer, "<= 0.3 s", t <= 0.3)]
