"""Text in, text out, on top of generate.py's token-level decoding: prompts, stop strings,
the end-of-text token, streaming text as it is generated, top-k probabilities per step,
and beam search hypotheses as text."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.infer.generate import SAMPLE, Sampling, beam_search, generate, row_generators
from gptcli.model import GPT


@dataclass
class Prompt:
    ids: list[int]
    text: str
    dropped: int = 0  # tokens cut from the left to fit the model's block_size


def encode_prompt(tokenizer: Tokenizer, text: str | None, block_size: int) -> Prompt:
    """Token ids of a prompt; no text means "start of a document": the end-of-text token,
    or a newline for tokenizers without one. Cut from the left to fit block_size."""
    if text is None or text == "":
        if tokenizer.eot_id is not None:
            return Prompt([tokenizer.eot_id], "")
        if "\n" not in getattr(tokenizer, "stoi", {"\n": 0}):
            raise UsageError(
                "this tokenizer has no end-of-text token or newline to start from; give --prompt"
            )
        return Prompt(tokenizer.encode("\n"), "")
    ids = tokenizer.encode_prompt(text)
    if not ids:
        raise UsageError("the prompt encodes to no tokens; give some text")
    dropped = max(0, len(ids) - block_size)
    return Prompt(ids[dropped:], tokenizer.decode(ids[dropped:]) if dropped else text, dropped)


@dataclass
class TopK:
    """The model's most likely next tokens at one step, and the one that was chosen; with
    q, also the probabilities sampling drew from (after temperature, top-k, top-p)."""

    ids: list[int]
    probs: list[float]
    chosen: int
    chosen_prob: float
    chosen_rank: int  # 1-based rank of the chosen token in the full distribution
    q: list[float] | None = None
    chosen_q: float | None = None


def top_k_of(probs: torch.Tensor, k: int, chosen: int, q: torch.Tensor | None = None) -> TopK:
    """TopK from one next-token distribution probs (V,), ranked by it; q (V,) alongside."""
    values, ids = torch.topk(probs, min(k, probs.numel()))
    chosen_prob = float(probs[chosen])
    rank = int((probs > chosen_prob).sum()) + 1
    top = TopK(ids.tolist(), values.tolist(), chosen, chosen_prob, rank)
    if q is not None:
        top.q, top.chosen_q = q[ids].tolist(), float(q[chosen])
    return top


class TextStream:
    """One continuation: token ids in, printable text out. Holds back bytes that do not yet
    form a character and text that may still become a stop string; ends at a stop string,
    the end-of-text token, or when finished.

    Each token costs the decoding of a few tokens, not of the whole continuation: the text
    settles as it goes, and a new token is decoded together with the ones since the text
    last settled, after the chunk before them (its context: a decoder may read a token
    differently at the start of a text), as vLLM's incremental detokenizer does."""

    def __init__(self, tokenizer: Tokenizer, stops: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stops = [s for s in stops if s]
        self.longest = max((len(s) for s in self.stops), default=0)
        self.ids: list[int] = []
        self.settled = ""  # the text of ids[:read], which no later token changes
        self.context = 0  # ids[context:read]: the chunk decoded before the new tokens
        self.read = 0
        self.text = ""  # final text (set when done)
        self.emitted = 0  # characters of the text handed out so far
        self.finish: str | None = None  # eot | stop | length

    @property
    def done(self) -> bool:
        return self.finish is not None

    def _settle(self) -> tuple[str, bool]:
        """Decode the new tokens after their context; return the part not settled yet (an
        incomplete UTF-8 sequence, which decodes to U+FFFD), and whether the whole text was
        read afresh."""
        before = self.tokenizer.decode(self.ids[self.context : self.read])
        after = self.tokenizer.decode(self.ids[self.context :])
        new = after[len(before) :] if after.startswith(before) else None
        if new is None:  # the context itself read differently: the whole text afresh
            self.settled, self.context, self.read = "", 0, 0
            return self._settle()[0], True
        if not new or new.endswith("\ufffd"):
            return new, False
        self.settled += new
        self.context, self.read = self.read, len(self.ids)
        return "", False

    def push(self, token: int) -> str:
        """Add one token; return the text that became final ("" once it is done)."""
        if self.done:
            return ""
        if token in self.tokenizer.end_ids:  # end of text, or a chat model's end of turn
            return self.close("eot")
        self.ids.append(token)
        searched = len(self.settled)  # stops ending in the text settled so far were looked for
        pending, afresh = self._settle()
        text = self.settled + pending
        start = 0 if afresh else max(0, searched - self.longest + 1)
        found = [at for stop in self.stops if (at := text.find(stop, start)) >= 0]
        if found:  # (the earliest, whichever stop string it is: the text holds none of them)
            self.text = text[: min(found)]
            self.finish = "stop"
            return self._emit(self.text)
        safe = len(text.rstrip("\ufffd"))
        held = max(  # the longest tail that is the start of a stop string waits
            (
                n
                for stop in self.stops
                for n in range(1, min(len(stop), safe + 1))
                if text.endswith(stop[:n], 0, safe)
            ),
            default=0,
        )
        return self._emit(text[: safe - held])

    def close(self, finish: str = "length") -> str:
        if self.finish is None:
            self.finish = finish
            self.text = self.tokenizer.decode(self.ids)
        return self._emit(self.text)

    def _emit(self, text: str) -> str:
        delta = text[self.emitted :]
        self.emitted = len(text)
        return delta


@dataclass
class Sampled:
    """One finished continuation."""

    text: str
    ids: list[int]
    finish: str
    steps: list[TopK] = field(default_factory=list)


def complete(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: Prompt,
    *,
    max_new_tokens: int,
    num_samples: int = 1,
    sampling: Sampling = SAMPLE,
    seed: int | None = None,
    stops: Sequence[str] = (),
    show_probs: int = 0,
    on_text: Callable[[int, str], None] | None = None,
    on_step: Callable[[int, TopK], None] | None = None,
    compile: bool = False,
    interruptible: bool = False,
) -> list[Sampled]:
    """Sample num_samples continuations of prompt as one batch; on_text(i, delta) receives
    each continuation's text as it becomes final (for streaming), on_step(i, top) each
    step's probabilities (with show_probs) before its text. interruptible: Ctrl-C ends the
    generation, and the continuations so far come back with finish "interrupted"."""
    generator = row_generators(seed, num_samples, next(model.parameters()).device)
    streams = [TextStream(tokenizer, stops) for _ in range(num_samples)]
    steps: list[list[TopK]] = [[] for _ in range(num_samples)]
    finish = "length"
    try:
        for step in generate(
            model,
            prompt.ids,
            max_new_tokens,
            num_samples=num_samples,
            sampling=sampling,
            generator=generator,
            vocab_size=tokenizer.vocab_size,
            compile=compile,
            end_ids=tokenizer.end_ids,
        ):
            probs = step.probs if show_probs else None
            q = step.sampling_probs if show_probs and sampling.reshapes else None
            for i, token in enumerate(step.tokens.tolist()):
                stream = streams[i]
                if stream.done:
                    continue
                if probs is not None:
                    steps[i].append(top_k_of(probs[i], show_probs, token, None if q is None else q[i]))
                    if on_step is not None:
                        on_step(i, steps[i][-1])
                delta = stream.push(token)
                if delta and on_text is not None:
                    on_text(i, delta)
            if all(s.done for s in streams):
                break
    except KeyboardInterrupt:
        if not interruptible:
            raise
        finish = "interrupted"
    results = []
    for i, stream in enumerate(streams):
        delta = stream.close(finish)
        if delta and on_text is not None:
            on_text(i, delta)
        results.append(Sampled(stream.text, stream.ids, stream.finish or finish, steps[i]))
    return results


@dataclass
class Beam:
    """One beam search hypothesis as text: the continuation without its end token or stop text."""

    text: str
    ids: list[int]
    logprob: float
    score: float
    finished: bool


def end_token_ids(tokenizer: Tokenizer, eos: Sequence[str] = ()) -> list[int]:
    """The end-of-text token (and a chat model's end of turn) and each --eos text, which
    must be exactly one token."""
    ids = list(tokenizer.end_ids)
    for text in eos:
        encoded = tokenizer.encode(text)
        if not text:
            raise UsageError("--eos is empty; give the text of a token that ends a hypothesis (--eos .)")
        if len(encoded) != 1:
            raise UsageError(f"--eos {text!r} is {len(encoded)} tokens, not one; use --stop {text!r} instead")
        ids.append(encoded[0])
    return ids


def beam_complete(
    model: GPT,
    tokenizer: Tokenizer,
    prompt: Prompt,
    *,
    beams: int,
    max_new_tokens: int,
    length_penalty: float = 1.0,
    end_ids: Sequence[int] = (),
    stops: Sequence[str] = (),
    no_repeat_ngram: int = 0,
    compile: bool = False,
) -> list[Beam]:
    """Beam search from a text prompt: a hypothesis ends at one of end_ids (end_token_ids:
    the end-of-text token and any --eos), or once its text contains a stop string."""
    stops = [s for s in stops if s]

    def is_end(ids: list[int]) -> bool:
        text = tokenizer.decode(ids)
        return any(s in text for s in stops)

    hyps = beam_search(
        model,
        prompt.ids,
        beams,
        max_new_tokens,
        length_penalty=length_penalty,
        end_ids=end_ids,
        is_end=is_end if stops else None,
        no_repeat_ngram=no_repeat_ngram,
        vocab_size=tokenizer.vocab_size,
        compile=compile,
    )
    out = []
    for h in hyps:
        body = h.ids[:-1] if h.finished and h.ids[-1] in end_ids else h.ids
        text = tokenizer.decode(body)
        for s in stops:
            text = text.split(s, 1)[0]
        out.append(Beam(text, h.ids, h.logprob, h.score, h.finished))
    return out
