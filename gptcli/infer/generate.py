"""Token-level decoding: sampling (temperature, top-k, top-p), greedy, and beam search.
Knows nothing about text: it takes and yields token ids.

Decoding runs on a KV cache: the prompt is encoded once, then each step feeds only the new
token. When the sequence outgrows the model's block_size, the context window slides: the
cache is rebuilt from the most recent 3/4 of a block and decoding continues.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from gptcli.infer import kernels
from gptcli.model import GPT, KVCache


@dataclass(frozen=True)
class Sampling:
    """How the next token is drawn from the model's distribution p: the argmax at
    temperature 0 (greedy), else from q, proportional to p^(1/temperature), restricted to
    the top_k likeliest tokens and to the nucleus of mass top_p, renormalised."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        if (
            not math.isfinite(self.temperature)
            or self.temperature < 0
            or (self.top_k is not None and self.top_k < 1)
            or (self.top_p is not None and not 0 < self.top_p <= 1)
        ):
            raise ValueError(
                f"need temperature >= 0, top_k >= 1, 0 < top_p <= 1; got {self.temperature}, "
                f"{self.top_k}, {self.top_p}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def divisor(self) -> float:
        """The temperature logits are divided by: below float32's smallest normal number a
        temperature would round to 0 (0/0 = NaN), and its distribution is already all on the
        argmax."""
        return max(self.temperature, torch.finfo(torch.float32).tiny)

    @property
    def reshapes(self) -> bool:
        """Whether tokens are drawn from a q other than p (a temperature other than 1, or
        top-k / top-p); greedy decoding just takes p's argmax."""
        if self.greedy:
            return False
        return self.temperature != 1.0 or self.top_k is not None or (self.top_p or 1.0) < 1.0

    def describe(self) -> str:
        """How q differs from p, e.g. "T=0.7, top-k 3" ("" when it does not)."""
        parts = [f"T={self.temperature:g}"] if self.temperature != 1.0 else []
        parts += [f"top-k {self.top_k}"] if self.top_k is not None else []
        parts += [f"top-p {self.top_p:g}"] if self.top_p is not None and self.top_p < 1.0 else []
        return ", ".join(parts)

    def distribution(self, logits: torch.Tensor) -> torch.Tensor:
        """q (B, V) for logits (B, V); all mass on the argmax when greedy."""
        logits = logits.float()
        if self.greedy:
            return F.one_hot(argmax(logits), logits.size(-1)).float()
        if not self.reshapes:  # p itself: softmax subtracts the max on its own, to the same bits
            return logits.softmax(-1)
        # subtract the max first, so the largest logit is 0 and the others only fall towards
        # -inf as the temperature shrinks
        scaled = (logits - logits.amax(dim=-1, keepdim=True)) / self.divisor
        return filter_logits(scaled, self.top_k, self.top_p).softmax(-1)

    def draw(self, logits: torch.Tensor, generator: Generators = None) -> torch.Tensor:
        """Next token ids (B,) for logits (B, V); generator: one for the batch, or one per
        row (each row's draws then depend on nothing but its own generator). Without top-k or
        top-p, on the CPU with the decoding library loaded, drawn from the logits in C
        (kernels.sample: no softmax written out); else from q, by draw_at."""
        if self.greedy:
            return argmax(logits)
        return self.draw_with(logits, uniforms(logits, generator))

    def draw_with(self, logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """draw's ids (B,) at the uniforms u (B, 1) float64, not greedy."""
        if self.from_logits:
            fast = kernels.sample(logits.float(), u, self.divisor)
            if fast is not None:
                return fast
        return draw_at(self.distribution(logits), u)

    @property
    def from_logits(self) -> bool:
        """Whether ids are chosen from the logits alone, no top-k or top-p: the argmax, or drawn
        at the temperature (in C where the library is loaded)."""
        return self.top_k is None and (self.top_p or 1.0) >= 1.0


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(-1), (B, V) -> (B,), the same rule for ties (the first) and NaN (the
    first NaN): on the CPU, the C step's own for its logits, else in C (kernels.argmax), or
    numpy's, each about 5 us for a row of GPT-2's vocabulary where torch's takes 44 (a token
    of a greedy decoding costs 6 ms)."""
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and not logits.requires_grad:
        found = kernels.argmax(logits)
        return found if found is not None else torch.as_tensor(logits.numpy().argmax(-1))
    return logits.argmax(dim=-1)


Generators = torch.Generator | Sequence[torch.Generator] | None


def row_generators(seed: int | None, n: int, device: torch.device | str = "cpu") -> list[torch.Generator]:
    """One generator per row: row i of a request seeded S draws from its own generator
    seeded S + i (the rule `sample --num-samples` and the server share); unseeded, random."""
    import secrets

    base = secrets.randbits(62) if seed is None else seed
    return [torch.Generator(device=device).manual_seed(base + i) for i in range(n)]


def draw_from(q: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """One id per row of q (B, V), drawn with probability q: the first id whose cumulative
    mass passes a uniform draw (inverse CDF), found in two levels: the block of 1,024 ids
    where it falls, then the id within it, so the sums cost one pass over q.
    torch.multinomial does the same per row at about 1 ms per 50k-token row on a CPU (18 ms
    for a batch of 16). The sums run in float64 (float32 on MPS, which has none), so even
    tokens of p ~ 1e-12 keep their share; an id of probability 0 is never drawn. On the CPU,
    with the decoding library loaded (gptcli/infer/kernels.py), the same search runs in C.
    generator: one for all rows, or one per row (each row's draw from its own)."""
    return draw_at(q, uniforms(q, generator))


def uniforms(q: torch.Tensor, generator: Generators = None) -> torch.Tensor:
    """The uniform draws (B, 1) for the rows of q (B, V): float64 (float32 on MPS, which has
    none), from one generator for all rows or one per row."""
    wide = torch.float32 if q.device.type == "mps" else torch.float64
    if isinstance(generator, Sequence):
        return torch.cat([torch.rand(1, 1, generator=g, device=q.device, dtype=wide) for g in generator])
    return torch.rand(q.size(0), 1, generator=generator, device=q.device, dtype=wide)


def draw_at(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """draw_from at the uniforms u (B, 1): in C where the CPU library is loaded, else torch's
    search (inverse_cdf)."""
    fast = kernels.draw(q, u)
    return fast if fast is not None else inverse_cdf(q, u)


def inverse_cdf(q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """draw_from's search in torch: ids (B,) for q (B, V) at the uniforms u (B, 1)."""
    wide, (B, V) = u.dtype, q.shape
    size = min(1024, V)
    whole = V // size  # whole blocks, then the last V % size ids, if any, in a shorter one
    # (views of q, not a padded copy; widened before summing, which torch does 2x faster
    # than summing in another dtype)
    sums = [q[:, : whole * size].reshape(B, whole, size).to(wide).sum(-1)]
    if V % size:
        sums.append(q[:, whole * size :].to(wide).sum(-1, keepdim=True))
    ends = torch.cat(sums, -1).cumsum(-1)  # (B, blocks) the mass up to each block's end
    blocks = ends.size(-1)
    x = u * ends[:, -1:]  # (B, 1) the point to find
    b = torch.searchsorted(ends, x, right=True).clamp_(max=blocks - 1)  # (B, 1) its block
    before = torch.where(b > 0, ends.gather(-1, (b - 1).clamp(min=0)), torch.zeros_like(x))
    at = b * size + torch.arange(size, device=q.device)  # (B, size) the ids of its block
    inner = q.gather(-1, at.clamp(max=V - 1)).masked_fill_(at >= V, 0)  # zeros past the end
    j = torch.searchsorted(inner.cumsum(-1, dtype=wide) + before, x, right=True).clamp_(max=size - 1)
    ids = (b * size + j).clamp_(max=V - 1)  # (B, 1)
    # cum[id - 1] <= x < cum[id] means q[id] > 0; only sums rounded differently at a block's
    # edge (or a product rounded up to the total) can land on a zero: the argmax then
    drawn = q.gather(-1, ids) > 0
    if not bool(drawn.all()):
        ids = torch.where(drawn, ids, q.argmax(-1, keepdim=True))
    return ids.squeeze(-1)


GREEDY = Sampling(temperature=0.0)
SAMPLE = Sampling()  # from p itself


@dataclass
class Step:
    """One decoding step for a batch of B continuations."""

    tokens: torch.Tensor  # (B,) the chosen ids (on the host where decoding was compiled)
    logits: torch.Tensor  # (B, V) the model's next-token logits (fp32, padding at -inf)
    sampling: Sampling = SAMPLE

    @property
    def probs(self) -> torch.Tensor:
        """(B, V) p, the model's next-token distribution (temperature 1)."""
        return F.softmax(self.logits, dim=-1)

    @property
    def sampling_probs(self) -> torch.Tensor:
        """(B, V) q, the distribution the tokens were drawn from."""
        return self.sampling.distribution(self.logits)


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


def _one_token(model: GPT, tokens: torch.Tensor, cache: KVCache) -> torch.Tensor:
    return model.next_logits(tokens, kv_cache=cache)


# steps in one C call (_Context.run): as many as take about RUN_SECONDS (GPT-2
# 124M on 2 cores: about 10), so that a stream of text still moves at least 10 times a second
RUN_SECONDS = 0.1
MAX_RUN = 64


def run_length(seconds: float, steps: int, budget: float | None = None) -> int:
    """Steps the next run asks for, after one of `steps` steps took `seconds`: about
    `budget` seconds of them (RUN_SECONDS, read at the call), at least 1, at most MAX_RUN."""
    budget = RUN_SECONDS if budget is None else budget
    return max(1, min(MAX_RUN, int(budget / max(seconds / steps, 1e-6))))


def uniforms_ahead(generator: torch.Generator, n: int) -> torch.Tensor:
    """The uniforms (n, 1) float64 of the generator's next n draws (one per step, as uniforms()
    draws a row's), the generator left where it was: a run's caller moves it a draw a step
    as it hands the steps out (torch.rand(1, 1, ...)), as one step at a time would."""
    state = generator.get_state()
    u = torch.rand(n, 1, generator=generator, dtype=torch.float64)
    generator.set_state(state)
    return u


_compiled_steps: dict[str, Any] = {}


def compiled_step(device: torch.device) -> Callable[[GPT, torch.Tensor, KVCache], torch.Tensor]:
    """One decoding step (a token per row, over a static KV cache) compiled with fixed
    shapes: it compiles once per model and batch, then never again (tested over 200 steps);
    on CUDA as CUDA graphs ("reduce-overhead"), which replay a step's ~150 kernel launches
    as one."""
    mode = "reduce-overhead" if device.type == "cuda" else "default"
    if mode not in _compiled_steps:
        _compiled_steps[mode] = torch.compile(_one_token, mode=mode, dynamic=False)
    return _compiled_steps[mode]


class _Context:
    """The tokens seen so far and the window the model conditions on (with or without a
    cache; with compile, a static cache and a compiled one-token step)."""

    def __init__(
        self,
        model: GPT,
        seq: torch.Tensor,
        use_cache: bool,
        cache_dtype: torch.dtype,
        compile: bool = False,
        new_tokens: int | None = None,
    ) -> None:
        self.model = model
        self.block = model.config.block_size
        self.keep = max(1, self.block * 3 // 4)  # tokens kept when the window slides
        self.use_cache = use_cache or compile
        self.cache_dtype = cache_dtype
        self.compile = compile
        self._seq = seq  # (B, n), and the new tokens (B, 1) after it, joined when needed:
        self._new: list[torch.Tensor] = []  # (a torch.cat a token cost 0.09 ms just after a step)
        self.length = seq.size(1)
        self.start = max(0, seq.size(1) - self.block)  # first position inside the window
        self.cache: KVCache | None = None
        # the first cache holds what the prompt and the new tokens need, up to the window
        # (16 samples of 100 tokens from GPT-2 124M in bf16: 68 MB of cache, not 600); a compiled
        # step keeps one shape, the window's, so that it compiles once per model
        need = seq.size(1) - self.start + (new_tokens if new_tokens is not None else self.block)
        self.first_len = self.block if compile else min(self.block, need)

    @property
    def seq(self) -> torch.Tensor:
        """(B, n) every token so far: the prompt's and the new ones."""
        if self._new:
            self._seq, self._new = torch.cat([self._seq, *self._new], dim=1), []
        return self._seq

    def _refill(self) -> torch.Tensor:
        """The next logits (B, V) after the window, encoded afresh (into a new cache)."""
        window = self.seq[:, self.start :]
        if not self.use_cache:
            return self.model.next_logits(window)
        B = window.size(0)
        if self.compile and self.cache is not None and self.cache.batch_size == B:
            self.cache.reset()  # the same buffers, which the compiled step holds on to
        else:
            config, device = self.model.config, window.device
            size = self.first_len if self.cache is None else self.block  # after a slide, the window
            self.cache = KVCache(config, B, size, device, self.cache_dtype, static=self.compile)
        return self.model.next_logits(window, kv_cache=self.cache)

    def first(self) -> torch.Tensor:
        return self._refill()  # (B, V)

    def expand(self, n: int) -> None:
        self._seq = self.seq.repeat_interleave(n, dim=0)
        if self.cache is not None:
            self.cache.expand(n)

    def room(self) -> int:
        """Steps a run may take before the window slides (none without a growing cache)."""
        if self.compile or self.cache is None:
            return 0
        return min(self.block - (self.length - self.start), self.cache.max_len - self.cache.pos)

    def run(
        self,
        tokens: torch.Tensor,
        n: int,
        choose: int,
        ends: Sequence[int],
        sampling: Sampling,
        u: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Push tokens (1,) and choose the next id from the logits after it as sampling does
        (greedy, or drawn from the logits at the uniforms u (n, 1)), then push that one and so
        on, up to n <= room() ids, in one C call (kernels.run_steps), stopping after an id in
        ends; returns the k ids chosen (k,), the last not pushed yet, and the logits (k, V)
        they were chosen from (-inf past `choose`). None where the C step does not run them
        (more than one row, a model it does not decode): push instead."""
        if tokens.shape != (1,) or not 0 < n <= self.room():
            return None
        temperature = 0.0 if sampling.greedy else sampling.divisor
        run = kernels.run_steps(self.model, tokens[:, None], self.cache, n, choose, ends, temperature, u)
        if run is None:
            return None
        ids, logits = run
        if ids[-1] < 0 and u is not None:  # (a row the C code had nothing to draw from)
            ids[-1:] = sampling.draw_with(logits[-1:], u[ids.numel() - 1 : ids.numel()])
        self._new += [tokens[:, None], ids[None, :-1]]
        self.length += ids.numel()
        return run

    def push(self, tokens: torch.Tensor) -> torch.Tensor:
        """Append tokens (B,) and return the next logits (B, V)."""
        column = tokens[:, None]
        self._new.append(column)
        self.length += 1
        if self.length - self.start > self.block:
            self.start = self.length - self.keep
            return self._refill()
        if not self.use_cache:
            return self._refill()
        if self.compile:
            return compiled_step(tokens.device)(self.model, column, self.cache)
        return self.model.next_logits(column, kv_cache=self.cache)


@torch.no_grad()
def generate(
    model: GPT,
    prompt: Sequence[int],
    max_new_tokens: int,
    *,
    num_samples: int = 1,
    sampling: Sampling = SAMPLE,
    generator: Generators = None,
    vocab_size: int | None = None,
    use_cache: bool = True,
    compile: bool = False,
    end_ids: Sequence[int] = (),
) -> Iterator[Step]:
    """Yield one Step per new token for num_samples continuations of prompt (decoded as one
    batch after a single prefill). Stop early by leaving the loop.

    vocab_size: the tokenizer's vocabulary; ids beyond it (embedding padding) are never chosen.
    compile: decode through a static KV cache with a compiled step (compiled_step), on CUDA a
    step ahead of the caller (_one_ahead); in fp32 the same tokens as without.

    One sequence decoded through the C step, greedy or drawn from the logits (no top-k or
    top-p), runs several steps a call (_Context.run), as many as take about RUN_SECONDS, so
    that no Python runs between them; their Steps are then yielded together, and a run
    stops after any of end_ids (the caller's end tokens, where it will stop: no step is
    spent past them). The ids are those of one step at a time, and the generator moves by
    a draw a Step as then; drawn, the runs need a CPU generator of their own (generator=None
    draws from torch's global one, which the caller may use between Steps: one step at a
    time), which nothing else draws from until the loop is left.
    """
    if not prompt:
        raise ValueError("generate needs at least one prompt token")
    device = next(model.parameters()).device
    seq = torch.tensor([list(prompt)], device=device)
    ctx = _Context(model, seq, use_cache, cache_dtype(model), compile, new_tokens=max_new_tokens)
    logits = ctx.first()
    ctx.expand(num_samples)
    logits = logits.expand(num_samples, -1)
    V = logits.size(-1)
    choose = V if vocab_size is None else min(vocab_size, V)
    padding = torch.arange(V, device=device) >= choose if choose < V else None
    if compile:
        yield from _one_ahead(ctx, logits, max_new_tokens, sampling, generator, padding)
        return
    # one sequence, greedy or drawn from the logits alone, through the C step: runs of steps
    runs = num_samples == 1 and use_cache and not compile and sampling.from_logits and kernels.decodes(model)
    gen = generator[0] if isinstance(generator, Sequence) and len(generator) == 1 else generator
    if runs and not sampling.greedy:  # (a generator of its own: the global one is shared with the caller)
        runs = isinstance(gen, torch.Generator) and gen.device.type == "cpu"
    per_run = 2  # steps the next run asks for, then as many as take about RUN_SECONDS
    made, tokens = 0, None  # the last ids chosen (B,), not pushed yet
    while made < max_new_tokens:
        n = min(per_run, max_new_tokens - made, ctx.room()) if runs and tokens is not None else 0
        if n > 0:
            t0 = time.perf_counter()
            u = None if sampling.greedy else uniforms_ahead(gen, n)
            run = ctx.run(tokens, n, choose, end_ids, sampling, u)
            if run is not None:
                ids, many = run
                per_run = run_length(time.perf_counter() - t0, ids.numel())
                for j in range(ids.numel()):
                    if u is not None:  # (the generator moves a draw a Step, as one step at a time)
                        torch.rand(1, 1, generator=gen, dtype=torch.float64)
                    yield Step(ids[j : j + 1], many[j : j + 1], sampling)
                made += ids.numel()
                tokens = ids[-1:]
                continue
        if tokens is not None:
            logits = ctx.push(tokens)
        logits = logits.float()
        if padding is not None:
            logits = logits.masked_fill(padding, float("-inf"))
        tokens = sampling.draw(logits, generator)
        yield Step(tokens, logits, sampling)
        made += 1


def runs_ahead(device: torch.device) -> bool:
    """Whether compiled decoding runs a step ahead of its caller (_one_ahead): where the device
    computes while the host goes on, CUDA's. On the CPU the step is the host's own work: ahead,
    each token would come a step later, and a caller that stops would pay for one more."""
    return device.type == "cuda"


def _one_ahead(
    ctx: _Context,
    logits: torch.Tensor,
    n: int,
    sampling: Sampling,
    generator: Generators,
    padding: torch.Tensor | None,
) -> Iterator[Step]:
    """Compiled decoding, on CUDA a step ahead: each token's next step is queued on the device
    before the token is read on the host, so that the host's part of a token (the caller's,
    Python's, the sync) runs while the device computes the next one (on an H200 a token's
    kernels took about 0.6 ms and the rest of its 1.1 ms was the host's: bench/RESULTS.md).
    The ids reach the host through a copy behind an event, which the next step does not wait
    for; the logits a Step carries are copied out of the compiled step's output, which its
    next replay (CUDA graphs) overwrites. The Steps' ids are on the host. A caller that
    leaves early leaves one step done for nothing."""
    ahead = runs_ahead(logits.device)
    for made in range(n):
        out = logits.float()
        if padding is not None:
            out = out.masked_fill(padding, float("-inf"))
        elif out is logits:
            out = out.clone()
        tokens = sampling.draw(out, generator)  # (B,) where the model is
        if made == n - 1 or not ahead:
            yield Step(tokens.cpu(), out, sampling)
            if made < n - 1:
                logits = ctx.push(tokens)
            continue
        ready = None
        if tokens.is_cuda:  # into pinned memory, the copy's end marked
            ids, ready = tokens.to("cpu", non_blocking=True), torch.cuda.Event()
            ready.record(torch.cuda.current_stream(tokens.device))  # (cuda:1's, not cuda:0's)
        else:  # (a copy that returns when done)
            ids = tokens.cpu()
        logits = ctx.push(tokens)  # queued behind the draw and the copy
        if ready is not None:
            ready.synchronize()  # (the copy, not the step after it)
        yield Step(ids, out, sampling)


def cache_dtype(model: GPT) -> torch.dtype:
    """The KV cache's dtype for this model: its parameters' (int8 products keep theirs)."""
    return next(model.parameters()).dtype


# --- beam search ---------------------------------------------------------------------------


@dataclass
class Hypothesis:
    """One beam search result: the generated ids (with the end token, if it ended)."""

    ids: list[int]
    logprob: float  # sum of the log-probabilities of ids
    score: float  # logprob / len(ids) ** length_penalty
    finished: bool  # ended with an end token (not cut off by max_new_tokens)


def _banned_by_ngrams(seq: Sequence[int], n: int) -> list[int]:
    """Tokens that would repeat an n-gram already in seq (HF's no_repeat_ngram_size)."""
    if n <= 0 or len(seq) < n - 1:
        return []
    prefix = tuple(seq[len(seq) - n + 1 :]) if n > 1 else ()
    return [seq[i + n - 1] for i in range(len(seq) - n + 1) if tuple(seq[i : i + n - 1]) == prefix]


def best_continuations(
    logits: torch.Tensor,
    scores: torch.Tensor,
    k: int,
    vocab_size: int | None = None,
    banned: Sequence[Sequence[int]] = (),
) -> tuple[list[float], list[int]]:
    """The k best continuations of all beams: scores[r] + log p(j | beam r) for logits (beams, V),
    best first, as values and flat indices r * V + j. Ids that are not tokens (>= vocab_size)
    and banned[r]'s ids never rank, nor does any continuation of a row whose logits hold a NaN
    or +inf (its log-sum-exp is not finite). Where the library is loaded, in C: log p = logit - the row's
    log-sum-exp, so one offset a row (score - log-sum-exp) is added to its logits as they are
    ranked, with no (beams, V) tensor of sums (kernels.best; with bans, kernels.logsumexp and
    kernels.top_rows, the bans between them); else by torch, as Hugging Face ranks them
    (top_of_all over score + log-softmax)."""
    logits = logits.float()
    V = logits.size(-1)
    n = V if vocab_size is None else min(vocab_size, V)
    k = min(k, logits.size(0) * n)
    if not any(banned):  # both in one C call, the rows shared by the threads
        found = kernels.best(logits, scores.float(), n, k)
        if found is not None:
            return found[0].tolist(), found[1].tolist()
    lse = kernels.logsumexp(logits)
    if lse is not None:
        if any(banned):  # (ruled out after the log-sum-exp, as Hugging Face bans after its log-softmax)
            logits = logits.clone()
            for row, ids in enumerate(banned):
                logits[row, list(ids)] = float("-inf")
        found = kernels.top_rows(logits, scores - lse, n, k)
        if found is not None:
            return found[0].tolist(), found[1].tolist()
    logp = F.log_softmax(logits, dim=-1)  # (beams, V)
    total = scores[:, None] + logp
    total[logp.isnan().any(-1)] = float("-inf")  # a row with a NaN or +inf logit: no continuation, as in C
    total[:, n:] = float("-inf")
    for row, ids in enumerate(banned):
        total[row, list(ids)] = float("-inf")
    top, index = top_of_all(total, k)
    return top.tolist(), index.tolist()


def _cache_rows(parents: list[int]) -> list[int]:
    """The beams (given by the cache row each continues) in the order of the cache rows they
    take: the first continuation of a row stays in it, the others move into the rows no beam
    continues. The beams' order means nothing to the search, and where the cache copies rows
    (the model's own code) it then copies only those of second continuations instead of every
    row whose beam changed place; where it records them (the C step), a row's slots come from
    fewer rows."""
    stay: dict[int, int] = {}  # row -> the beam that stays in it
    for beam, row in enumerate(parents):
        stay.setdefault(row, beam)
    movers = iter(beam for beam in range(len(parents)) if stay[parents[beam]] != beam)
    return [stay[row] if row in stay else next(movers) for row in range(len(parents))]


def top_of_all(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torch.topk(scores.view(-1), k) for scores (rows, V), found among each row's own top k
    (where the top k of all must be): 0.17 to 0.23 ms for 4 rows of GPT-2's vocabulary
    against 0.33 to 0.42 in one pass over them all."""
    V = scores.size(-1)
    per_row = min(k, V)
    values, index = torch.topk(scores, per_row, dim=-1)  # (rows, per_row)
    top, at = torch.topk(values.view(-1), k)
    return top, torch.div(at, per_row, rounding_mode="floor") * V + index.view(-1)[at]


@torch.no_grad()
def beam_search(
    model: GPT,
    prompt: Sequence[int],
    beams: int,
    max_new_tokens: int,
    *,
    length_penalty: float = 1.0,
    end_ids: Sequence[int] = (),
    is_end: Callable[[list[int]], bool] | None = None,
    no_repeat_ngram: int = 0,
    vocab_size: int | None = None,
    compile: bool = False,
) -> list[Hypothesis]:
    """Beam search as the lecture defines it, run as one batch of `beams` rows.

    Keep the `beams` highest-scoring partial hypotheses by sum of log-probabilities. Each
    step the best 2 x beams continuations of all rows are ranked; one that ends (its token
    is in end_ids, or is_end(ids) says so) is set aside as finished if it ranks among the
    first `beams`, and the best `beams` that do not end continue. Stop once `beams`
    hypotheses are finished, or after max_new_tokens (the running ones are then kept as
    unfinished). Results are ranked by sum(log p) / length ** length_penalty, the length
    counting the end token. These are Hugging Face's rules for
    generate(num_beams=beams, early_stopping=True, length_penalty=...).

    The prompt is encoded once; the KV cache is then reordered by beam index every step
    (on the CPU, recorded rather than copied: see KVCache.reorder).
    compile: a static cache and a compiled step (see generate).
    """
    if beams < 1:
        raise ValueError("beams must be >= 1")
    device = next(model.parameters()).device
    block = model.config.block_size
    if len(prompt) + max_new_tokens > block:
        raise ValueError(
            f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) exceed block_size {block}"
        )
    ends = set(end_ids)
    positions = len(prompt) + max_new_tokens
    cache = KVCache(model.config, 1, positions, device, cache_dtype(model), static=compile)
    logits = model.next_logits(torch.tensor([list(prompt)], device=device), kv_cache=cache)
    cache.expand(beams)
    logits = logits.expand(beams, -1)
    seqs: list[list[int]] = [[] for _ in range(beams)]
    scores = torch.full((beams,), float("-inf"), device=device)
    scores[0] = 0.0  # at first, every row holds the same (empty) hypothesis: expand only one
    finished: list[Hypothesis] = []
    V = logits.size(-1)
    choose = V if vocab_size is None else min(vocab_size, V)
    # steps a run of C steps ranked (kernels.beam_steps), and whether it took them on
    ran: deque[tuple[list[float], list[int], bool]] = deque()
    runs = not no_repeat_ngram and is_end is None and not compile and kernels.decodes(model)
    per_run = 2  # steps the next run asks for, then as many as take about RUN_SECONDS
    for step in range(max_new_tokens):
        taken_on = False
        if ran:
            top_scores, top_index, taken_on = ran.popleft()
        else:
            banned: list[list[int]] = []  # each beam's ids that would repeat an n-gram
            if no_repeat_ngram:
                banned = [_banned_by_ngrams([*prompt, *seq], no_repeat_ngram) for seq in seqs]
            top_scores, top_index = best_continuations(logits, scores, 2 * beams, vocab_size, banned)
        last = step == max_new_tokens - 1
        rows, tokens, kept = [], [], []
        for rank, (s, i) in enumerate(zip(top_scores, top_index, strict=True)):
            if s == float("-inf"):
                break
            row, token = divmod(i, V)
            ended = token in ends or (is_end is not None and is_end([*seqs[row], token]))
            if ended or last:
                if rank < beams:
                    seq = [*seqs[row], token]
                    finished.append(Hypothesis(seq, s, s / len(seq) ** length_penalty, ended))
            elif len(kept) < beams:
                rows.append(row)
                tokens.append(token)
                kept.append(s)
        finished.sort(key=lambda h: h.score, reverse=True)
        del finished[beams:]
        if last or sum(h.finished for h in finished) >= beams or not kept:
            break
        while len(kept) < beams:  # fewer live continuations than beams: pad with dead rows
            rows.append(rows[0])
            tokens.append(tokens[0])
            kept.append(float("-inf"))
        order = _cache_rows(rows)  # which row of the cache each beam lives in from now on
        rows, tokens, kept = ([xs[i] for i in order] for xs in (rows, tokens, kept))
        seqs = [[*seqs[r], t] for r, t in zip(rows, tokens, strict=True)]
        scores = torch.tensor(kept, device=device)
        if taken_on:  # (the C run reordered the cache and fed these tokens)
            continue
        cache.reorder(torch.tensor(rows, device=device))
        step_ids = torch.tensor(tokens, device=device)[:, None]
        if runs:  # (a run may rank the search's last step, but takes on only those before it)
            t0 = time.perf_counter()
            n, k = min(per_run, max_new_tokens - 1 - step), min(2 * beams, beams * choose)
            run = kernels.beam_steps(model, step_ids, cache, n, choose, ends, len(finished), scores, k)
            if run is not None:
                values, index = run
                per_run = run_length(time.perf_counter() - t0, values.size(0))
                for j, (v, i) in enumerate(zip(values.tolist(), index.tolist(), strict=True)):
                    ran.append((v, i, j < values.size(0) - 1))
                continue
        if compile:
            logits = compiled_step(device)(model, step_ids, cache)
        else:
            logits = model.next_logits(step_ids, kv_cache=cache)
    return finished
