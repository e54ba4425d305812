"""What pretrain and finetune share: the training flags, the run directory, and running the
loop with the live view, the summary and loss.png."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptcli.cli import figures, render
from gptcli.config import TrainConfig
from gptcli.messages import command_line

if TYPE_CHECKING:
    from gptcli.train.trainer import Trainer

MODEL, TRAIN, HARDWARE, RUN = "Model", "Training", "Hardware", "Run"

_TYPES = {int: int | None, float: float | None, str: str | None, bool: bool | None, list: list[str] | None}


def opt(*names: str, help: str, panel: str = TRAIN, **kw: Any) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False, **kw)


def _field_default(f: Any) -> Any:
    return f.default_factory() if f.default is MISSING else f.default


def training_options(defaults: TrainConfig) -> dict[str, Any]:
    """Annotated option types for the TrainConfig flags, their help showing these defaults
    (flags default to None: "not given", so a YAML value is not overridden)."""
    out = {}
    for f in fields(TrainConfig):
        flag, text = f.metadata.get("flag"), f.metadata.get("help")
        if not flag or not text:
            continue
        value = getattr(defaults, f.name)
        shown = (
            "off"
            if value is None or value is False
            else ("on" if value is True else f"{value:g}" if isinstance(value, float) else value)
        )
        if "(default:" in text:  # the help says what the field's default means
            text, meaning = text.split(" (default: ")[0], text.split(" (default: ")[1].rstrip(")")
            shown = meaning if value == _field_default(f) else shown
        typed = {"max_time": str, "dist_timeout": str, "grad_accum": int, "optimizer": str}
        base = typed.get(f.name) or type(value)
        panel = HARDWARE if f.name in ("device", "dtype", "compile", "fsdp", "seed") else TRAIN
        out[f.name] = Annotated[
            _TYPES[base], opt(*flag.split(" "), help=f"{text} (default: {shown}).", panel=panel)
        ]
    return out


def with_training_flags(defaults: TrainConfig) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command a flag for every TrainConfig field that has one, with help showing
    these defaults: written out once, from the fields' metadata, for pretrain and finetune
    alike. The command receives them together as `train_flags` ({name: value}, None where
    not given)."""
    options = training_options(defaults)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "train_flags"]
        added = [inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=a)
                 for n, a in options.items()]  # fmt: skip

        @functools.wraps(command)
        def with_flags(**kwargs: Any) -> Any:
            train = {name: kwargs.pop(name) for name in options}
            return command(**kwargs, train_flags=train)

        with_flags.__signature__ = signature.replace(parameters=[*own, *added])  # type: ignore[attr-defined]
        return with_flags

    return decorate


Config = Annotated[Path | None, opt("--config", "-c", help="YAML config (see examples/configs).", panel=RUN)]
Resume = Annotated[
    bool, opt("--resume", help="Continue the run in --out (default: the newest run) exactly.", panel=RUN)
]
NewData = Annotated[
    bool,
    opt(
        "--new-data",
        help="With --resume: continue on data other than the run's, on purpose (the run records it).",
        panel=RUN,
    ),
]
JsonSummary = Annotated[
    bool, opt("--json", help="Print the run's summary as JSON (progress lines go to stderr).", panel=RUN)
]


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
    next_verb = "classify" if trainer.meta.get("task") in ("classify", "choice") else "sample"
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
