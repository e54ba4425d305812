"""--task lambada: predict the last word of a passage from everything before it.

JSONL of {"text": ...}; the target is the last word with its leading space. Accuracy: every
target token is the model's top choice given the context and the target tokens before it.
ppl: exp of the mean NLL per target token; ppl_per_example: exp of the mean NLL per example
(what lm-evaluation-harness reports as perplexity).
"""

from __future__ import annotations

import math
from pathlib import Path

import torch.nn as nn

from gptcli.data.records import Record
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.evals.examples import Pair, cut_warning, field, pair, records
from gptcli.evals.result import Result
from gptcli.evals.scoring import Progress, score


def lambada_record(r: Record) -> tuple[str, str]:
    """(context, last word) of a record, or a file:line error."""
    text = field(r, "text")
    if not isinstance(text, str) or " " not in text.strip():
        raise UsageError(f"{r.source}: 'text' must be a string of at least two words")
    context, word = text.rsplit(" ", 1)
    if not word:
        raise UsageError(f"{r.source}: the text ends with a space; the last word is the target")
    return context, word


def evaluate_lambada(
    model: nn.Module,
    tokenizer: Tokenizer,
    path: Path,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Result:
    block = model.config.block_size
    rows = records(path, limit)
    pairs: list[Pair] = []
    for r in rows:
        context, word = lambada_record(r)
        pairs.append(pair(tokenizer, context, " " + word, block, r.source))
    scores = score(model, [p.ids for p in pairs], [p.first for p in pairs], progress)
    nll = [s.nll for s in scores]
    hits = [bool(s.greedy.all()) for s in scores]
    n_tokens = sum(len(s.logprobs) for s in scores)
    metrics = {
        "task": "lambada",
        "n": len(rows),
        "acc": sum(hits) / len(rows),
        "ppl": math.exp(sum(nll) / n_tokens),
        "ppl_per_example": math.exp(sum(nll) / len(rows)),
    }
    examples = [{"source": r.source, "nll": v, "correct": h} for r, v, h in zip(rows, nll, hits, strict=True)]
    warning = cut_warning(path, rows, [[p] for p in pairs], block)
    return Result(metrics, examples, [warning] if warning else [])
