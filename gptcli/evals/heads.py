"""A model finetuned with --task classify or choice, scored with its trained head on a
labelled file (GPT-1's tables): accuracy, and macro-F1 for classification."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn as nn

from gptcli.data.records import Record
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.evals.examples import records
from gptcli.evals.result import Result
from gptcli.evals.scoring import Progress
from gptcli.tasks import accuracy, predict_records
from gptcli.tasks.supervised import macro_f1

_NAMES = {"ctx": "context", "endings": "choices"}  # HellaSwag's field names


def head_records(path: Path, limit: int | None = None) -> list[Record]:
    """The labelled records of a file, in the fields' names the heads read (HellaSwag's
    too), or the file:line of the first without a label."""
    rows = [
        Record({_NAMES.get(k, k): v for k, v in r.fields.items()}, r.source) for r in records(path, limit)
    ]
    for r in rows:
        if "label" not in r.fields:
            raise UsageError(
                f"{r.source}: 'label' is missing; eval needs labelled records "
                "(gptcli classify --file predicts unlabelled ones)"
            )
    return rows


def evaluate_head(
    model: nn.Module,
    tokenizer: Tokenizer,
    meta: dict,
    path: Path,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Result:
    kind = meta.get("task")
    rows = head_records(path, limit)
    device = next(model.parameters()).device
    predictions = []
    for start in range(0, len(rows), 256):
        predictions += predict_records(model, tokenizer, meta, rows[start : start + 256], device)
        if progress is not None:
            progress(len(predictions), len(rows))
    metrics: dict = {"task": kind, "n": len(rows), "acc": accuracy(predictions)}
    if kind == "classify":
        pred = torch.tensor([p.best for p in predictions])
        true = torch.tensor([p.true for p in predictions])
        metrics["f1"] = macro_f1(pred, true)
    examples = [
        {"source": r.source, "label": p.true, "pred": p.best, "probs": p.probs}
        for r, p in zip(rows, predictions, strict=True)
    ]
    return Result(metrics, examples)
