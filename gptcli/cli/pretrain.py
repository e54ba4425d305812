"""`gptcli pretrain`: train a GPT from scratch on text, with a live loss curve."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from gptcli.cli import render
from gptcli.cli.training import (
    MODEL,
    RUN,
    Config,
    JsonSummary,
    NewData,
    Resume,
    opt,
    run_trainer,
    with_training_flags,
)
from gptcli.config import TrainConfig
from gptcli.errors import UsageError


@with_training_flags(TrainConfig())
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
    text_column: Annotated[
        str | None,
        opt(
            "--text-column",
            help="The column of Parquet files that holds the text (default: text).",
            panel=RUN,
        ),
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
    json_out: JsonSummary = False,
    train_flags: dict[str, Any] | None = None,
) -> None:
    """Train a GPT from scratch: live loss curve, checkpoints, exact resume.

    gptcli pretrain corpus.txt                                   char-level, defaults
    gptcli pretrain input.txt -c examples/configs/shakespeare-char-cpu.yaml
    gptcli pretrain books/ -t bpe:8192 --max-time 30m
    gptcli pretrain fineweb/*.parquet -t gpt2                    Parquet, .jsonl.gz, .txt.zst, ...
    gptcli pretrain --resume --out runs/books-20260101-120000
    """
    from gptcli.config import flag_overrides
    from gptcli.train.recipes import pretrain_trainer, resume_pretraining

    flags = flag_overrides(
        tokenizer=tokenizer, text_column=text_column, n_layer=n_layer, n_head=n_head, n_embd=n_embd,
        block_size=block_size, dropout=dropout, bias=bias, **(train_flags or {}),
    )  # fmt: skip
    notes = render.Notes()
    if resume:
        trainer = resume_pretraining(
            out, corpus=corpus, config_path=config, flags=flags, new_data=new_data, notes=notes
        )
    else:
        if new_data:
            raise UsageError("--new-data goes with --resume (a new run trains on the data it is given)")
        trainer = pretrain_trainer(corpus or [], config_path=config, out=out, flags=flags, notes=notes)
    run_trainer(trainer, resume=resume, verb="pretrain", json_out=json_out)
