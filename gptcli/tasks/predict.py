"""Using a model finetuned with --task classify or choice: probabilities of each option."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn as nn

from gptcli.data.records import Record
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.tasks.choice import choice_label, choice_sequences, record_choices
from gptcli.tasks.classify import check_shape, classify_sequences, label_index, record_label
from gptcli.tasks.supervised import Example, SupervisedTask


@dataclass
class Prediction:
    """A classify or choice model's answer for one record."""

    options: list  # the run's labels, or the record's choices
    probs: list[float]  # one per option
    true: int | None  # the index of the right option, where the record gives it

    @property
    def best(self) -> int:
        return max(range(len(self.probs)), key=self.probs.__getitem__)


def predict_records(
    model: nn.Module, tokenizer: Tokenizer, meta: dict, records: list[Record], device: torch.device
) -> list[Prediction]:
    """Score records with a run finetuned by --task classify or choice; meta is its checkpoint.json."""
    kind, block = meta.get("task"), model.config.block_size
    if kind == "classify":
        labels, index = meta["labels"], label_index(meta["labels"])
        for r in records:
            check_shape(r, meta.get("pairs"))
        seqs = [
            classify_sequences(r, tokenizer, block, meta["delimiter"], meta["both_orders"]) for r in records
        ]
        options = [labels] * len(records)
        trues = [record_label(r, index, labels) if "label" in r.fields else None for r in records]
    elif kind == "choice":
        seqs = [choice_sequences(r, tokenizer, block, meta["delimiter"]) for r in records]
        options = [record_choices(r) for r in records]
        trues = [choice_label(r) if "label" in r.fields else None for r in records]
    else:
        raise UsageError(
            f"the model is not a classifier (its task is {kind or 'lm'}); make one with "
            "gptcli finetune --task classify (or choice)"
        )
    examples = [Example(s, 0) for s in seqs]
    probs = SupervisedTask(kind, {}, 0.0, block).predict(model, examples, device)
    return [
        Prediction(opts, probs[i, : len(opts)].tolist(), true)
        for i, (opts, true) in enumerate(zip(options, trues, strict=True))
    ]


def accuracy(predictions: Sequence[Prediction]) -> float | None:
    """Share of the labelled predictions that are right (None when no record has a label)."""
    labelled = [p for p in predictions if p.true is not None]
    return sum(p.best == p.true for p in labelled) / len(labelled) if labelled else None
