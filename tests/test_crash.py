"""Interruptions and crashes: Ctrl-C and SIGTERM save and say how to resume, kill -9 loses
nothing but the steps since the last checkpoint, one training per run dir, NaN stops
training without touching the last good checkpoint."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from gptcli.errors import UsageError
from gptcli.files import publish_dir
from gptcli.store.checkpoint import LAST, RunLock, load_checkpoint, resolve_checkpoint
from tests.helpers import gptcli, make_corpus, start

TINY = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "8",
    "--eval-interval", "10", "--eval-iters", "2", "--log-interval", "1", "--device", "cpu",
    "--dtype", "fp32", "--warmup-iters", "3", "--lr", "3e-3",
]  # fmt: skip


def wait_for(proc: subprocess.Popen, marker: str, timeout: float = 120) -> list[str]:
    """Read the process's output until a line contains marker."""
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if marker in line:
            return lines
    proc.kill()
    raise AssertionError(f"never saw {marker!r}: {''.join(lines)[-2000:]}")


def train_steps(run_dir: Path, kind: str = "train") -> list[int]:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in records if r["kind"] == kind]


@pytest.fixture
def work(tmp_path) -> Path:
    make_corpus(tmp_path / "c.txt", n_sentences=400)
    return tmp_path


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_saves_and_says_how_to_resume(work, sig):
    proc = start(["pretrain", "c.txt", "--out", "run", *TINY, "--max-iters", "100000"], work)
    wait_for(proc, "eval step 10:")
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Continue with: gptcli pretrain --resume --out run" in err
    stopped = load_checkpoint(work / "run" / LAST).meta["step"]
    assert stopped >= 10 and "training stopped" in out
    evaluated = max(train_steps(work / "run", "eval"))  # the losses shown are from there
    assert f"{'final' if evaluated == stopped else f'step {evaluated}'} eval train / val" in out
    assert not (work / "run" / ".lock").exists()

    again = gptcli(["pretrain", "--resume", "--out", "run", "--max-iters", str(stopped + 5)], work)
    assert again.returncode == 0, again.stderr
    assert "final eval train / val" in again.stdout  # the last step is evaluated
    assert train_steps(work / "run") == list(range(1, stopped + 6))


def test_kill_9_leaves_a_loadable_checkpoint_and_resume_fills_the_gap(work):
    proc = start(["pretrain", "c.txt", "--out", "run", *TINY, "--max-iters", "100000"], work)
    wait_for(proc, "eval step 20:")
    wait_for(proc, "step 25/")  # past the checkpoint: these steps are lost with the process
    proc.kill()
    proc.wait(timeout=60)
    last = load_checkpoint(work / "run" / LAST)  # loadable after SIGKILL
    assert last.meta["step"] in (20, 30)
    assert (work / "run" / ".lock").exists()  # left behind by the killed process ...

    again = gptcli(["pretrain", "--resume", "--out", "run", "--max-iters", "40"], work)
    assert again.returncode == 0, again.stderr  # ... and taken over, since it is dead
    assert train_steps(work / "run") == list(range(1, 41))  # nothing missing, nothing twice
    assert train_steps(work / "run", "eval") == [0, 10, 20, 30, 40]
    assert load_checkpoint(work / "run" / LAST).meta["step"] == 40


def test_a_second_training_in_the_same_run_dir_is_refused(work):
    proc = start(["pretrain", "c.txt", "--out", "run", *TINY, "--max-iters", "100000"], work)
    try:
        wait_for(proc, "eval step 10:")
        second = gptcli(["pretrain", "--resume", "--out", "run"], work)
        assert second.returncode == 2
        assert f"is being trained by process {proc.pid} on" in second.stderr
    finally:
        proc.kill()
        proc.wait(timeout=60)


def test_stale_and_live_locks(tmp_path):
    lock = tmp_path / "run" / ".lock"
    lock.parent.mkdir()
    import socket

    lock.write_text(json.dumps({"pid": 2**22 + 12345, "host": socket.gethostname(), "started": "then"}))
    with RunLock(tmp_path / "run"):  # a dead pid: taken over
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with (
            pytest.raises(UsageError, match=f"being trained by process {os.getpid()}"),
            RunLock(tmp_path / "run"),
        ):
            pass
    assert not lock.exists()


def test_nan_stops_training_and_keeps_the_last_good_checkpoint(work):
    bad = [
        *TINY,
        "--lr",
        "1e30",
        "--min-lr",
        "0",
        "--warmup-iters",
        "0",
        "--grad-clip",
        "0",
        "--max-iters",
        "50",
    ]
    result = gptcli(["pretrain", "c.txt", "--out", "run", *bad], work)
    assert result.returncode == 1
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: training diverged at step ") and "Lower --lr" in line and "fp32" in line
    for name in ("last", "best"):
        ckpt = load_checkpoint(work / "run" / name)
        assert ckpt.meta["step"] == 0
        assert all(torch.isfinite(p).all() for p in ckpt.model.parameters())


def test_an_interrupted_publish_is_recovered_from_the_old_copy(tmp_path, trained, monkeypatch):
    import shutil

    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    new = tmp_path / "run" / ".last.tmp"
    shutil.copytree(run_dir / LAST, new)
    real_rename = os.rename
    calls = []

    def crash_on_second_rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise KeyboardInterrupt  # the power goes out between the two renames
        real_rename(src, dst)

    monkeypatch.setattr(os, "rename", crash_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        publish_dir(new, run_dir / LAST)
    monkeypatch.undo()
    assert not (run_dir / LAST).exists() and (run_dir / "last.old").exists()
    assert resolve_checkpoint(run_dir).name in ("best", "last.old")
    assert load_checkpoint(run_dir / "last.old").meta["step"] == load_checkpoint(trained / LAST).meta["step"]


def test_resume_after_a_crash_between_the_renames(work):
    first = gptcli(["pretrain", "c.txt", "--out", "run", *TINY, "--max-iters", "10"], work)
    assert first.returncode == 0, first.stderr
    os.rename(work / "run" / "last", work / "run" / "last.old")  # the state such a crash leaves
    again = gptcli(["pretrain", "--resume", "--out", "run", "--max-iters", "15"], work)
    assert again.returncode == 0, again.stderr
    assert train_steps(work / "run") == list(range(1, 16))
    assert load_checkpoint(work / "run" / LAST).meta["step"] == 15
