"""Looking inside: the masked self-attention weights of every layer and head for a prompt,
and the model's next-token distribution after it.

The weights are the ones the model used: the forward pass computes
softmax(Q K^T / sqrt(d_head) + causal mask) explicitly and multiplies V by exactly these
(see CausalSelfAttention), rather than recomputing them on the side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gptcli.model import GPT, Probe


@dataclass
class AttentionMaps:
    """attention: (n_layer, n_head, T, T), rows = queries, columns = keys; probs: (V,)."""

    attention: torch.Tensor
    next_probs: torch.Tensor

    def select(self, layers: Sequence[int], heads: Sequence[int] | str) -> torch.Tensor:
        """(len(layers), H', T, T) for the given layers; heads a list, or "mean" (H' = 1)."""
        maps = self.attention[list(layers)]
        if heads == "mean":
            return maps.mean(dim=1, keepdim=True)
        return maps[:, list(heads)]

    def top_k(self, k: int) -> tuple[list[int], list[float]]:
        values, ids = torch.topk(self.next_probs, min(k, self.next_probs.numel()))
        return ids.tolist(), values.tolist()


class _Maps(Probe):
    """Keeps every layer's attention weights."""

    def __init__(self) -> None:
        self.maps: list[torch.Tensor] = []

    def attention(self, layer: int, weights: torch.Tensor) -> None:
        self.maps.append(weights)


@torch.no_grad()
def capture(model: GPT, ids: Sequence[int], vocab_size: int | None = None) -> AttentionMaps:
    """Run the prompt ids through the model once and keep every attention map."""
    device = next(model.parameters()).device
    probe = _Maps()
    h = model.hidden_states(torch.tensor([list(ids)], device=device), probe=probe)
    maps = probe.maps
    logits = model.lm_head(h[0, -1]).float()
    if vocab_size is not None and vocab_size < logits.numel():
        logits[vocab_size:] = float("-inf")
    attention = torch.stack([m[0] for m in maps]).float().cpu()  # (L, H, T, T)
    return AttentionMaps(attention, logits.softmax(-1).cpu())
