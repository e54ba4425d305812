"""Token-level decoding: sampling (temperature, top-k, top-p) and greedy. Knows nothing
about text: it takes and yields token ids.

Decoding runs on a KV cache: the prompt is encoded once, then each step feeds only the new
token. When the sequence outgrows the model's block_size, the context window slides: the
cache is rebuilt from the most recent 3/4 of a block and decoding continues.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from gptcli.model import GPT, KVCache


@dataclass
class Step:
    """One decoding step for a batch of B continuations."""

    tokens: torch.Tensor  # (B,) the chosen ids
    probs: torch.Tensor  # (B, V) the model's next-token distribution (temperature 1)


def filter_logits(logits: torch.Tensor, top_k: int | None = None, top_p: float | None = None) -> torch.Tensor:
    """Set to -inf every logit outside the top-k and outside the nucleus of mass top_p."""
    if top_k is not None and top_k < logits.size(-1):
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # drop a token when the tokens ranked above it already reach top_p (the first stays)
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Next token ids (B,) from logits (B, V): argmax at temperature 0, else a draw from
    q proportional to p^(1/temperature), restricted to top-k / top-p."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = filter_logits(logits.float() / temperature, top_k, top_p)
    return torch.multinomial(logits.softmax(-1), 1, generator=generator).squeeze(-1)


class _Context:
    """The tokens seen so far and the window the model conditions on (with or without a cache)."""

    def __init__(self, model: GPT, seq: torch.Tensor, use_cache: bool, cache_dtype: torch.dtype) -> None:
        self.model = model
        self.block = model.config.block_size
        self.keep = max(1, self.block * 3 // 4)  # tokens kept when the window slides
        self.use_cache = use_cache
        self.cache_dtype = cache_dtype
        self.seq = seq  # (B, n)
        self.start = max(0, seq.size(1) - self.block)  # first position inside the window
        self.cache: KVCache | None = None

    def _refill(self) -> torch.Tensor:
        window = self.seq[:, self.start :]
        if not self.use_cache:
            return self.model.hidden_states(window)[:, -1]
        self.cache = KVCache(self.model.config, window.size(0), self.block, window.device, self.cache_dtype)
        return self.model.hidden_states(window, kv_cache=self.cache)[:, -1]

    def first(self) -> torch.Tensor:
        return self.model.lm_head(self._refill())  # (B, V)

    def expand(self, n: int) -> None:
        self.seq = self.seq.repeat_interleave(n, dim=0)
        if self.cache is not None:
            self.cache.expand(n)

    def push(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens (B,) and return the next logits (B, V)."""
        self.seq = torch.cat([self.seq, tokens[:, None]], dim=1)
        if self.seq.size(1) - self.start > self.block:
            self.start = self.seq.size(1) - self.keep
            return self.model.lm_head(self._refill())
        if not self.use_cache:
            return self.model.lm_head(self._refill())
        return self.model.lm_head(self.model.hidden_states(tokens[:, None], kv_cache=self.cache)[:, -1])


@torch.no_grad()
def generate(
    model: GPT,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    num_samples: int = 1,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    vocab_size: int | None = None,
    use_cache: bool = True,
) -> Iterator[Step]:
    """Yield one Step per new token for num_samples continuations of prompt (decoded as one
    batch after a single prefill). Stop early by leaving the loop.

    vocab_size: the tokenizer's vocabulary; ids beyond it (embedding padding) are never chosen.
    """
    if not prompt:
        raise ValueError("generate needs at least one prompt token")
    device = next(model.parameters()).device
    ctx = _Context(model, torch.tensor([list(prompt)], device=device), use_cache, _cache_dtype(model))
    logits = ctx.first()
    ctx.expand(num_samples)
    logits = logits.expand(num_samples, -1)
    padding = None
    if vocab_size is not None and vocab_size < logits.size(-1):
        padding = torch.arange(logits.size(-1), device=device) >= vocab_size
    for i in range(max_new_tokens):
        logits = logits.float()
        if padding is not None:
            logits = logits.masked_fill(padding, float("-inf"))
        tokens = sample_next(logits, temperature, top_k, top_p, generator)
        yield Step(tokens, F.softmax(logits, dim=-1))
        if i + 1 < max_new_tokens:
            logits = ctx.push(tokens)


def _cache_dtype(model: GPT) -> torch.dtype:
    return next(model.parameters()).dtype
