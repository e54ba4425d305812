"""`gptcli pretrain`: train a GPT from scratch on text, with a live loss curve. Its flags:
config.verbs.PretrainSettings, and the model, data and training flags that override the
run's config (PRETRAIN_OVERRIDES)."""

from __future__ import annotations

from typing import Any

from gptcli.cli import render
from gptcli.cli.declare import Overrides
from gptcli.cli.training import run_trainer
from gptcli.config import TRAIN, DataConfig, ModelConfig, TrainConfig
from gptcli.config.verbs import PretrainSettings, one_config
from gptcli.errors import UsageError

PRETRAIN_OVERRIDES = (
    Overrides("data", DataConfig, ("tokenizer", "text_column"), before="json_out"),
    Overrides(
        "model",
        ModelConfig,
        ("n_layer", "n_head", "n_embd", "block_size", "dropout", "bias"),
        before="json_out",
    ),
    Overrides("train", TrainConfig, defaults=TrainConfig(), panel=TRAIN),
)


def pretrain(s: PretrainSettings, flags: dict[str, dict[str, Any]]) -> None:
    """Train a GPT from scratch: live loss curve, checkpoints, exact resume.

    gptcli pretrain corpus.txt                                   char-level, defaults
    gptcli pretrain input.txt -c examples/configs/shakespeare-char-cpu.yaml
    gptcli pretrain books/ -t bpe:8192 --max-time 30m
    gptcli pretrain fineweb/*.parquet -t gpt2                    Parquet, .jsonl.gz, .txt.zst, ...
    gptcli pretrain --resume --out runs/books-20260101-120000
    """
    from gptcli.train.recipes import pretrain_trainer, resume_pretraining

    notes, config = render.Notes(), one_config(s.config)
    if s.resume:
        if s.new_data and not s.corpus:
            raise UsageError(
                "--new-data continues on the data given with it: gptcli pretrain CORPUS --resume --new-data"
            )
        trainer = resume_pretraining(
            s.out, corpus=s.corpus, config_path=config, flags=flags, new_data=s.new_data, notes=notes
        )
    else:
        if s.new_data:
            raise UsageError("--new-data goes with --resume (a new run trains on the data it is given)")
        trainer = pretrain_trainer(s.corpus or [], config_path=config, out=s.out, flags=flags, notes=notes)
    run_trainer(trainer, resume=s.resume, verb="pretrain", json_out=s.json_out)
