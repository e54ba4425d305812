"""Training objectives: what one example is, how examples become a batch, and the loss.

The training loop draws example indices and hands them to a task; it knows nothing else
about the data. Pretraining is LMTask: next-token prediction on random windows of a token
stream. (Finetuning tasks follow the same interface.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

import numpy as np
import torch
import torch.nn as nn

from gptcli.errors import UsageError

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
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class LMTask:
    """Next-token prediction: example i is the window tokens[i : i + block_size + 1]."""

    def __init__(self, train: np.ndarray, val: np.ndarray, block_size: int) -> None:
        for split, data in (("train", train), ("val", val)):
            if len(data) < block_size + 1:
                raise UsageError(
                    f"the {split} split has {len(data)} tokens, fewer than block_size + 1 = "
                    f"{block_size + 1}; use more text or a smaller --block-size"
                )
        self.data = {"train": train, "val": val}
        self.block_size = block_size

    def num_examples(self, split: str) -> int:
        return len(self.data[split]) - self.block_size

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        data, T = self.data[split], self.block_size
        rows = np.stack([np.asarray(data[i : i + T + 1], dtype=np.int64) for i in indices.tolist()])
        xy = torch.from_numpy(rows)  # (B, T + 1)
        return {"x": to_device(xy[:, :-1], device), "y": to_device(xy[:, 1:], device)}

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        _, loss = model(batch["x"], batch["y"])
        return loss

    def tokens(self, batch: Batch) -> int:
        return batch["x"].numel()

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        losses = [self.loss(model, b).item() for b in batches]
        return {"loss": float(np.mean(losses))}
