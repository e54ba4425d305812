"""Experiment trackers: reports.Reporter subclasses that send what the training loop
reports (the same figures, at the same steps, as metrics.jsonl) to a tracker's store.

A new tracker is a module here with a Reporter subclass taking (run_dir, config), and one
line in TRACKERS. Trackers run on rank 0 only (the trainer gives other processes a silent
reporter) and must keep each step once across --resume.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from gptcli.errors import UsageError
from gptcli.reports import EvalReport, Reporter, StepReport

# --tracker NAME -> (module.Class, the extra that installs what it needs)
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("gptcli.trackers.tensorboard:TensorBoard", "tensorboard"),
    "mlflow": ("gptcli.trackers.mlflow:MLflow", "mlflow"),
    "wandb": ("gptcli.trackers.wandb:WandB", "wandb"),
}


def check_names(names: list[str]) -> None:
    for name in names:
        if name not in TRACKERS:
            raise UsageError(f"--tracker {name!r}: use {' or '.join(TRACKERS)}")


def make_trackers(
    names: list[str], run_dir: Path, config: dict[str, Any], create: bool = True
) -> list[Reporter]:
    """One reporter per --tracker; a missing package is a one-line error naming its extra.
    create: False on the processes that do not log (under torchrun, all but rank 0), which
    still check the packages, so that every process fails alike."""
    check_names(names)
    out = []
    for name in dict.fromkeys(names):  # once each
        target, extra = TRACKERS[name]
        module, cls = target.split(":")
        try:
            tracker = getattr(importlib.import_module(module), cls)
            if create:
                out.append(tracker(run_dir, config))
        except ImportError as e:
            needs = e.name or name
            raise UsageError(f"--tracker {name} needs {needs}: pip install 'gptcli[{extra}]'") from None
    return out


def step_scalars(r: StepReport) -> dict[str, float]:
    """A log step's figures under the names every tracker uses: train/loss, train/lr,
    train/muon_lr, train/grad_norm, train/tokens_per_s, train/mfu (those the step has)."""
    keys = ("loss", "lr", "muon_lr", "grad_norm", "tokens_per_s", "mfu")
    return {f"train/{k}": getattr(r, k) for k in keys if getattr(r, k) is not None}


def eval_scalars(r: EvalReport) -> dict[str, float]:
    """An evaluation's numbers: eval/val_loss, eval/train_loss, eval/val_bpb, ..., and
    eval/files/NAME/ppl, ... for each --eval-file."""
    values = {f"eval/{split}_{k}": v for split, m in r.metrics.items() for k, v in m.items()}
    values |= {
        f"eval/files/{label}/{k}": v
        for label, m in r.files.items()
        for k, v in m.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }
    return values
