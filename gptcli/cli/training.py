"""What pretrain and finetune share: running the loop with the live view, the summary and
loss.png. Their flags are declared in gptcli/config (verbs.py and run.py's sections)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from gptcli.cli import figures, render
from gptcli.cli.declare import Overrides, override_parameters
from gptcli.config import TRAIN, TrainConfig
from gptcli.messages import command_line

if TYPE_CHECKING:
    from gptcli.train.trainer import Trainer


def training_options(defaults: TrainConfig) -> dict[str, Any]:
    """The TrainConfig flags as Typer annotations, their help showing these defaults
    (pretrain's or finetune's)."""
    params = override_parameters(Overrides("train", TrainConfig, defaults=defaults, panel=TRAIN))
    return {p.name: p.annotation for p in params}


def run_trainer(trainer: Trainer, resume: bool, verb: str, json_out: bool = False) -> None:
    """Train with the live view, print the summary and loss.png; exit 130 with a resume hint
    if interrupted. json_out: progress as plain lines on stderr, the summary as JSON on stdout."""
    title = f"gptcli {verb} →"
    render.carry_on_without_output()
    from gptcli.reports import Reporters
    from gptcli.trackers import make_trackers

    view = render.TrainLog(title, render.err) if json_out else render.train_reporter(title)
    config = trainer.config
    trackers = make_trackers(config.train.trackers, trainer.run_dir, config.to_dict(), trainer.dist.is_main)
    summary = trainer.run(resume=resume, reporter=Reporters(view, *trackers))
    png = trainer.run_dir / "loss.png"
    # only the main process writes to the run directory
    saved = trainer.dist.is_main and figures.save_loss_png(trainer.run_dir / "metrics.jsonl", png)
    if json_out:
        render.print_json(summary_json(summary, png if saved else None))
    else:
        render.train_summary(summary, str(png) if saved else None)
    if summary.stop_reason in ("interrupted", "terminated"):
        render.warning(
            f"stopped at step {summary.steps}; the last checkpoint is saved. "
            f"Continue with: {command_line(verb, '--resume', '--out', trainer.run_dir)}"
        )
        raise typer.Exit(130)
    next_verb = {"classify": "classify", "choice": "classify", "chat": "chat"}.get(
        trainer.meta.get("task"), "sample"
    )
    render.info(f"next: {command_line(next_verb, '--ckpt', trainer.run_dir)}")


def summary_json(summary: Any, loss_png: Path | None) -> dict[str, Any]:
    """A training Summary for --json."""
    data = asdict(summary)
    data["run_dir"] = str(summary.run_dir)
    data["checkpoints"] = {  # best/ exists only once an evaluation has run
        name: str(summary.run_dir / name) for name in ("best", "last") if (summary.run_dir / name).is_dir()
    }
    data["loss_png"] = str(loss_png) if loss_png else None
    return data
