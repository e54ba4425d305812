"""bench case: nanoGPT's CPU shakespeare_char run, then gptcli's given the same wall time."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.common import ROOT, Result, scratch


def run(args) -> list[Result]:
    """nanoGPT's CPU shakespeare_char run, then gptcli's with the same config given the
    same wall time; both scored on the whole val split of the same text."""
    if not args.nanogpt or not args.corpus:
        return [
            Result(
                "val loss at equal wall time",
                float("nan"),
                None,
                "",
                "nanoGPT",
                "lower",
                None,
                ["skipped: needs --nanogpt DIR and --corpus tinyshakespeare.txt"],
            )
        ]
    from bench.val_loss import full_val_loss, nanogpt_model
    from gptcli.data.corpus import load_split, tokenize_corpus
    from gptcli.store.checkpoint import load_checkpoint

    work = scratch("gptcli-bench-")
    wall = _nanogpt(args, work / "nanogpt")
    tok_dir = work / "tokens"
    tokenize_corpus([args.corpus], tok_dir, "char")
    val = load_split(tok_dir, "val")
    theirs = full_val_loss(nanogpt_model(work / "nanogpt" / "ckpt.pt"), val)
    _gptcli(tok_dir, work / "ours", wall)
    loaded = load_checkpoint(work / "ours" / "last")
    ours = full_val_loss(loaded.model, val)
    steps = loaded.meta["step"]
    return [
        Result(
            "val loss, shakespeare-char-cpu.yaml, equal wall time",
            ours,
            theirs,
            "val loss",
            "nanoGPT (2000 iters)",
            "lower",
            ours < theirs,
            [f"wall time {wall:.0f} s each; gptcli ran {steps} steps in it; whole val split scored"],
        )
    ]


def _nanogpt(args, out: Path) -> float:
    """nanoGPT's train.py on its shakespeare_char CPU settings; its wall time."""
    data = args.nanogpt / "data" / "shakespeare_char"
    shutil.copy(args.corpus, data / "input.txt")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    cmd = [
        sys.executable, "train.py", "config/train_shakespeare_char.py", "--device=cpu", "--compile=False",
        "--eval_iters=20", "--log_interval=1", "--block_size=64", "--batch_size=12", "--n_layer=4",
        "--n_head=4", "--n_embd=128", "--max_iters=2000", "--lr_decay_iters=2000", "--dropout=0.0",
        f"--out_dir={out}",
    ]  # fmt: skip
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=args.nanogpt, check=True, capture_output=True)
    return time.perf_counter() - t0


def _gptcli(tok_dir: Path, run: Path, wall: float) -> None:
    """gptcli pretrain on the same config, given the same wall time."""
    cmd = [
        sys.executable, "-m", "gptcli", "pretrain", str(tok_dir), "-c",
        str(ROOT / "examples" / "configs" / "shakespeare-char-cpu.yaml"), "--out", str(run),
        "--max-time", f"{wall:.1f}", "--max-iters", "100000",
        "--optimizer", "adamw",  # nanoGPT's optimizer: this case measures the loop (muon: Muon's gain)
    ]  # fmt: skip
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
