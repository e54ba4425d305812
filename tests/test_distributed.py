"""torchrun: two CPU processes (gloo) train exactly like one process with the same global
batch, and only rank 0 writes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import make_corpus

ROOT = Path(__file__).parents[1]
TINY = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "8",
    "--eval-interval", "10", "--eval-iters", "2", "--log-interval", "1", "--device", "cpu",
    "--dtype", "fp32", "--warmup-iters", "3", "--lr", "3e-3", "--grad-accum", "2",
]  # fmt: skip


def gptcli(args: list[str], cwd: Path, procs: int = 1) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", "--standalone"]
    cmd = [*launcher, "-m", "gptcli", *args] if procs > 1 else [sys.executable, "-m", "gptcli", *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ddp")
    make_corpus(tmp / "c.txt", n_sentences=400)
    for name, procs in (("single", 1), ("ddp", 2)):
        result = gptcli(["pretrain", "c.txt", "--out", name, *TINY, "--max-iters", "20"], tmp, procs)
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return tmp


def test_two_processes_follow_the_single_process_trajectory(runs):
    single, ddp = records(runs / "single"), records(runs / "ddp")
    assert [(r["kind"], r["step"]) for r in single] == [(r["kind"], r["step"]) for r in ddp]
    for a, b in zip(single, ddp, strict=True):
        key = "loss" if a["kind"] == "train" else "val_loss"
        assert a[key] == pytest.approx(b[key], abs=1e-5), a["step"]
        if a["kind"] == "train":
            assert a["tokens"] == b["tokens"]  # the global batch: 8 x 2 micro-steps x 16 tokens


def test_only_rank_zero_writes(runs):
    dirs = sorted(p.name for p in runs.iterdir() if p.is_dir() and p.name != "cache")
    assert dirs == ["ddp", "single"]  # one run dir for the two processes
    assert sorted(p.name for p in (runs / "ddp").iterdir()) == [
        "best",
        "config.yaml",
        "last",
        "loss.png",
        "metrics.jsonl",
    ]
    state = json.loads((runs / "ddp" / "last" / "train_state.json").read_text())
    assert state["world"] == 2 and len(state["torch_rng"]) == 2  # each rank's RNG, for exact resume


def test_resume_needs_the_same_number_of_processes(runs):
    again = gptcli(["pretrain", "--resume", "--out", "ddp", "--max-iters", "25"], runs, procs=2)
    assert again.returncode == 0, again.stderr[-2000:]
    assert [r["step"] for r in records(runs / "ddp") if r["kind"] == "train"] == list(range(1, 26))
    alone = gptcli(["pretrain", "--resume", "--out", "ddp", "--max-iters", "30"], runs)
    assert alone.returncode == 2
    assert "trained by 2 process(es); resume it with the same number (now 1)" in alone.stderr


def test_other_ranks_leave_the_run_directory_alone(tmp_path, monkeypatch):
    """Ranks other than 0 finish training without writing loss.png (or anything else)."""
    from types import SimpleNamespace

    from gptcli.cli import figures, training

    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 1.0}\n')
    calls = []
    monkeypatch.setattr(figures, "save_loss_png", lambda *a: calls.append(a) or True)
    summary = SimpleNamespace(stop_reason="max_iters", steps=1)
    monkeypatch.setattr(training.render, "train_summary", lambda s, png: calls.append(("summary", png)))
    for rank in (1, 0):
        trainer = SimpleNamespace(
            dist=SimpleNamespace(is_main=rank == 0), run_dir=tmp_path, meta={}, run=lambda resume: summary
        )
        training.run_trainer(trainer, resume=False, verb="pretrain")
    assert calls[0] == ("summary", None)  # rank 1: no figure
    assert calls[1][1] == tmp_path / "loss.png" and calls[2] == ("summary", str(tmp_path / "loss.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize(("rank", "printed"), [("0", '{"steps": 1}\n'), ("1", "")])
def test_only_rank_zero_prints_json(rank, printed):
    """--json under torchrun: one summary on stdout, not one per process."""
    code = "from gptcli.cli import render; render.print_json({'steps': 1})"
    env = {**os.environ, "RANK": rank}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout == printed
