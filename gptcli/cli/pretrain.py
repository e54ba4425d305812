"""`gptcli pretrain`: train a GPT from scratch on text, with a live loss curve."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptcli.cli import figures, render
from gptcli.errors import UsageError

if TYPE_CHECKING:
    from gptcli.config import Config
    from gptcli.train import Trainer

_MODEL, _TRAIN, _HW, _RUN = "Model", "Training", "Hardware", "Run"


def _opt(*names: str, help: str, panel: str = _TRAIN, **kw: Any) -> Any:
    return typer.Option(*names, help=help, rich_help_panel=panel, show_default=False, **kw)


def pretrain(
    corpus: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Text files, directories of them, or a directory made by `gptcli tokenize`.",
            show_default=False,
        ),
    ] = None,
    config: Annotated[
        Path | None, _opt("--config", "-c", help="YAML config (see examples/configs).", panel=_RUN)
    ] = None,
    out: Annotated[
        Path | None, _opt("--out", "-o", help="Run directory (default: runs/<corpus>-<time>).", panel=_RUN)
    ] = None,
    resume: Annotated[
        bool,
        _opt("--resume", help="Continue the run in --out (default: the newest run) exactly.", panel=_RUN),
    ] = False,
    tokenizer: Annotated[
        str | None, _opt("--tokenizer", "-t", help="char, gpt2 or bpe:N (default: char).", panel=_RUN)
    ] = None,
    n_layer: Annotated[
        int | None, _opt("--n-layer", help="Transformer blocks (default: 6).", panel=_MODEL)
    ] = None,
    n_head: Annotated[
        int | None, _opt("--n-head", help="Attention heads per block (default: 6).", panel=_MODEL)
    ] = None,
    n_embd: Annotated[int | None, _opt("--n-embd", help="Model width (default: 384).", panel=_MODEL)] = None,
    block_size: Annotated[
        int | None, _opt("--block-size", help="Context length in tokens (default: 256).", panel=_MODEL)
    ] = None,
    dropout: Annotated[
        float | None, _opt("--dropout", help="Dropout probability (default: 0).", panel=_MODEL)
    ] = None,
    bias: Annotated[
        bool | None,
        _opt("--bias/--no-bias", help="Biases in Linear and LayerNorm (default: bias).", panel=_MODEL),
    ] = None,
    batch_size: Annotated[
        int | None, _opt("--batch-size", help="Sequences per micro-step (default: 12).")
    ] = None,
    grad_accum: Annotated[
        int | None, _opt("--grad-accum", help="Micro-steps per optimizer step (default: 1).")
    ] = None,
    lr: Annotated[float | None, _opt("--lr", help="Peak learning rate (default: 1e-3).")] = None,
    min_lr: Annotated[
        float | None, _opt("--min-lr", help="Learning rate at the end of the cosine (default: 1e-4).")
    ] = None,
    warmup_iters: Annotated[
        int | None, _opt("--warmup-iters", help="Linear warmup steps (default: 100).")
    ] = None,
    max_iters: Annotated[int | None, _opt("--max-iters", help="Optimizer steps (default: 2000).")] = None,
    max_time: Annotated[
        str | None, _opt("--max-time", help="Wall-clock budget, e.g. 90s, 15m, 2h; the LR schedule fits it.")
    ] = None,
    weight_decay: Annotated[
        float | None, _opt("--weight-decay", help="AdamW weight decay on matrices (default: 0.1).")
    ] = None,
    grad_clip: Annotated[
        float | None, _opt("--grad-clip", help="Max gradient norm, 0 = off (default: 1.0).")
    ] = None,
    eval_interval: Annotated[
        int | None, _opt("--eval-interval", help="Steps between evals/checkpoints (default: 250).")
    ] = None,
    eval_iters: Annotated[
        int | None, _opt("--eval-iters", help="Batches per evaluation (default: 20).")
    ] = None,
    log_interval: Annotated[
        int | None, _opt("--log-interval", help="Steps between log lines (default: 10).")
    ] = None,
    device: Annotated[
        str | None, _opt("--device", help="auto | cpu | cuda | cuda:N | mps (default: auto).", panel=_HW)
    ] = None,
    dtype: Annotated[
        str | None, _opt("--dtype", help="auto | fp32 | bf16 | fp16 (default: auto).", panel=_HW)
    ] = None,
    compile: Annotated[
        bool | None, _opt("--compile/--no-compile", help="torch.compile the model (default: off).", panel=_HW)
    ] = None,
    seed: Annotated[int | None, _opt("--seed", help="Random seed (default: 1337).", panel=_HW)] = None,
) -> None:
    """Train a GPT from scratch: live loss curve, checkpoints, exact resume.

    gptcli pretrain corpus.txt                                   char-level, defaults
    gptcli pretrain input.txt -c examples/configs/shakespeare-char-cpu.yaml
    gptcli pretrain books/ -t bpe:8192 --max-time 30m
    gptcli pretrain --resume --out runs/books-20260101-120000
    """
    from gptcli.config import flag_overrides

    flags = flag_overrides(
        tokenizer=tokenizer, n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size,
        dropout=dropout, bias=bias, batch_size=batch_size, grad_accum=grad_accum, lr=lr, min_lr=min_lr,
        warmup_iters=warmup_iters, max_iters=max_iters, max_time=max_time, weight_decay=weight_decay,
        grad_clip=grad_clip, eval_interval=eval_interval, eval_iters=eval_iters, log_interval=log_interval,
        device=device, dtype=dtype, compile=compile, seed=seed,
    )  # fmt: skip
    if resume:
        trainer = _resume(out, corpus, config, flags)
    else:
        if not corpus:
            raise UsageError("give the text to train on: gptcli pretrain CORPUS... (files or directories)")
        trainer = _fresh(corpus, config, out, flags)
    run_trainer(trainer, resume=resume, verb="pretrain")


def _fresh(corpus: list[Path], config_path: Path | None, out: Path | None, flags: dict) -> Trainer:
    from gptcli.config import load_config, read_yaml
    from gptcli.model import GPT
    from gptcli.runtime import seed_everything

    config = load_config(config_path, flags)
    explicit_tokenizer = "tokenizer" in flags.get("data", {}) or (
        config_path is not None and "tokenizer" in (read_yaml(config_path).get("data") or {})
    )
    run_dir = new_run_dir(out, corpus[0])
    data_dir, sources = prepare_data(corpus, config, explicit_tokenizer)
    tok, task = _load_task(data_dir, config)
    seed_everything(config.train.seed)
    model = GPT(config.model)
    return _trainer(model, tok, task, config, run_dir, data_dir, sources)


def _resume(out: Path | None, corpus: list[Path] | None, config_path: Path | None, flags: dict) -> Trainer:
    from gptcli.checkpoint import LAST, load_checkpoint, newest_run
    from gptcli.config import CONFIG_CHANGES_ON_RESUME, Config, merge

    if config_path is not None:
        raise UsageError("--resume continues a run with its saved config; drop --config")
    bad = [
        f"--{k.replace('_', '-')}" for s, d in flags.items() for k in d if k not in CONFIG_CHANGES_ON_RESUME
    ]
    if bad:
        raise UsageError(
            f"{', '.join(bad)} cannot change when resuming (the run must continue exactly); "
            f"only {', '.join('--' + k.replace('_', '-') for k in CONFIG_CHANGES_ON_RESUME)} can"
        )
    if out is None:
        out = newest_run()
        if out is None:
            raise UsageError("--resume: no run under ./runs to continue; pass --out RUN_DIR")
        render.info(f"resuming the newest run: {out}")
    loaded = load_checkpoint(out / LAST if (out / LAST).exists() else out)
    if loaded.path.name not in (LAST, LAST + ".old"):
        raise UsageError(f"--resume: {out} has no last/ checkpoint to continue from")
    meta = loaded.meta
    config = merge(Config(), meta["config"], f"{loaded.path}/checkpoint.json")
    merge(config, flags, "the command line").validate()
    data_dir = Path(meta["data_dir"])
    if corpus:
        data_dir, _ = prepare_data(corpus, config, explicit_tokenizer=True)
    elif not data_dir.exists():
        raise UsageError(
            f"the run's data ({data_dir}) is gone; pass the corpus again: "
            f"gptcli pretrain CORPUS --resume --out {out}"
        )
    tok, task = _load_task(data_dir, config)
    if tok.name != loaded.tokenizer.name or tok.vocab_size != loaded.tokenizer.vocab_size:
        raise UsageError(
            f"the data is tokenized with {tok.name}, but the run was trained with {loaded.tokenizer.name}"
        )
    loaded.model.train()
    return _trainer(loaded.model, loaded.tokenizer, task, config, out, data_dir, meta.get("sources", []))


def prepare_data(corpus: list[Path], config: Config, explicit_tokenizer: bool) -> tuple[Path, list[str]]:
    """A tokenized directory for the corpus: the one given, or raw text tokenized into the
    cache (reused when the same text and tokenizer come again). Sets config.data.tokenizer."""
    from gptcli.data import cached_corpus, collect_files, is_tokenized_dir, read_meta

    if len(corpus) == 1 and corpus[0].is_dir() and is_tokenized_dir(corpus[0]):
        report = read_meta(corpus[0])
        if explicit_tokenizer and report.tokenizer != config.data.tokenizer.lower():
            raise UsageError(
                f"{corpus[0]} is tokenized with {report.tokenizer}, not {config.data.tokenizer}; "
                f"drop --tokenizer, or re-tokenize the text with gptcli tokenize -t {config.data.tokenizer}"
            )
        config.data.tokenizer = report.tokenizer
        return corpus[0], report.files
    total = sum(f.stat().st_size for f in collect_files(corpus))
    with render.byte_progress("tokenizing", total, show=total > 4 << 20) as update:
        data_dir, report = cached_corpus(corpus, config.data.tokenizer, config.data.val_fraction, update)
    verb = "reusing the cached tokens of" if report.reused else "tokenized"
    render.info(
        f"{verb} {len(report.files)} file(s): {report.tokens:,} {report.tokenizer} tokens ({data_dir})"
    )
    return data_dir, report.files


def _load_task(data_dir: Path, config: Config) -> tuple[Any, Any]:
    from gptcli.data import load_data_tokenizer, load_split
    from gptcli.tasks import LMTask

    tok = load_data_tokenizer(data_dir)
    if config.model.vocab_size is None:
        config.model.vocab_size = tok.vocab_size
    elif config.model.vocab_size < tok.vocab_size:
        raise UsageError(
            f"model.vocab_size {config.model.vocab_size} is smaller than the tokenizer's {tok.vocab_size}"
        )
    task = LMTask(load_split(data_dir, "train"), load_split(data_dir, "val"), config.model.block_size)
    return tok, task


def new_run_dir(out: Path | None, corpus: Path) -> Path:
    """--out, or runs/<corpus stem>-<timestamp>; never a directory that already holds a run."""
    import time

    from gptcli.paths import RUNS_DIR

    if out is None:
        stem = corpus.resolve().stem or "corpus"
        out = RUNS_DIR / f"{stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(
            f"{out} already exists and is not empty; pass --resume to continue that run, "
            "or choose another --out"
        )
    return out


def _trainer(model, tok, task, config, run_dir, data_dir, sources, extra: dict | None = None) -> Trainer:
    from gptcli.train import Trainer

    meta = {"task": "lm", "data_dir": str(data_dir), "sources": list(sources), **(extra or {})}
    return Trainer(model, tok, task, config, run_dir, meta=meta)


def run_trainer(trainer: Trainer, resume: bool, verb: str) -> None:
    """Train, print the summary and loss.png; exit 130 with a resume hint if interrupted."""
    trainer.reporter = render.train_reporter(f"gptcli {verb} →")
    summary = trainer.run(resume=resume)
    png = trainer.run_dir / "loss.png"
    saved = figures.save_loss_png(trainer.run_dir / "metrics.jsonl", png)
    render.train_summary(summary, str(png) if saved else None)
    if summary.stop_reason in ("interrupted", "terminated"):
        render.warning(
            f"stopped at step {summary.steps}; the last checkpoint is saved. "
            f"Continue with: gptcli {verb} --resume --out {trainer.run_dir}"
        )
        raise typer.Exit(130)
    render.info(f"next: gptcli sample --ckpt {trainer.run_dir}")
