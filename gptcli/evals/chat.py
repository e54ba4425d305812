"""--task chat: a chat model on held-out conversations, {"messages": [...]} records.

The assistant turns are scored as training learns them (gptcli/tasks/chat.py: the same
template, the same cut to the block, the same mask): loss, perplexity and top-1 accuracy
on the assistant's tokens and ends of turn.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.evals.examples import records
from gptcli.evals.result import Result
from gptcli.evals.scoring import Progress
from gptcli.model import IGNORE_INDEX
from gptcli.tasks.chat import chat_examples, collate


@torch.no_grad()
def evaluate_chat(
    model: nn.Module,
    tokenizer: Tokenizer,
    path: Path,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Result:
    if not tokenizer.has_chat:
        raise UsageError(
            f"{path}: scoring conversations (--task chat) needs a chat model, and this one has no chat "
            "template; score a model finetuned with --task chat"
        )
    rows = records(path, limit)
    fitted = chat_examples(rows, tokenizer, model.config.block_size)
    device = next(model.parameters()).device
    nll, right, count, examples = 0.0, 0, 0, []
    for start in range(0, len(fitted), 16):
        chunk = fitted[start : start + 16]
        batch = collate([f.rendered for f in chunk], device)
        logits, _ = model(batch["x"])
        y = batch["y"]
        losses = F.cross_entropy(
            logits.float().transpose(1, 2), y, ignore_index=IGNORE_INDEX, reduction="none"
        )
        hits = (logits.argmax(-1) == y) & (y != IGNORE_INDEX)
        for i in range(len(chunk)):
            n = int((y[i] != IGNORE_INDEX).sum())
            example_nll, example_right = float(losses[i].sum()), int(hits[i].sum())
            nll, right, count = nll + example_nll, right + example_right, count + n
            source = rows[start + i].source
            examples.append({"source": source, "nll": example_nll, "tokens": n, "correct": example_right})
        if progress is not None:
            progress(min(start + 16, len(fitted)), len(fitted))
    metrics = {
        "task": "chat",
        "n": len(rows),
        "tokens": count,
        "loss": nll / count,
        "ppl": math.exp(nll / count),
        "acc": right / count,
    }
    cut = sum(1 for f in fitted if f.dropped or f.cut)
    warnings = (
        [f"{cut} conversation(s) were longer than the block and lost their oldest turns"] if cut else []
    )
    return Result(metrics, examples, warnings)
