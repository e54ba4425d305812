"""The logit lens: what the model would predict if it stopped after each layer.

The residual stream after the embeddings (layer 0) and after every block (layers 1..L) is
put through the final LayerNorm and the unembedding, softmax(ln_f(h_l) W_e^T), as the last
layer's is. Layer L is then exactly the model's own next-token distribution: the probe
that reads the residual stream leaves the forward pass as it is (no explicit attention).

Only the top-k of each layer and position is kept (and a tracked token's probability and
rank), so looking at a long prompt never holds (L+1) x T x V probabilities at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from gptcli.model import GPT, Probe


@dataclass
class Lens:
    """For layers 0..L (rows) and the chosen positions (columns):
    ids, probs: (L+1, P, K) the top-k next tokens and their probabilities;
    track_probs, track_ranks: (L+1, P) the tracked token's probability and rank (1 = top),
    or None when no token is tracked."""

    positions: list[int]
    ids: torch.Tensor
    probs: torch.Tensor
    track_probs: torch.Tensor | None = None
    track_ranks: torch.Tensor | None = None


class _Residuals(Probe):
    """Keeps the residual stream of every layer at the chosen positions."""

    wants_attention = False  # the forward pass stays the model's own

    def __init__(self, positions: list[int]) -> None:
        self.positions = positions
        self.stream: list[torch.Tensor] = []

    def residual(self, layer: int, x: torch.Tensor) -> None:
        self.stream.append(x[0, self.positions])  # (P, C)


@torch.no_grad()
def logit_lens(
    model: GPT,
    ids: Sequence[int],
    positions: Sequence[int],
    top_k: int,
    vocab_size: int | None = None,
    track: int | None = None,
) -> Lens:
    """Run the prompt ids through the model once and read the lens at the given positions
    (0..T-1). vocab_size: the tokenizer's, when the model's embedding is padded past it
    (those ids get no probability). track: a token id to follow through the layers."""
    device = next(model.parameters()).device
    probe = _Residuals(list(positions))
    final = model.hidden_states(torch.tensor([list(ids)], device=device), probe=probe)
    last = len(probe.stream) - 1
    rows = []
    for layer, h in enumerate(probe.stream):
        # the last layer's stream is the model's output after ln_f, exactly as decoding uses it
        normed = final[0, probe.positions] if layer == last else model.transformer.ln_f(h)
        logits = model.lm_head(normed).float()  # (P, V)
        if vocab_size is not None and vocab_size < logits.size(-1):
            logits[:, vocab_size:] = float("-inf")
        rows.append(logits.softmax(-1))
    k = min(top_k, rows[0].size(-1) if vocab_size is None else vocab_size)
    probs, top = zip(*(torch.topk(p, k, dim=-1) for p in rows), strict=True)
    lens = Lens(list(positions), torch.stack(top).cpu(), torch.stack(probs).cpu())
    if track is not None:
        tracked = torch.stack([p[:, track] for p in rows])  # (L+1, P)
        lens.track_probs = tracked.cpu()
        lens.track_ranks = torch.stack(
            [(p > p[:, track : track + 1]).sum(-1) + 1 for p in rows]
        ).cpu()  # tokens strictly more likely, plus one
    return lens
