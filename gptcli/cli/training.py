"""What pretrain and finetune share: the training flags, the run directory, and running the
loop with the live view, the summary and loss.png."""

from __future__ import annotations

import time
from dataclasses import asdict, fields
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptcli.cli import figures, render
from gptcli.cli.common import command
from gptcli.config import TrainConfig
from gptcli.errors import UsageError
from gptcli.paths import RUNS_DIR

if TYPE_CHECKING:
    from gptcli.train import Trainer

MODEL, TRAIN, HARDWARE, RUN = "Model", "Training", "Hardware", "Run"

_TYPES = {int: int | None, float: float | None, str: str | None, bool: bool | None}


def opt(*names: str, help: str, panel: str = TRAIN, **kw: Any) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False, **kw)


def training_options(defaults: TrainConfig) -> SimpleNamespace:
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
        if "(default:" in text:  # the help says what the default means
            text, shown = text.split(" (default: ")[0], text.split(" (default: ")[1].rstrip(")")
        base = {"max_time": str, "grad_accum": int}.get(f.name) or type(value)
        panel = HARDWARE if f.name in ("device", "dtype", "compile", "fsdp", "seed") else TRAIN
        out[f.name] = Annotated[
            _TYPES[base], opt(*flag.split(" "), help=f"{text} (default: {shown}).", panel=panel)
        ]
    return SimpleNamespace(**out)


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


def train_flags(values: dict[str, Any]) -> dict[str, Any]:
    """The TrainConfig flags among a command's arguments (None = not given)."""
    return {
        f.name: values[f.name] for f in fields(TrainConfig) if f.metadata.get("flag") and f.name in values
    }


def new_run_dir(out: Path | None, stem: str) -> Path:
    """--out, or runs/<stem>-<timestamp>; never a directory that already holds something."""
    if out is None:
        out = RUNS_DIR / f"{stem or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(
            f"{out} already exists and is not empty; pass --resume to continue that run, "
            "or choose another --out"
        )
    return out


def run_trainer(trainer: Trainer, resume: bool, verb: str, json_out: bool = False) -> None:
    """Train with the live view, print the summary and loss.png; exit 130 with a resume hint
    if interrupted. json_out: progress as plain lines on stderr, the summary as JSON on stdout."""
    title = f"gptcli {verb} →"
    render.carry_on_without_output()
    reporter = render.TrainLog(title, render.err) if json_out else render.train_reporter(title)
    summary = trainer.run(resume=resume, reporter=reporter)
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
            f"Continue with: {command(verb, '--resume', '--out', trainer.run_dir)}"
        )
        raise typer.Exit(130)
    next_verb = "classify" if trainer.meta.get("task") in ("classify", "choice") else "sample"
    render.info(f"next: {command(next_verb, '--ckpt', trainer.run_dir)}")


def summary_json(summary: Any, loss_png: Path | None) -> dict[str, Any]:
    """A training Summary for --json."""
    data = asdict(summary)
    data["run_dir"] = str(summary.run_dir)
    data["checkpoints"] = {  # best/ exists only once an evaluation has run
        name: str(summary.run_dir / name) for name in ("best", "last") if (summary.run_dir / name).is_dir()
    }
    data["loss_png"] = str(loss_png) if loss_png else None
    return data


def prepare_text(
    corpus: list[Path], tokenizer: Any, val_fraction: float, explicit_tokenizer: bool = False
) -> tuple[Path, Any]:
    """A tokenized directory for the corpus, and its report: the directory given (made by
    `gptcli tokenize`), or raw text tokenized into the cache, reused when the same text and
    tokenizer come again. tokenizer: a spec (char, gpt2, bpe:N) or a Tokenizer."""
    from gptcli.data import cached_corpus, collect_files, is_tokenized_dir, read_meta

    if len(corpus) == 1 and corpus[0].is_dir() and is_tokenized_dir(corpus[0]):
        report = read_meta(corpus[0])
        wanted = tokenizer if isinstance(tokenizer, str) else tokenizer.name
        if (explicit_tokenizer or not isinstance(tokenizer, str)) and report.tokenizer != wanted.lower():
            raise UsageError(
                f"{corpus[0]} is tokenized with {report.tokenizer}, not {wanted}; drop --tokenizer, "
                "or tokenize the text again with: "
                f"{command('tokenize', 'TEXT', '--out', 'DIR', '-t', wanted)}"
            )
        return corpus[0], report
    total = sum(f.stat().st_size for f in collect_files(corpus))
    with render.byte_progress("tokenizing", total, show=total > 4 << 20) as update:
        data_dir, report = cached_corpus(corpus, tokenizer, val_fraction, update)
    verb = "reusing the cached tokens of" if report.reused else "tokenized"
    render.note(
        f"{verb} {len(report.files)} file(s): {report.tokens:,} {report.tokenizer} tokens ({data_dir})"
    )
    return data_dir, report


def load_for_resume(out: Path | None, flags: dict[str, Any], config_path: Path | None) -> tuple[Any, Any]:
    """The last/ checkpoint of the run to resume, and its config: the saved one, where the
    --config file and the flags may repeat its values, and change only what a resumed run
    may change."""
    from gptcli.checkpoint import LAST, checkpoint_in, load_checkpoint, newest_run
    from gptcli.config import Config, merge, read_yaml, resume_config

    if out is None:
        out = newest_run()
        if out is None:
            raise UsageError("--resume: no run under ./runs to continue; pass --out RUN_DIR")
        render.info(f"resuming the newest run: {out}")
    elif out.name in (LAST, "best") and out.parent.is_dir():
        out = out.parent  # --out RUN/last means the run
    found = checkpoint_in(out, LAST)
    if found is None:
        raise UsageError(f"--resume: {out} has no last/ checkpoint to continue from")
    loaded = load_checkpoint(found)
    if not isinstance(loaded.meta.get("config"), dict):
        raise UsageError(f"{loaded.path}/checkpoint.json has no run config; it cannot be resumed")
    saved = merge(Config(), loaded.meta["config"], f"{loaded.path}/checkpoint.json")
    given = [(read_yaml(config_path), str(config_path))] if config_path is not None else []
    config = resume_config(saved, [*given, (flags, "the command line")])
    loaded.model.train()
    return loaded, config


def same_data(meta: dict[str, Any], sha256: str, new_data: bool, what: str) -> dict[str, Any]:
    """Check that a resumed run gets the data it was trained on (by content hash), or, with
    --new-data, record the change; returns the metadata to save with the run."""
    saved = meta.get("data_sha256")
    if saved is None or saved == sha256:  # runs made before the hash was kept: take it as given
        return {"data_sha256": sha256}
    if not new_data:
        raise UsageError(
            f"{what} is not the data this run was trained on (content sha256 {sha256[:12]}, the run's "
            f"{saved[:12]}); give the run's data, or add --new-data to continue on this on purpose"
        )
    render.warning(f"continuing on new data ({what}); the run records the change at step {meta.get('step')}")
    change = {"step": meta.get("step"), "data_sha256": sha256, "previous": saved}
    return {"data_sha256": sha256, "data_changes": [*meta.get("data_changes", []), change]}
