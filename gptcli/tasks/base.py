"""What every training objective shares: the Task protocol the training loop calls, batches
on the device, and turning text into model inputs GPT-1's way."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn as nn

from gptcli.data.records import Record
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.model import IGNORE_INDEX
from gptcli.tasks.split import split_records

Batch = dict[str, torch.Tensor]


class Task(Protocol):
    """The data side of training."""

    def num_examples(self, split: str) -> int:
        """Examples are indexed 0 .. num_examples - 1."""
        ...

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        """The examples `indices` of a split, as tensors on device."""
        ...

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Scalar loss to minimise (call inside the autocast context)."""
        ...

    def tokens(self, batch: Batch) -> int:
        """Tokens processed by a forward pass over batch (for tokens/s and MFU)."""
        ...

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        """Metrics over batches; must include "loss"."""
        ...


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A batch tensor on the device: to a GPU through pinned memory, without waiting for the
    copy (the next kernels on the same stream see it). t must be contiguous: pinning a
    strided view would first gather it, every step."""
    assert t.is_contiguous(), "batch tensors are built contiguous"
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class NextTokenTask:
    """Tasks whose batch is tokens "x" with next-token targets "y" (IGNORE_INDEX where no loss).

    With token_bytes (the bytes of text each token id stands for) evaluation reports bits
    per byte too ("bpb"): the loss in a unit that does not depend on the tokenizer."""

    token_bytes: np.ndarray | None = None

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        _, loss = model(batch["x"], batch["y"])
        return loss

    def tokens(self, batch: Batch) -> int:
        return batch["x"].numel()

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        losses, nll, nbytes = [], 0.0, 0
        for b in batches:
            loss = self.loss(model, b)
            losses.append(loss.item())
            if self.token_bytes is not None:
                targets = b["y"][b["y"] != IGNORE_INDEX].cpu().numpy()
                nll += loss.item() * len(targets)
                nbytes += int(self.token_bytes[targets].sum())
        metrics = {"loss": float(np.mean(losses))}
        if nbytes:
            metrics["bpb"] = nll / math.log(2) / nbytes
        return metrics


def end_ids(tokenizer: Tokenizer) -> list[int]:
    """What closes a finetuning sequence (GPT-1's "extract" position): end-of-text, or a
    newline for tokenizers without one."""
    return [tokenizer.eot_id] if tokenizer.eot_id is not None else tokenizer.encode("\n")


def encode_parts(
    tokenizer: Tokenizer, parts: Sequence[str], delimiter: str, block_size: int, where: str
) -> list[int]:
    """GPT-1's input transformation: the parts joined by the delimiter, then the end token,
    cut from the left to fit block_size."""
    try:
        ids = tokenizer.encode(delimiter.join(parts)) + end_ids(tokenizer)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return ids[-block_size:]


def pad_batch(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token sequences into (N, T) with their lengths (N,)."""
    lengths = torch.tensor([len(s) for s in seqs])
    x = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return x, lengths


def next_token_targets(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Targets for language modelling each right-padded row: the next token, ignored past the end."""
    y = torch.full_like(x, IGNORE_INDEX)
    y[:, :-1] = x[:, 1:]
    positions = torch.arange(x.size(1))[None, :]
    y[positions >= (lengths[:, None] - 1)] = IGNORE_INDEX
    return y


def record_text(record: Record, key: str) -> str:
    """A record's string field key, or a one-line error naming the record."""
    value = record.fields.get(key)
    if not isinstance(value, str):
        what = "missing" if value is None else f"not a string ({value!r})"
        raise UsageError(f"{record.source}: '{key}' is {what}")
    return value


@dataclass
class Source:
    """What a finetuning task is built from: the records of the training file (and of
    --val-data), the run's finetune settings (task, data, val_data, val_fraction,
    aux_lm_weight, delimiter, both_orders), and, for a run being resumed, its label set and
    how it held out validation ("stratified", or None for runs made before)."""

    records: list[Record]
    val_records: list[Record] | None
    settings: dict[str, Any]
    tokenizer: Tokenizer
    block_size: int
    seed: int
    labels: list | None = None
    split: str | None = "stratified"

    def examples(
        self,
        convert: Callable[[list[Record]], list],
        hold: Callable[[list], tuple[list[int], list[int]]] | None = None,
    ) -> dict[str, list]:
        """The train and val examples: convert(records), split as split_records does."""
        s = self.settings
        return split_records(
            self.records, self.val_records, convert, s["val_fraction"], self.seed, s["data"][0], hold
        )
