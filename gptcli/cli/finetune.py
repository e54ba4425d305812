"""`gptcli finetune`: continue training a checkpoint on new text (lm), on labelled examples
(classify, choice: GPT-1's recipe), or on prompt/completion pairs (sft)."""

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
from gptcli.config import FINETUNE_DEFAULTS
from gptcli.errors import UsageError

TASK = "Task"
LORA = "LoRA (train small adapters, keep the base frozen)"


@with_training_flags(FINETUNE_DEFAULTS)
def finetune(
    data: Annotated[
        list[Path] | None,
        typer.Argument(
            help="--task lm: text files/dirs (or a `gptcli tokenize` dir); otherwise a JSONL file "
            "(classify also takes CSV).",
            show_default=False,
        ),
    ] = None,
    ckpt: Annotated[
        str | None,
        opt(
            "--ckpt", help="The model to start from: a run, checkpoint dir, GPT-2 dir or hub name.", panel=RUN
        ),
    ] = None,
    task: Annotated[
        str | None, opt("--task", help="lm | classify | choice | sft (default: lm).", panel=TASK)
    ] = None,
    val_data: Annotated[
        Path | None,
        opt("--val-data", help="Validation records (default: hold out --val-fraction).", panel=TASK),
    ] = None,
    val_fraction: Annotated[
        float | None, opt("--val-fraction", help="Share held out for validation (default: 0.1).", panel=TASK)
    ] = None,
    aux_lm_weight: Annotated[
        float | None,
        opt(
            "--aux-lm-weight",
            help="lambda in L2 + lambda * L1, the auxiliary LM loss (default: 0.5).",
            panel=TASK,
        ),
    ] = None,
    delimiter: Annotated[
        str | None,
        opt(
            "--delimiter",
            help="Text between a pair's parts, or context and choice (default: newline).",
            panel=TASK,
        ),
    ] = None,
    both_orders: Annotated[
        bool,
        opt("--both-orders", help="Pairs: score both orders and add them (GPT-1's similarity).", panel=TASK),
    ] = False,
    lora_rank: Annotated[
        int | None,
        opt(
            "--lora-rank",
            help="Train LoRA adapters of this rank; the base stays frozen (default: off).",
            panel=LORA,
        ),
    ] = None,
    lora_alpha: Annotated[
        float | None,
        opt(
            "--lora-alpha",
            help="The adapters' update is scaled by alpha / rank (default: 2 x rank).",
            panel=LORA,
        ),
    ] = None,
    lora_dropout: Annotated[
        float | None, opt("--lora-dropout", help="Dropout on the adapters' input (default: 0).", panel=LORA)
    ] = None,
    lora_targets: Annotated[
        str | None,
        opt(
            "--lora-targets",
            help="Which Linears get adapters: attn,proj,mlp or a subset (default: all).",
            panel=LORA,
        ),
    ] = None,
    base: Annotated[
        Path | None,
        opt(
            "--base",
            help="With --resume: where a LoRA run's base checkpoint is now, if it moved.",
            panel=LORA,
        ),
    ] = None,
    config: Config = None,
    out: Annotated[
        Path | None, opt("--out", "-o", help="Run directory (default: runs/<data>-<task>-<time>).", panel=RUN)
    ] = None,
    resume: Resume = False,
    new_data: NewData = False,
    dropout: Annotated[
        float | None, opt("--dropout", help="Dropout probability (default: the checkpoint's).", panel=MODEL)
    ] = None,
    block_size: Annotated[
        int | None,
        opt("--block-size", help="A shorter context than the checkpoint's (default: its own).", panel=MODEL),
    ] = None,
    json_out: JsonSummary = False,
    train_flags: dict[str, Any] | None = None,
) -> None:
    """Finetune a model: domain text, classification, multiple choice or instructions.

    gptcli finetune --ckpt runs/demo more_stories.txt                    continue next-token training
    gptcli finetune --ckpt runs/demo reviews.jsonl --task classify      {"text": ..., "label": ...}
    gptcli finetune --ckpt gpt2 pairs.csv --task classify --both-orders  text_a,text_b,label
    gptcli finetune --ckpt runs/demo stories.jsonl --task choice         {"context", "choices", "label"}
    gptcli finetune --ckpt runs/demo qa.jsonl --task sft                 {"prompt", "completion"}
    gptcli finetune --ckpt gpt2-medium qa.jsonl --task sft --lora-rank 8  adapters only, base frozen
    """
    from gptcli.config import FinetuneSettings, flag_overrides
    from gptcli.train.recipes import finetune_trainer, resume_finetuning

    flags = flag_overrides(dropout=dropout, block_size=block_size, **(train_flags or {}))
    notes = render.Notes()
    targets = None if lora_targets is None else [t.strip().lower() for t in lora_targets.split(",")]
    lora = {
        "lora_rank": lora_rank, "lora_alpha": lora_alpha, "lora_dropout": lora_dropout,
        "lora_targets": None if targets is None else [t for t in targets if t],
    }  # fmt: skip
    if resume:
        given = {
            "data": data, "base": ckpt, "task": task, "val_data": val_data, "val_fraction": val_fraction,
            "aux_lm_weight": aux_lm_weight, "delimiter": delimiter, "both_orders": both_orders or None,
            "base_checkpoint": base, **lora,
        }  # fmt: skip
        trainer = resume_finetuning(
            out, given=given, config_path=config, flags=flags, new_data=new_data, notes=notes
        )
    else:
        if new_data:
            raise UsageError("--new-data goes with --resume (a new run trains on the data it is given)")
        if ckpt is None:
            raise UsageError("give the model to start from: gptcli finetune --ckpt RUN_DIR DATA")
        if base is not None:
            raise UsageError("--base goes with --resume (a new run's base is --ckpt)")
        given = {"val_fraction": val_fraction, "aux_lm_weight": aux_lm_weight, "delimiter": delimiter, **lora}
        settings = FinetuneSettings(
            task=task or "lm",
            data=[str(p) for p in data or []],
            base=ckpt,
            val_data=str(val_data) if val_data else None,
            both_orders=both_orders,
            **{k: v for k, v in given.items() if v is not None},  # the others keep their defaults
        )
        trainer = finetune_trainer(settings, config_path=config, out=out, flags=flags, notes=notes)
    run_trainer(trainer, resume=resume, verb="finetune", json_out=json_out)
