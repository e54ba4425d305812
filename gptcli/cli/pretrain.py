"""`gptcli pretrain`: train a GPT from scratch on text, with a live loss curve."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptcli.cli.common import command
from gptcli.cli.training import (
    MODEL,
    RUN,
    Config,
    JsonSummary,
    NewData,
    Resume,
    load_for_resume,
    new_run_dir,
    opt,
    prepare_text,
    run_trainer,
    same_data,
    train_flags,
    training_options,
)
from gptcli.config import TrainConfig
from gptcli.errors import UsageError

if TYPE_CHECKING:
    from gptcli.config import Config as RunConfig
    from gptcli.model import GPT
    from gptcli.tasks import Task
    from gptcli.tokenizer import Tokenizer
    from gptcli.train import Trainer

T = training_options(TrainConfig())


def pretrain(
    corpus: Annotated[
        list[Path] | None,
        typer.Argument(
            help="Text files, directories of them, or a directory made by `gptcli tokenize`.",
            show_default=False,
        ),
    ] = None,
    config: Config = None,
    out: Annotated[
        Path | None, opt("--out", "-o", help="Run directory (default: runs/<corpus>-<time>).", panel=RUN)
    ] = None,
    resume: Resume = False,
    new_data: NewData = False,
    tokenizer: Annotated[
        str | None, opt("--tokenizer", "-t", help="char, gpt2 or bpe:N (default: char).", panel=RUN)
    ] = None,
    n_layer: Annotated[
        int | None, opt("--n-layer", help="Transformer blocks (default: 6).", panel=MODEL)
    ] = None,
    n_head: Annotated[
        int | None, opt("--n-head", help="Attention heads per block (default: 6).", panel=MODEL)
    ] = None,
    n_embd: Annotated[int | None, opt("--n-embd", help="Model width (default: 384).", panel=MODEL)] = None,
    block_size: Annotated[
        int | None, opt("--block-size", help="Context length in tokens (default: 256).", panel=MODEL)
    ] = None,
    dropout: Annotated[
        float | None, opt("--dropout", help="Dropout probability (default: 0).", panel=MODEL)
    ] = None,
    bias: Annotated[
        bool | None,
        opt("--bias/--no-bias", help="Biases in Linear and LayerNorm (default: on).", panel=MODEL),
    ] = None,
    batch_size: T.batch_size = None,
    grad_accum: T.grad_accum = None,
    lr: T.lr = None,
    min_lr: T.min_lr = None,
    warmup_iters: T.warmup_iters = None,
    max_iters: T.max_iters = None,
    max_time: T.max_time = None,
    weight_decay: T.weight_decay = None,
    grad_clip: T.grad_clip = None,
    eval_interval: T.eval_interval = None,
    eval_iters: T.eval_iters = None,
    log_interval: T.log_interval = None,
    device: T.device = None,
    dtype: T.dtype = None,
    compile: T.compile = None,
    fsdp: T.fsdp = None,
    seed: T.seed = None,
    json_out: JsonSummary = False,
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
        dropout=dropout, bias=bias, **train_flags(locals()),
    )  # fmt: skip
    if resume:
        trainer = _resume(out, corpus, config, flags, new_data)
    else:
        if new_data:
            raise UsageError(
                "--new-data goes with --resume (a new run simply trains on the data it is given)"
            )
        if not corpus:
            raise UsageError("give the text to train on: gptcli pretrain CORPUS... (files or directories)")
        trainer = _fresh(corpus, config, out, flags)
    run_trainer(trainer, resume=resume, verb="pretrain", json_out=json_out)


def _fresh(corpus: list[Path], config_path: Path | None, out: Path | None, flags: dict) -> Trainer:
    from gptcli.config import load_config, read_yaml
    from gptcli.model import GPT
    from gptcli.runtime import broadcast_from_main, seed_everything, shared_setup

    config = load_config(config_path, flags)
    explicit_tokenizer = "tokenizer" in flags.get("data", {}) or (
        config_path is not None and "tokenizer" in (read_yaml(config_path).get("data") or {})
    )

    def prepare() -> tuple[Path, Path, Any]:
        run_dir = new_run_dir(out, corpus[0].resolve().stem)
        data_dir, report = prepare_text(
            corpus, config.data.tokenizer, config.data.val_fraction, explicit_tokenizer
        )
        return run_dir, data_dir, report

    run_dir, data_dir, report = shared_setup(config.train.device, prepare)
    run_dir = broadcast_from_main(run_dir)  # the same run dir for every process of a torchrun job
    config.data.tokenizer = report.tokenizer
    tok, task = _load_task(data_dir, config)
    seed_everything(config.train.seed)
    model = GPT(config.model)
    data = {"data_dir": str(data_dir), "sources": list(report.files), "data_sha256": report.source_sha256}
    return _trainer(model, tok, task, config, run_dir, data)


def _resume(
    out: Path | None, corpus: list[Path] | None, config_path: Path | None, flags: dict, new_data: bool
) -> Trainer:
    from gptcli.data import read_meta
    from gptcli.runtime import shared_setup

    loaded, config = load_for_resume(out, flags, config_path)
    run_dir, meta = loaded.path.parent, loaded.meta
    if "data_dir" not in meta:
        raise UsageError(
            f"{loaded.path}/checkpoint.json does not say where the run's data is; it cannot be resumed"
        )
    data_dir, sources = Path(meta["data_dir"]), meta.get("sources", [])
    if corpus:
        tokenizer, fraction = config.data.tokenizer, config.data.val_fraction
        data_dir, report = shared_setup(
            config.train.device, lambda: prepare_text(corpus, tokenizer, fraction, explicit_tokenizer=True)
        )
        what, sources = " ".join(map(str, corpus)), list(report.files)
    elif not data_dir.exists():
        raise UsageError(
            f"the run's data ({data_dir}) is gone; pass the corpus again: "
            f"{command('pretrain', 'CORPUS', '--resume', '--out', run_dir)}"
        )
    else:
        report, what = read_meta(data_dir), f"the tokens in {data_dir}"
    data = {"data_dir": str(data_dir), "sources": sources}
    data |= same_data(meta, report.source_sha256, new_data, what)
    tok, task = _load_task(data_dir, config)
    if tok.to_dict() != loaded.tokenizer.to_dict():
        raise UsageError(
            f"the data is tokenized with {tok.name}, but the run was trained with {loaded.tokenizer.name}"
        )
    return _trainer(loaded.model, loaded.tokenizer, task, config, run_dir, data)


def _load_task(data_dir: Path, config: Any) -> tuple[Any, Any]:
    from gptcli.data import load_data_tokenizer, load_split
    from gptcli.tasks import LMTask

    tok = load_data_tokenizer(data_dir)
    if config.model.vocab_size is None:
        config.model.vocab_size = tok.vocab_size
    elif config.model.vocab_size < tok.vocab_size:
        raise UsageError(
            f"model.vocab_size {config.model.vocab_size} is smaller than the tokenizer's {tok.vocab_size}"
        )
    train, val = load_split(data_dir, "train"), load_split(data_dir, "val")
    task = LMTask(train, val, config.model.block_size, config.model.vocab_size)
    return tok, task


def _trainer(model: GPT, tok: Tokenizer, task: Task, config: RunConfig, run_dir: Path, data: dict) -> Trainer:
    """data: where the tokens are (data_dir), the text they came from (sources, data_sha256)."""
    from gptcli.train import Trainer

    return Trainer(model, tok, task, config, run_dir, meta={"task": "lm", **data})
