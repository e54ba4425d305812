"""--task chat: multi-turn conversations, {"messages": [...]}, in ChatML (gptcli/data/chat.py).

The loss is on every assistant turn's tokens and its end of turn, nothing else: the
model learns to answer, not to write the user's side. A conversation longer than the
block keeps its system message and its latest turns (chat.fit), so it is cut at a turn
boundary. Evaluation reports the loss and the top-1 accuracy on the same tokens.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.data import chat
from gptcli.data.records import Record
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.model import IGNORE_INDEX
from gptcli.tasks.base import Batch, NextTokenTask, Source, pad_batch, to_device


class ChatTask(NextTokenTask):
    """Conversations rendered by the chat template, learning the assistant's turns."""

    def __init__(self, splits: dict[str, list[chat.Rendered]], block_size: int) -> None:
        self.splits = splits
        self.block_size = block_size

    def num_examples(self, split: str) -> int:
        return len(self.splits[split])

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        rows = [self.splits[split][i] for i in indices.tolist()]
        return collate(rows, device)

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        """Loss, bits per byte and top-1 accuracy over the assistant's tokens."""
        nll, right, count, nbytes = 0.0, 0, 0, 0
        for b in batches:
            logits, _ = model(b["x"])
            y = b["y"]
            keep = y != IGNORE_INDEX
            nll += F.cross_entropy(logits[keep].float(), y[keep], reduction="sum").item()
            right += int((logits[keep].argmax(-1) == y[keep]).sum())
            count += int(keep.sum())
            if self.token_bytes is not None:
                nbytes += int(self.token_bytes[y[keep].cpu().numpy()].sum())
        metrics = {"loss": nll / max(1, count), "accuracy": right / max(1, count)}
        if nbytes:
            metrics["bpb"] = nll / math.log(2) / nbytes
        return metrics


def collate(rows: list[chat.Rendered], device: torch.device) -> Batch:
    """Inputs ids[:-1] and targets ids[1:], ignored where the target is not the assistant's."""
    x, _ = pad_batch([r.ids[:-1] for r in rows])
    y = torch.full_like(x, IGNORE_INDEX)
    for i, r in enumerate(rows):
        target = torch.tensor(r.ids[1:], dtype=torch.long)
        target[~torch.tensor(r.trained[1:], dtype=torch.bool)] = IGNORE_INDEX
        y[i, : len(target)] = target
    return {"x": to_device(x, device), "y": to_device(y, device)}


def chat_examples(records: list[Record], tokenizer: Tokenizer, block_size: int) -> list[chat.Fitted]:
    """The conversations of {"messages": [...]} records, rendered, each in block_size + 1
    tokens (the model reads block_size and predicts the next of each)."""
    out = []
    for r in records:
        messages = chat.check_messages(r.fields.get("messages"), r.source, training=True)
        try:
            fitted = chat.fit(tokenizer, messages, block_size + 1, training=True)
        except UsageError as e:
            raise UsageError(f"{r.source}: {e}") from None
        if not any(fitted.rendered.trained[1:]):
            raise UsageError(
                f"{r.source}: not one assistant token fits in the block of {block_size}; use "
                "--block-size up to the model's, or shorter turns"
            )
        out.append(fitted)
    return out


def build(src: Source) -> tuple[ChatTask, int, dict]:
    """The task (the tokenizer must have the chat tokens), and how many turns were cut."""
    if not src.tokenizer.has_chat:
        raise UsageError("--task chat needs the chat tokens in the tokenizer; they are added by finetuning")
    fitted = src.examples(lambda rs: chat_examples(rs, src.tokenizer, src.block_size))
    task = ChatTask({k: [f.rendered for f in v] for k, v in fitted.items()}, src.block_size)
    task.token_bytes = src.tokenizer.byte_lengths()
    dropped = [f.dropped for rows in fitted.values() for f in rows]
    return task, 0, {"chat_cut": int(np.count_nonzero(dropped)), "chat_turns_dropped": int(sum(dropped))}
