"""Every example on the project's pages is run: the tour of README.md, then of the docs
pages in mkdocs.yml's nav order, replayed on a fresh clone as a newcomer would type it.

Each line of a fenced block that starts with `$ ` is a command (continuation lines ending
in a backslash are joined); the lines under it, up to the next command or the block's
end, are what the page shows it printing. A command passes when every figure shown is
printed (integers and text exactly, a decimal within 3% or 0.005: other CPUs' kernels move
the last digits; lines about time, speed, MFU or percentages are not compared), a block
that shows only words prints one of its first lines, and a command shown without output
exits 0. `make demo` creates .venv; its bin goes first on PATH, as activating it would.

    python tests/tour.py            # from the project's root: replays HEAD, a few minutes
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

TIMING = re.compile(
    r"tok/s|tokens/s|MB/s|it/s|\btime\b|\bspeed\b|elapsed|\d:\d\d|\d s\b|\d\s?ms\b|MFU|%|ETA|left", re.I
)
NUMBER = re.compile(r"\d+\.\d{3,}|\d{2,}")


@dataclass
class Step:
    page: str
    command: str
    shown: list[str]


def pages(root: Path) -> list[Path]:
    """README.md, then the docs pages in mkdocs.yml's nav order."""
    out = [root / "README.md"]
    nav = root / "mkdocs.yml"
    if nav.is_file():
        names = re.findall(r"([\w./-]+\.md)\b", nav.read_text(encoding="utf-8"))
        out += [root / "docs" / n for n in names if (root / "docs" / n).is_file()]
    return out


def steps(page: Path) -> list[Step]:
    """The `$ ` commands of a page's fenced blocks, with what the page shows under each."""
    out: list[Step] = []
    block, command, shown, more = False, None, [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            if block and command:
                out.append(Step(page.name, command, shown))
            block, command, shown, more = not block, None, [], False
        elif not block:
            continue
        elif more:
            command = f"{command} {line.strip().rstrip(chr(92)).strip()}"
            more = line.rstrip().endswith("\\")
        elif line.startswith("$ "):
            if command:
                out.append(Step(page.name, command, shown))
            command, shown = line[2:].strip(), []
            more = command.endswith("\\")
            command = command.rstrip("\\").strip()
        elif command:
            shown.append(line)
    return out


def printed(figure: str, output: str, rel: float = 0.03, absolute: float = 0.005) -> bool:
    if figure in output:
        return True
    if "." not in figure:
        return False
    x = float(figure)
    return any(abs(float(g) - x) <= max(rel * abs(x), absolute) for g in re.findall(r"\d+\.\d+", output))


def missing(step: Step, output: str, code: int | str) -> list[str]:
    """What the page shows that the command did not print (empty: it reproduces)."""
    want = [n for line in step.shown if not TIMING.search(line) for n in NUMBER.findall(line)]
    lost = [n for n in want if not printed(n, output)]
    words = [ln.strip() for ln in step.shown if ln.strip() and ln.strip() != "..." and not NUMBER.search(ln)]
    if not want and words and not any(w[:30] in output for w in words[:3]):
        lost = [words[0][:30]]
    if code == "timeout" or "command not found" in output or (not step.shown and code != 0):
        lost = lost or [f"exit {code}"]
    return lost


def replay(root: Path, out=sys.stdout) -> list[tuple[Step, list[str], int | str]]:
    """Clone root's HEAD, run every step in order there; (step, what it did not print, its
    exit status) each."""
    results = []
    with tempfile.TemporaryDirectory(prefix="gptcli-tour-") as tmp:
        clone = Path(tmp) / "clone"
        subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
        env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "PYTHONUNBUFFERED": "1"}
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{clone / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"
        for step in [s for page in pages(clone) for s in steps(page)]:
            try:
                done = subprocess.run(["bash", "-c", step.command], cwd=clone, capture_output=True, text=True,
                                      timeout=900, env=env, check=False)  # fmt: skip
                output, code = done.stdout + done.stderr, done.returncode
            except subprocess.TimeoutExpired:
                output, code = "", "timeout"
            lost = missing(step, output, code)
            results.append((step, lost, code))
            print(
                ("ok    " if not lost else "DIFF  ") + f"{step.page}: {step.command[:90]}",
                file=out,
                flush=True,
            )
            if lost:
                print(f"      not printed: {lost[:6]}", file=out)
                print("      printed: " + " | ".join(output.strip().splitlines()[:4])[:300], file=out)
    return results


def native_bf16() -> bool:
    """Whether this CPU trains the demo in bf16, as the CPU the pages were printed on does
    (gptcli.cpuinfo.cpu_bf16_feature's flags; read here, where gptcli may not be importable)."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return False
    return bool({"amx_bf16", "avx512_bf16", "bf16"} & flags)


def model_says(step: Step, code: int | str) -> bool:
    """Whether what a step prints is the model's own: it reads a checkpoint and succeeds
    (a chat's reply, a sample; an error message is the program's, and still compared)."""
    return "--ckpt" in step.command and code == 0


def failures(results: list[tuple[Step, list[str], int | str]], figures_expected: bool) -> int:
    """The steps that fail the tour: any that lost something; where the figures are not
    expected (a CPU that trains the demo in fp32, a slightly different model), only those
    that lost more than figures and the model's words (an exit status, a timeout, the
    program's own words)."""
    if figures_expected:
        return sum(bool(lost) for _, lost, _ in results)
    return sum(
        not model_says(step, code) and any(not NUMBER.fullmatch(x) for x in lost)
        for step, lost, code in results
    )


if __name__ == "__main__":
    results = replay(Path(__file__).resolve().parents[1])
    differ = sum(bool(lost) for _, lost, _ in results)
    print(f"{len(results) - differ}/{len(results)} tour commands print what the pages show")
    bf16 = native_bf16()
    failed = failures(results, bf16)
    if differ and not bf16:
        print(
            "(no native bf16 here: the demo trains in fp32, so the pages' figures and the model's "
            "words are not expected; "
            f"{failed} command{'s' if failed != 1 else ''} failed otherwise)"
        )
    sys.exit(1 if failed else 0)
