"""--task sft: instruction tuning on {"prompt", "completion"} records."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gptcli.data.records import Record
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.model import IGNORE_INDEX
from gptcli.tasks.base import Batch, NextTokenTask, Source, end_ids, pad_batch, record_text, to_device


class SFTTask(NextTokenTask):
    """Instruction tuning: prompt + completion + end-of-text, with the loss on the
    completion (and end) tokens only."""

    def __init__(self, splits: dict[str, list[tuple[list[int], int]]], block_size: int) -> None:
        self.splits = splits  # (token ids, prompt length) per example
        self.block_size = block_size

    def num_examples(self, split: str) -> int:
        return len(self.splits[split])

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        rows = [self.splits[split][i] for i in indices.tolist()]
        x, _ = pad_batch([ids[:-1] for ids, _ in rows])
        y = torch.full_like(x, IGNORE_INDEX)
        for i, (ids, n_prompt) in enumerate(rows):
            y[i, : len(ids) - 1] = sft_targets(ids, n_prompt)
        return {"x": to_device(x, device), "y": to_device(y, device)}


def sft_targets(ids: Sequence[int], n_prompt: int) -> torch.Tensor:
    """Next-token targets of ids[:-1], ignored where the target is still part of the prompt."""
    y = torch.tensor(ids[1:], dtype=torch.long)
    y[: max(0, n_prompt - 1)] = IGNORE_INDEX
    return y


def sft_examples(records: list[Record], tokenizer: Tokenizer, block_size: int) -> list[tuple[list[int], int]]:
    """(ids, prompt length) from {"prompt", "completion"} records: prompt + completion + end,
    the prompt cut from the left and then the completion from the right to fit."""
    out = []
    for r in records:
        prompt, completion = record_text(r, "prompt"), record_text(r, "completion")
        if not completion:
            raise UsageError(f"{r.source}: 'completion' is empty; there would be nothing to learn")
        try:
            p, c = tokenizer.encode(prompt), tokenizer.encode(completion) + end_ids(tokenizer)
        except UsageError as e:
            raise UsageError(f"{r.source}: {e}") from None
        room = block_size + 1  # the sequence feeds block_size tokens and predicts the next of each
        p = p[max(0, len(p) - max(1, room - len(c))) :]
        ids = (p + c)[:room]
        out.append((ids, len(p)))
    return out


def build(src: Source) -> tuple[SFTTask, int, dict]:
    """The task; no head, nothing more to remember."""
    splits = src.examples(lambda rs: sft_examples(rs, src.tokenizer, src.block_size))
    task = SFTTask(splits, src.block_size)
    task.token_bytes = src.tokenizer.byte_lengths()
    return task, 0, {}
