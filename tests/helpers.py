"""What many test files share: running the CLI (in process or as a child), checking its
one-line errors, tiny corpora and models, and small file edits."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from gptcli.reports import Reporter

ROOT = Path(__file__).parents[1]

# flags for a model small enough to train in a second
TINY = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "8",
    "--max-iters", "30", "--eval-interval", "15", "--eval-iters", "2", "--log-interval", "5",
    "--device", "cpu", "--dtype", "fp32", "--warmup-iters", "3", "--lr", "3e-3",
]  # fmt: skip

# flags for a finetune that only has to run: two steps, one evaluation batch
QUICK_FINETUNE = [
    "--max-iters", "2", "--eval-interval", "2", "--eval-iters", "1", "--device", "cpu", "--batch-size", "4",
]  # fmt: skip

_runner = CliRunner()


def run(*args: object, input: str | None = None) -> Result:
    """gptcli in this process (arguments may be paths or numbers; input: its stdin)."""
    from gptcli.cli.app import app

    return _runner.invoke(app, [str(a) for a in args], input=input)


def gptcli(
    args: list[str], cwd: Path, procs: int = 1, through: Sequence[str] = (), **env: str
) -> subprocess.CompletedProcess:
    """gptcli in a child process (under torchrun with procs > 1), to its end; through: a
    command that runs it (its first arguments)."""
    # a process that dies of a signal prints its Python stack
    environ = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1", **env}
    if procs > 1:
        launcher = ["-m", "torch.distributed.run", f"--nproc_per_node={procs}", "--standalone"]
        cmd = [sys.executable, *launcher, "-m", "gptcli", *args]
    else:
        cmd = [*through, sys.executable, "-m", "gptcli", *args]
    return subprocess.run(cmd, cwd=cwd, env=environ, capture_output=True, text=True, errors="replace",
                          timeout=300, check=False)  # fmt: skip


def assert_refused_cold(args: list[str], start: str, cwd: Path) -> None:
    """gptcli args, on an empty decoding-kernel cache, refused in one line that begins with
    start, and the cache left empty (nothing was built for a command that could not run)."""
    cold = cwd / f"kernels-{args[0]}"
    result = gptcli(args, cwd, GPTCLI_KERNELS_DIR=str(cold))
    line = result.stderr.strip()
    assert result.returncode == 2 and line.startswith(start) and "\n" not in line, result.stderr
    assert not cold.exists() or not any(cold.iterdir())


def failure(result: subprocess.CompletedProcess) -> str:
    """What a failed child printed: the end of stdout, and both ends of stderr (under torchrun a
    process's own error comes before the launcher's long report of which rank failed)."""
    err = result.stderr
    if len(err) > 5000:
        err = err[:3000] + "\n[...]\n" + err[-2000:]
    return result.stdout[-1500:] + "\n" + err


def start(args: list[str], cwd: Path) -> subprocess.Popen:
    """gptcli in a child process, running on while the test reads its output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "gptcli", *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


# an exception's class name on screen tells a user nothing: every failure path is checked for one
CLASS_NAME = re.compile(r"\b[A-Z]\w*(Error|Exception|Panic\w*)\b")


def assert_usage_error(result: Result, *fragments: str, code: int = 2) -> str:
    """The command failed with one line on stderr holding every fragment, and no exception
    class name; returns it."""
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == code, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert "Traceback" not in result.output
    assert not CLASS_NAME.search(result.output), result.output
    for f in fragments:
        assert f in lines[0], (f, lines[0])
    return lines[0]


def make_corpus(path: Path, n_sentences: int = 400, seed: int = 0) -> Path:
    """Write a small grammatical corpus (deterministic) and return its path."""
    rng = random.Random(seed)
    animals = ["rabbit", "fox", "badger", "mole", "otter", "hedgehog"]
    verbs = ["dug", "found", "built", "left"]
    things = ["a hole", "a den", "a burrow", "a nest"]
    reasons = ["it needed shelter", "winter was coming", "it was tired", "the rain began"]
    lines = [
        f"The {rng.choice(animals)} {rng.choice(verbs)} {rng.choice(things)} because {rng.choice(reasons)}."
        for _ in range(n_sentences)
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# what each animal of make_corpus's grammar does, as a chat model is taught to answer it
ANSWERS = {
    "rabbit": "dug a hole", "fox": "dug a den", "badger": "built a burrow",
    "mole": "found a nest", "otter": "left a den", "hedgehog": "built a nest",
}  # fmt: skip


def make_conversations(path: Path, n: int = 300, seed: int = 0) -> Path:
    """Conversations in make_corpus's words (JSONL of {"messages"}): the user names an
    animal, the assistant says what it did; some open with a system message, some hold two
    exchanges."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        messages = [{"role": "system", "content": "be brief"}] if i % 3 == 0 else []
        for _ in range(1 + (i % 4 == 1)):
            animal = rng.choice(sorted(ANSWERS))
            messages += [
                {"role": "user", "content": f"the {animal}"},
                {"role": "assistant", "content": f"The {animal} {ANSWERS[animal]}."},
            ]
        rows.append(json.dumps({"messages": messages}))
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def checkpoint_meta(run_dir: Path, name: str = "last") -> dict[str, Any]:
    return json.loads((run_dir / name / "checkpoint.json").read_text())


def edit_json(path: Path, **changes: Any) -> None:
    """Set keys of a JSON file; a dotted key reaches into nested objects."""
    data = json.loads(path.read_text())
    for key, value in changes.items():
        target = data
        *parents, last = key.split(".")
        for p in parents:
            target = target[p]
        target[last] = value
    path.write_text(json.dumps(data))


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def dead_pid() -> int:
    """The pid of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def ours_from_hf(hf: Any) -> Any:
    """A gptcli GPT with the weights of a Hugging Face GPT2LMHeadModel."""
    from gptcli.config import ModelConfig
    from gptcli.model import GPT
    from gptcli.store.hf import hf_to_gptcli_state_dict

    c = hf.config
    cfg = ModelConfig(
        vocab_size=c.vocab_size, block_size=c.n_positions, n_layer=c.n_layer, n_head=c.n_head,
        n_embd=c.n_embd, dropout=0.0, bias=True,
    )  # fmt: skip
    model = GPT(cfg).eval()
    missing, unexpected = model.load_state_dict(hf_to_gptcli_state_dict(hf.state_dict()), strict=False)
    assert not unexpected and not missing, (missing, unexpected)
    return model


def chromium() -> str | None:
    """A headless browser to render the HTML pages with (.ci/run installs Debian's)."""
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def rendered_dom(page: Path, profile: Path) -> str:
    """The page's DOM after its script ran, as headless chromium leaves it (no network)."""
    cmd = [
        chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={profile}", "--dump-dom", page.as_uri(),
    ]  # fmt: skip
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False).stdout


class StopAt(Reporter):
    """Asks the trainer to stop after a given step, as Ctrl-C would."""

    def __init__(self, step: int) -> None:
        self.step, self.trainer = step, None

    def on_step(self, report) -> None:
        if report.step == self.step:
            self.trainer.request_stop()
