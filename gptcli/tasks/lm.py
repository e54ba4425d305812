"""Pretraining (and finetuning on plain text): next-token prediction on random windows of a
token stream."""

from __future__ import annotations

import numpy as np
import torch

from gptcli.errors import UsageError
from gptcli.tasks.base import Batch, NextTokenTask, to_device


class LMTask(NextTokenTask):
    """Next-token prediction: example i is the window tokens[i : i + block_size + 1]."""

    fixed_length = True  # every batch is batch_size x block_size tokens

    def __init__(
        self,
        train: np.ndarray,
        val: np.ndarray,
        block_size: int,
        vocab_size: int | None = None,
        token_bytes: np.ndarray | None = None,
    ) -> None:
        for split, data in (("train", train), ("val", val)):
            if len(data) == 0 and split == "val":
                raise UsageError(
                    "the val split is empty (too little text, or tokenized with --val-fraction 0); "
                    "use more text, or hold out a share above 0 (--val-fraction of tokenize and "
                    "finetune, data.val_fraction in a config)"
                )
            if len(data) < block_size + 1:
                raise UsageError(
                    f"the {split} split has {len(data)} tokens, fewer than block_size + 1 = "
                    f"{block_size + 1}; use more text or a smaller --block-size"
                )
        self.data = {"train": train, "val": val}
        self.block_size = block_size
        self.vocab_size = vocab_size  # ids at or beyond it are refused (a damaged or foreign shard)
        self.token_bytes = token_bytes

    def num_examples(self, split: str) -> int:
        return len(self.data[split]) - self.block_size

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        data, T = self.data[split], self.block_size
        rows = np.stack([np.asarray(data[i : i + T + 1], dtype=np.int64) for i in indices.tolist()])
        if self.vocab_size is not None and rows.max() >= self.vocab_size:  # checked here, on the CPU
            raise UsageError(
                f"the {split} tokens hold id {int(rows.max())}, beyond the vocabulary of {self.vocab_size}; "
                "the tokenized data is damaged or of another tokenizer: tokenize the text again"
            )
        xy = to_device(torch.from_numpy(rows), device)  # (B, T + 1): one contiguous copy
        return {"x": xy[:, :-1], "y": xy[:, 1:]}  # views of it, on the device
