"""The one measurement every evaluation makes: the log-probability of chosen tokens of a
sequence, each given the tokens before it, and whether it was the model's top choice.

Sequences are sorted by length and batched under a token budget, right-padded (causal
attention never looks ahead, so padding after a sequence changes nothing in it), and the
vocabulary projection runs only at the positions that are scored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn

from gptcli.model import KVCache
from gptcli.tasks.base import pad_batch

BATCH_TOKENS = 8192  # tokens per forward pass (padding included)
LOGIT_ROWS = 1024  # positions projected onto the vocabulary at once (GPT-2: 200 MB of fp32 logits)
Progress = Callable[[int, int], None]  # (done, total)


@dataclass
class Scores:
    """Of one sequence's scored tokens, in order."""

    logprobs: np.ndarray  # (n,) float64: log p(token | tokens before it)
    greedy: np.ndarray  # (n,) bool: the token was the argmax

    @property
    def nll(self) -> float:
        return float(-self.logprobs.sum())


@torch.no_grad()
def score(
    model: nn.Module,
    seqs: Sequence[Sequence[int]],
    first: Sequence[int],
    progress: Progress | None = None,
    batch_tokens: int = BATCH_TOKENS,
) -> list[Scores]:
    """For each sequence, the tokens seq[first:] scored (first >= 1: the first token is
    only ever context). The model reads every token but the last (which it only predicts):
    a sequence may be block_size + 1 tokens long."""
    device = next(model.parameters()).device
    order = sorted(range(len(seqs)), key=lambda i: -len(seqs[i]))
    out: list[Scores | None] = [None] * len(seqs)
    done = 0
    while done < len(order):
        T = len(seqs[order[done]])
        rows = order[done : done + max(1, batch_tokens // max(1, T))]
        rows = [i for i in rows if 4 * len(seqs[i]) >= 3 * T]  # at most a quarter of a row is padding
        x, _ = pad_batch([seqs[i] for i in rows])  # (B, T)
        read = max(T - 1, 1)  # the tokens read: not the last, which is only predicted
        pos, tgt = [], []
        for r, i in enumerate(rows):
            s, f = seqs[i], first[i]
            if not 1 <= f <= len(s):
                raise ValueError(f"first scored token {f} outside 1..{len(s)}")
            pos.extend(r * read + j - 1 for j in range(f, len(s)))  # the position that predicts token j
            tgt.extend(s[f:])
        h = model.hidden_states(x[:, :read].to(device))  # (B, read, C)
        h = h.reshape(-1, h.size(-1))[torch.as_tensor(pos, device=device)]  # (N, C): scored positions only
        logp, hit = _token_scores(model, h, torch.as_tensor(tgt, device=device))
        for i, scores in zip(rows, _split(logp, hit, [len(seqs[i]) - first[i] for i in rows]), strict=True):
            out[i] = scores
        done += len(rows)
        if progress is not None:
            progress(done, len(order))
    return out  # type: ignore[return-value]


def _split(logp: np.ndarray, hit: np.ndarray, counts: Sequence[int]) -> list[Scores]:
    """The scores of consecutive sequences, counts[i] tokens each."""
    ends = np.cumsum(counts)[:-1]
    return [Scores(lp, h) for lp, h in zip(np.split(logp, ends), np.split(hit, ends), strict=True)]


def _token_scores(model: nn.Module, h: torch.Tensor, targets: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """log p(target) (float64) and whether it was the argmax, for hidden states h (N, C):
    the target's logit less the logsumexp of its row (no log-softmax tensor is written)."""
    logp, hit = [torch.zeros(0, dtype=torch.float64)], [torch.zeros(0, dtype=torch.bool)]
    for start in range(0, h.size(0), LOGIT_ROWS):
        logits = model.lm_head(h[start : start + LOGIT_ROWS]).float()  # (n, V)
        t = targets[start : start + LOGIT_ROWS]
        picked = logits.gather(1, t[:, None]).squeeze(1)
        logp.append((picked - torch.logsumexp(logits, -1)).double().cpu())
        hit.append((logits.argmax(-1) == t).cpu())
    return torch.cat(logp).numpy(), torch.cat(hit).numpy()


@torch.no_grad()
def score_shared(
    model: nn.Module,
    prefixes: Sequence[Sequence[int]],
    continuations: Sequence[Sequence[Sequence[int]]],
    progress: Progress | None = None,
    batch_tokens: int = BATCH_TOKENS,
) -> list[list[Scores]]:
    """Several continuations of each prefix scored, the prefix read once: a batch of
    prefixes (left-padded) fills a KV cache, which is copied for each continuation, and the
    continuations (right-padded) are read on top of it. Each prefix with any continuation
    must fit block_size."""
    device = next(model.parameters()).device
    block = model.config.block_size
    longest = [max(len(c) for c in conts) for conts in continuations]
    order = sorted(range(len(prefixes)), key=lambda e: -(len(prefixes[e]) + longest[e]))
    out: list[list[Scores] | None] = [None] * len(prefixes)
    done = 0
    while done < len(order):
        batch, lc, lk, n = [], 0, 0, 0
        for e in order[done:]:
            lc2, lk2, n2 = max(lc, len(prefixes[e])), max(lk, longest[e]), n + len(continuations[e])
            if batch and (lc2 + lk2 > block or (len(batch) + 1) * lc2 + n2 * (lc2 + lk2) > batch_tokens):
                break
            batch.append(e)
            lc, lk, n = lc2, lk2, n2
        x = torch.zeros(len(batch), lc, dtype=torch.long)
        x_mask = torch.zeros(len(batch), lc, dtype=torch.bool)
        for r, e in enumerate(batch):  # prefixes left-padded: each one's last token in the last column
            p = prefixes[e]
            x[r, lc - len(p) :], x_mask[r, lc - len(p) :] = torch.as_tensor(p, dtype=torch.long), True
        conts = [c for e in batch for c in continuations[e]]
        owner = [r for r, e in enumerate(batch) for _ in continuations[e]]
        y, lengths = pad_batch(conts)  # (n, lk), right-padded
        y_mask = torch.arange(y.size(1))[None, :] < lengths[:, None]
        rows = [i * lk + j for i, c in enumerate(conts) for j in range(len(c))]  # row j of choice i: token j
        targets = [t for c in conts for t in c]
        weights = next(model.parameters())
        cache = KVCache(model.config, len(batch), lc + lk, device, weights.dtype)
        last = model.hidden_states(x.to(device), kv_cache=cache, attention_mask=x_mask.to(device))[:, -1]
        index = torch.as_tensor(owner, device=device)
        cache.reorder(index)  # one copy of its prefix's keys and values per continuation
        h = model.hidden_states(y.to(device), kv_cache=cache, attention_mask=y_mask.to(device))  # (n, lk, C)
        h = torch.cat([last[index][:, None], h[:, :-1]], dim=1)  # row j predicts token j
        h = h.reshape(-1, h.size(-1))[torch.as_tensor(rows, device=device)]
        logp, hit = _token_scores(model, h, torch.as_tensor(targets, device=device))
        scores = iter(_split(logp, hit, [len(c) for c in conts]))
        for e in batch:
            out[e] = [next(scores) for _ in continuations[e]]
        done += len(batch)
        if progress is not None:
            progress(done, len(order))
    return out  # type: ignore[return-value]
