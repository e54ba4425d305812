"""`gptcli finetune`: continue training a checkpoint on new text (lm), on labelled examples
(classify, choice: GPT-1's recipe), or on prompt/completion pairs (sft). Its flags:
config.verbs.FinetuneVerbSettings, and the task, LoRA, model and training flags that
override the run's settings (FINETUNE_OVERRIDES)."""

from __future__ import annotations

from typing import Any

from gptcli.cli import render
from gptcli.cli.declare import Overrides
from gptcli.cli.training import run_trainer
from gptcli.config import FINETUNE_DEFAULTS, TRAIN, FinetuneSettings, ModelConfig, TrainConfig
from gptcli.config.verbs import FinetuneVerbSettings, one_config
from gptcli.errors import UsageError

FINETUNE_OVERRIDES = (
    Overrides(
        "finetune",
        FinetuneSettings,
        before="base",
        names=(
            "task",
            "val_data",
            "val_fraction",
            "aux_lm_weight",
            "delimiter",
            "both_orders",
            "lora_rank",
            "lora_alpha",
            "lora_dropout",
            "lora_targets",
        ),
    ),
    Overrides(
        "model",
        ModelConfig,
        ("dropout", "block_size"),
        before="json_out",
        helps={
            "dropout": ("Dropout probability", "the checkpoint's"),
            "block_size": ("A shorter context than the checkpoint's", "its own"),
        },
    ),
    Overrides("train", TrainConfig, defaults=FINETUNE_DEFAULTS, panel=TRAIN),
)


def finetune(s: FinetuneVerbSettings, flags: dict[str, dict[str, Any]]) -> None:
    """Finetune a model: domain text, classification, multiple choice or instructions.

    gptcli finetune --ckpt runs/demo more_stories.txt                      continue next-token training
    gptcli finetune --ckpt runs/demo reviews.jsonl --task classify         {"text": ..., "label": ...}
    gptcli finetune --ckpt gpt2 pairs.csv --task classify --both-orders    text_a,text_b,label
    gptcli finetune --ckpt runs/demo stories.jsonl --task choice           {"context", "choices", "label"}
    gptcli finetune --ckpt runs/demo qa.jsonl --task sft                   {"prompt", "completion"}
    gptcli finetune --ckpt gpt2-medium qa.jsonl --task sft --lora-rank 8   adapters only, base frozen
    """
    from gptcli.train.recipes import finetune_trainer, resume_finetuning

    given = dict(flags.pop("finetune", {}))
    if "lora_targets" in given:  # a comma-separated list
        names = (t.strip().lower() for t in given["lora_targets"].split(","))
        given["lora_targets"] = [t for t in names if t]
    if "val_data" in given:
        given["val_data"] = str(given["val_data"])
    notes, config = render.Notes(), one_config(s.config)
    if s.resume:
        if s.new_data and not s.data:
            raise UsageError(
                "--new-data continues on the data given with it: gptcli finetune DATA --resume --new-data"
            )
        given |= {"data": s.data, "base": s.ckpt, "base_checkpoint": s.base}
        trainer = resume_finetuning(
            s.out, given=given, config_path=config, flags=flags, new_data=s.new_data, notes=notes
        )
    else:
        if s.new_data:
            raise UsageError("--new-data goes with --resume (a new run trains on the data it is given)")
        if s.ckpt is None:
            raise UsageError("give the model to start from: gptcli finetune --ckpt RUN_DIR DATA")
        if s.base is not None:
            raise UsageError("--base goes with --resume (a new run's base is --ckpt)")
        settings = FinetuneSettings(data=[str(p) for p in s.data or []], base=s.ckpt, **given)
        trainer = finetune_trainer(settings, config_path=config, out=s.out, flags=flags, notes=notes)
    run_trainer(trainer, resume=s.resume, verb="finetune", json_out=s.json_out)
