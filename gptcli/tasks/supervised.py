"""GPT-1's supervised finetuning, the model side: a linear head on the last token's hidden
state, trained with an auxiliary LM loss; used by the classify and choice tasks."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model import IGNORE_INDEX
from gptcli.tasks.base import Batch, next_token_targets, pad_batch, to_device


@dataclass
class Example:
    """One supervised example: its token sequences and the index of the right answer."""

    seqs: list[list[int]]
    label: int


def macro_f1(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Mean F1 over the classes that occur in the labels or the predictions."""
    scores = []
    for c in torch.cat([pred, true]).unique().tolist():
        tp = int(((pred == c) & (true == c)).sum())
        fp = int(((pred == c) & (true != c)).sum())
        fn = int(((pred != c) & (true == c)).sum())
        scores.append(2 * tp / max(1, 2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else 0.0


class SupervisedTask:
    """GPT-1's finetuning: scores from the final hidden state of each sequence's last token,
    objective L3 = L2 (cross-entropy of the scores) + aux_lm_weight * L1 (next-token NLL on
    the same text).

    kind "classify": each example has one sequence (or two, both orders of a pair, whose
    last hidden states are added) and the head gives n_classes scores.
    kind "choice": each example has one sequence per choice; the head gives one score per
    sequence, and the scores of an example's choices go through a softmax."""

    def __init__(
        self, kind: str, splits: dict[str, list[Example]], aux_lm_weight: float, block_size: int
    ) -> None:
        self.kind = kind
        self.splits = splits
        self.aux_lm_weight = aux_lm_weight
        self.block_size = block_size

    def num_examples(self, split: str) -> int:
        return len(self.splits[split])

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        return self.collate([self.splits[split][i] for i in indices.tolist()], device)

    def collate(self, examples: Sequence[Example], device: torch.device) -> Batch:
        seqs = [s for e in examples for s in e.seqs]
        owner = torch.tensor([i for i, e in enumerate(examples) for _ in e.seqs])
        slot = torch.tensor([j for e in examples for j in range(len(e.seqs))])
        # which (example, choice) exist, (B, K): its shape gives the scores' on the device
        # without reading a tensor back (a host sync, and a graph break under compile)
        exists = torch.zeros(len(examples), max(len(e.seqs) for e in examples), dtype=torch.bool)
        exists[owner, slot] = True
        x, lengths = pad_batch(seqs)
        return {
            "x": to_device(x, device),
            "lengths": to_device(lengths, device),
            "y_lm": to_device(next_token_targets(x, lengths), device),
            "owner": to_device(owner, device),
            "slot": to_device(slot, device),
            "exists": to_device(exists, device),
            "labels": to_device(torch.tensor([e.label for e in examples]), device),
        }

    def _forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scores (B, K), LM loss or None)."""
        h = model.hidden_states(batch["x"])  # (N, T, C)
        N, B = h.size(0), batch["labels"].size(0)
        last = h[torch.arange(N, device=h.device), batch["lengths"] - 1]  # (N, C)
        if self.kind == "classify":
            pooled = torch.zeros(B, h.size(-1), device=h.device, dtype=last.dtype).index_add(
                0, batch["owner"], last
            )
            scores = model.classifier(pooled)  # (B, K)
        else:
            per_seq = model.classifier(last).squeeze(-1).float()  # (N,)
            scores = torch.full(batch["exists"].shape, float("-inf"), device=h.device)  # (B, K)
            scores[batch["owner"], batch["slot"]] = per_seq
        lm = None
        if self.aux_lm_weight > 0:
            logits = model.lm_head(h)
            lm = F.cross_entropy(
                logits.view(-1, logits.size(-1)), batch["y_lm"].view(-1), ignore_index=IGNORE_INDEX
            )
        return scores, lm

    def _losses(
        self, model: nn.Module, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        scores, lm = self._forward(model, batch)
        cls = F.cross_entropy(scores.float(), batch["labels"])
        total = cls if lm is None else cls + self.aux_lm_weight * lm
        return total, scores, lm

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self._losses(model, batch)[0]

    def tokens(self, batch: Batch) -> int:
        return batch["x"].numel()

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        totals, cls_losses, lm_losses, preds, labels = [], [], [], [], []
        for b in batches:
            total, scores, lm = self._losses(model, b)
            totals.append(total.item())
            cls_losses.append(F.cross_entropy(scores.float(), b["labels"]).item())
            if lm is not None:
                lm_losses.append(lm.item())
            preds.append(scores.argmax(-1).cpu())
            labels.append(b["labels"].cpu())
        pred, true = torch.cat(preds), torch.cat(labels)
        metrics = {"loss": float(np.mean(totals)), "cls_loss": float(np.mean(cls_losses))}
        if lm_losses:
            metrics["lm_loss"] = float(np.mean(lm_losses))
        metrics["accuracy"] = float((pred == true).float().mean())
        if self.kind == "classify":
            metrics["f1"] = macro_f1(pred, true)
        return metrics

    @torch.no_grad()
    def predict(self, model: nn.Module, examples: list[Example], device: torch.device) -> torch.Tensor:
        """Probabilities (len(examples), K) of each label (or choice)."""
        out = []
        for start in range(0, len(examples), 32):
            scores, _ = self._forward(model, self.collate(examples[start : start + 32], device))
            out.append(scores.float().softmax(-1).cpu())
        return torch.cat(out)
