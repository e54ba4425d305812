"""Continuous batching, the server's decoding loop (no HTTP here: server.py speaks it).

One thread steps every active sequence together, one token each. New sequences are
prefilled together (left-padded) and join at the next step; a finished or cancelled one leaves at once.
The batch shares one KV cache whose rows are right-aligned: row r holds its n_r tokens in
the last n_r slots written, the slots before them masked, so each row's positions are its
own (0, 1, ...). When the rows change, the cache is rebuilt from the rows' own slots (a
copy of what they hold, with room for the next 32 tokens); a row that reaches the
model's block slides its window as `sample` does (its last 3/4 block encoded afresh).

Each sequence has its own sampling settings and its own generator, so what it draws does
not depend on what else is in the batch: greedy tokens are `sample --temp 0`'s, a seeded
request's tokens those of the same request sent alone. In fp32 that holds exactly (tested
under load); in bf16 the products' rounding changes with the batch, so near-ties may differ.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
import types
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from gptcli.errors import GptcliError, compiler_failed, reason
from gptcli.infer import kernels
from gptcli.infer.generate import Sampling, cache_dtype, row_generators, run_length, uniforms_ahead
from gptcli.model import GPT, KVCache

HEADROOM = 32  # slots a rebuilt cache leaves for the tokens to come
# a sequence decoding alone takes runs of about this long (_run), the longest a request
# arriving then waits before it is encoded (GPT-2 124M on 2 cores: 3 steps, not sample's 10)
RUN_SECONDS = 0.025
T = TypeVar("T")


@dataclass
class Scored:
    """One token and what the model gave it: its log-probability and the alternatives."""

    id: int
    logprob: float | None  # None: the first prompt token, which nothing predicts
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class Event:
    """What a sequence reports, in order: `prompt` (the prompt's scores, when asked), then
    one `token` per generated token, then `done` (finish: stop | length | cancelled) or
    `error` (message)."""

    kind: str
    scored: list[Scored] = field(default_factory=list)
    finish: str | None = None
    message: str | None = None


def failure(e: Exception) -> str:
    """What the sequences a failed step or encoding was decoding are told."""
    return compiler_failed(e) or f"decoding failed: {reason(e)}"


class QueueFull(Exception):
    """More sequences are waiting than the engine takes."""


class Unavailable(Exception):
    """The engine takes no more sequences: it is closing, or its loop has failed."""


class Sequence:
    """One continuation being decoded: its settings, its tokens, where its keys live."""

    def __init__(
        self,
        prompt: list[int],
        max_tokens: int,
        sampling: Sampling,
        generator: torch.Generator | None,
        emit: Callable[[Event], None],
        *,
        logprobs: int | None = None,
        score_prompt: bool = False,
        end_ids: tuple[int, ...] = (),
    ) -> None:
        self.tokens = list(prompt)
        self.n_prompt = len(prompt)
        self.max_tokens = max_tokens
        self.sampling = sampling
        self.generator = generator
        self.emit = emit
        self.logprobs = logprobs  # alternatives per token (None: no logprobs at all)
        self.score_prompt = score_prompt
        self.end_ids = end_ids
        self.cancelled = False
        self.ended = False  # its done or error event was reported
        self.logits: torch.Tensor | None = None  # (V,) the next token's, once known
        self.own: KVCache | None = None  # the cache it was encoded into, until it joins the batch's
        self.cached = 0  # tokens whose keys are stored (all but the newest)
        self.row = -1  # its row in the batch cache (or in its own)

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.n_prompt

    def cancel(self) -> None:
        """Stop decoding it (the client went away, or a stop string ended it)."""
        self.cancelled = True

    def report(self, event: Event) -> None:
        """Hand an event to whoever waits for it; nothing after its end, and a listener that
        fails (its event loop closed) cancels the sequence instead of stopping the engine."""
        if self.ended:
            return
        self.ended = event.kind in ("done", "error")
        try:
            self.emit(event)
        except Exception:
            self.cancelled = True


class DecodingThread:
    """The thread that decodes, which runs what it is given in order: the model's loading
    first (`call`), then the engine's loop. OpenMP (libgomp) keeps a pool of threads for
    each thread that runs parallel work: a model loaded in one thread and decoded in another
    leaves two pools, and once they hold more threads than there are CPUs libgomp cuts its
    barrier waits short, so that each of a step's ~100 barriers sleeps and wakes (1.4x the
    time a token on 2 cores, bench/RESULTS.md)."""

    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._work, name="gptcli-engine", daemon=True)
        self.thread.start()

    def submit(self, job: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        self.jobs.put((job, future))
        return future

    def call(self, job: Callable[[], T]) -> T:
        """job() run in this thread, its result or its exception here."""
        return self.submit(job).result()

    def stop(self) -> None:
        """End the thread once what it was given has run."""
        self.jobs.put(None)

    def _work(self) -> None:
        while (item := self.jobs.get()) is not None:
            job, future = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(job())
                except BaseException as e:  # the caller's to raise
                    future.set_exception(e)


class Engine:
    """The decoding loop in a thread of its own: submit() sequences, read their events.
    thread: the one that loaded the model (DecodingThread says why); by default a new one."""

    def __init__(
        self,
        model: GPT,
        *,
        max_batch: int = 8,
        max_queue: int = 64,
        vocab_size: int | None = None,
        compile: bool = False,
        thread: DecodingThread | None = None,
    ) -> None:
        self.model = model
        # compile: the batch's step through torch.compile with symbolic sizes, so that rows
        # joining and leaving and the cache growing reuse its graphs (a few: Dynamo
        # specializes a batch of one, among others); warm_up() builds them
        self.next_logits = model.next_logits
        if compile:  # the model's own code, also where the C step stands in for it
            self.next_logits = torch.compile(types.MethodType(GPT.next_logits, model), dynamic=True)
        self.config = model.config
        self.max_batch, self.max_queue = max_batch, max_queue
        self.vocab_size = vocab_size or model.config.vocab_size
        self.device = next(model.parameters()).device
        self.cache_dtype = cache_dtype(model)
        self.waiting: deque[Sequence] = deque()
        self.active: list[Sequence] = []
        self.joining: list[Sequence] = []  # taken from waiting, being encoded
        self.cache: KVCache | None = None
        self.stepped: tuple[torch.Tensor | None, list[Sequence]] = (None, [])  # the last step's logits, rows
        self.per_run = 2  # steps a sequence decoding alone takes in its next run (_run)
        self.lock = threading.Condition()
        self.stopping = False
        self.thread = thread or DecodingThread()  # (it ends with the engine)
        self.fault: str | None = None  # why the loop stopped, where it failed outside any step
        self.faulted: list[Callable[[str], None]] = []  # told of it (on_fault)
        self.over = threading.Event()  # the loop has ended and _ended has done its part
        self.looping = self.thread.submit(self._loop)
        self.looping.add_done_callback(self._ended)

    # --- the outside ---------------------------------------------------------------------

    def submit(self, seqs: list[Sequence]) -> None:
        """Queue sequences (all or none); QueueFull when more than max_batch + max_queue would
        be decoding or waiting."""
        with self.lock:
            if self.stopping or self.looping.done():
                raise Unavailable(self.fault or "the server is stopping")
            self._drop_cancelled()
            busy = len(self.active) + len(self.joining) + len(self.waiting)
            if busy + len(seqs) > self.max_batch + self.max_queue:
                limits = f"--max-batch {self.max_batch}, --max-queue {self.max_queue}"
                raise QueueFull(f"{busy} sequences are decoding or waiting ({limits})")
            for seq in seqs:  # one of its own, so that rows can be drawn together
                if seq.generator is None and not seq.sampling.greedy:
                    seq.generator = row_generators(None, 1, self.device)[0]
            self.waiting.extend(seqs)
            self.lock.notify()

    def warm_up(self, timeout: float = 3600) -> None:
        """Decode batches of one and of two, from prompts of one token, of two, and of one
        that fills the context (with compile: the step's graphs built now, not on the first
        requests; Dynamo specializes a batch of one, a cache at position 1, and a cache
        written to its last slot)."""
        failed: list[str] = []
        block = self.config.block_size
        for rows, length in itertools.product((1, 2), (1, 2, block - 2)):
            if rows > self.max_batch:  # never decoded together: no graph to build
                continue
            ended = threading.Semaphore(0)

            def emit(event: Event, ended: threading.Semaphore = ended) -> None:
                if event.kind == "error":
                    failed.append(event.message or "")
                if event.kind in ("done", "error"):
                    ended.release()

            greedy = Sampling(temperature=0.0)
            try:
                self.submit([Sequence([0] * max(1, length), 3, greedy, None, emit) for _ in range(rows)])
            except Unavailable as e:
                raise GptcliError(f"the decoding step failed before serving: {e}") from None
            for _ in range(rows):
                if not ended.acquire(timeout=timeout):
                    raise GptcliError(f"the decoding step's warm-up took over {timeout:.0f} s")
        if failed:
            raise GptcliError(f"the decoding step failed before serving: {failed[0]}")

    def load(self) -> tuple[int, int]:
        """(active, waiting) sequences."""
        with self.lock:
            self._drop_cancelled()
            return len(self.active) + len(self.joining), len(self.waiting)

    def _drop_cancelled(self) -> None:
        """End the waiting sequences whose clients left (under the lock): they hold no place in
        the queue until the batch has room for them."""
        if any(seq.cancelled for seq in self.waiting):
            for seq in [s for s in self.waiting if s.cancelled]:
                seq.report(Event("done", finish="cancelled"))
            self.waiting = deque(s for s in self.waiting if not s.cancelled)

    def on_fault(self, callback: Callable[[str], None]) -> None:
        """callback(why) once the loop has failed outside any step (it takes no more sequences:
        whoever serves them should stop), before its sequences are told; at once if it has."""
        with self.lock:
            if self.fault is None:
                self.faulted.append(callback)
                return
        callback(self.fault)

    def close(self) -> None:
        """Finish: every sequence still waiting or active ends with finish "cancelled"."""
        with self.lock:
            self.stopping = True
            self.lock.notify()
        self.thread.stop()
        self.over.wait()  # (a fault of the loop's own has been reported by _ended)

    def _ended(self, looping: Future[None]) -> None:
        """The loop is over. Where it failed outside any step, whoever asked is told (on_fault),
        then every sequence it still held ends with an error, at once (not when the engine is
        closed), and submit() refuses more."""
        try:
            if (e := looping.exception()) is None:
                return
            with self.lock:
                self.stopping = True
                self.fault = f"the decoding loop stopped ({type(e).__name__}: {reason(e)})"
                told, self.faulted = self.faulted, []
            for callback in told:
                callback(self.fault)
            with self.lock:
                for seq in [*self.waiting, *self.joining, *self.active]:
                    seq.report(Event("error", message=self.fault))
                self.waiting.clear()
                self.joining, self.active = [], []
        finally:
            self.over.set()

    # --- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self.lock:
                    while not self.stopping and not self.waiting and not self.active:
                        self.lock.wait()
                    if self.stopping:
                        break
                    room = self.max_batch - len(self.active)
                    self.joining = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
                try:
                    self._iterate(self.joining)
                except Exception as e:  # one failed step fails its sequences, not the server
                    for seq in self.active + self.joining:
                        seq.report(Event("error", message=failure(e)))
                    self.active, self.cache, self.stepped = [], None, (None, [])
                with self.lock:
                    self.joining = []
        with self.lock:
            for seq in list(self.waiting) + self.active:
                seq.report(Event("done", finish="cancelled"))
            self.waiting.clear()
            self.active = []

    def _iterate(self, joining: list[Sequence]) -> None:
        for seq in joining:
            if seq.cancelled:
                seq.report(Event("done", finish="cancelled"))
        joining = [s for s in joining if not s.cancelled]
        # prompts to score one at a time (their logits at every position: T x V floats each),
        # the others together
        groups = [[s] for s in joining if s.score_prompt] + [[s for s in joining if not s.score_prompt]]
        alone = any(len(g) > 1 for g in groups) and kernels.prefills_rows_alone(self.model)
        first: dict[Sequence, str | None] = {}  # the joining whose first token is out: their finish
        failed: set[Sequence] = set()  # the joining whose prompt could not be encoded
        for group in groups:
            # one at a time where the C prefill reads rows alone (each first token out as its own
            # prompt is read), else together; a failure fails the prompts it was encoding, no others
            parts = [[s] for s in group] if len(group) > 1 and alone else [group]
            for part in parts:
                if all(s.cancelled for s in part):  # (none, or left while others were read)
                    continue
                try:
                    self._prefill(part)
                    if len(parts) > 1 and part[0].max_tokens > 0 and not part[0].cancelled:
                        first[part[0]] = self._draw(part)[0]
                except Exception as e:
                    for seq in part:
                        seq.report(Event("error", message=failure(e)))
                    failed.update(part)
        with self.lock:  # from joining to active at once: load() counts each sequence once
            for seq in joining:
                if seq in failed:
                    continue
                if seq.max_tokens == 0:
                    seq.report(Event("done", finish="length"))
                else:
                    self.active.append(seq)
            self.joining = []
        live = []
        for seq in self.active:
            if seq.cancelled:
                seq.report(Event("done", finish="cancelled"))
            else:
                live.append(seq)
        fresh = [s for s in live if s not in first]
        finishes = dict(zip(fresh, self._draw(fresh), strict=True)) | first
        staying = []
        for seq in live:
            if (finish := finishes[seq]) is not None:
                seq.report(Event("done", finish=finish))
                continue
            if seq.cached + 1 > self.config.block_size:  # the window slides, as sample's does:
                keep = max(2, self.config.block_size * 3 // 4)  # the last 3/4 block, newest token
                self._encode([seq], [seq.tokens[-keep:-1]])  # fed by the step below
            staying.append(seq)
        self.active = staying
        if staying:
            self._step(staying)
        else:  # nothing left decoding: let go of the last batch's logits and sequences
            self.stepped = (None, [])

    def _prefill(self, seqs: list[Sequence]) -> None:
        """Encode the prompts together: their keys in a cache of their own, their next
        logits, and with score_prompt the prompts' own scores."""
        every = seqs[0].score_prompt
        logits = self._encode(seqs, [s.tokens for s in seqs], every_position=every)
        for r, seq in enumerate(seqs):
            n = len(seq.tokens)
            seq.logits = logits[r, -1]
            if every:
                logp = F.log_softmax(self._visible(logits[r, -n:-1]), dim=-1)  # (n-1, V)
                scored = [Scored(seq.tokens[0], None)]
                for t, token in enumerate(seq.tokens[1:]):
                    scored.append(Scored(token, float(logp[t, token]), self._top(logp[t], seq.logprobs)))
                seq.report(Event("prompt", scored=scored))

    def _encode(
        self, seqs: list[Sequence], ids: list[list[int]], every_position: bool = False
    ) -> torch.Tensor:
        """Each row of ids encoded, left-padded to the longest, into one cache the rows then
        own (its rows right-aligned, as the batch cache's are); the logits (B, 1, V) after
        each row's last token, or (B, T, V) after every position."""
        T = max(len(row) for row in ids)
        cache = KVCache(self.config, len(ids), T, self.device, self.cache_dtype)
        idx = torch.tensor([[0] * (T - len(row)) + row for row in ids], device=self.device)
        mask = None
        if any(len(row) < T for row in ids):
            mask = torch.tensor([[0] * (T - len(row)) + [1] * len(row) for row in ids], device=self.device)
        if every_position:
            logits = self.model(idx, kv_cache=cache, attention_mask=mask)[0]  # (B, T, V)
        elif mask is None:
            logits = self.model.next_logits(idx, kv_cache=cache)[:, None]  # (B, 1, V)
        else:
            logits = self.model.next_logits(idx, kv_cache=cache, attention_mask=mask)[:, None]
        for r, (seq, row) in enumerate(zip(seqs, ids, strict=True)):
            seq.own, seq.row, seq.cached = cache, r, len(row)
        return logits.float()

    def _visible(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits with the ids beyond the tokenizer's vocabulary (embedding padding) at -inf."""
        if self.vocab_size < logits.size(-1):
            logits = logits.clone()
            logits[..., self.vocab_size :] = float("-inf")
        return logits

    def _top(self, logp: torch.Tensor, k: int | None) -> list[tuple[int, float]]:
        if not k:
            return []
        values, ids = torch.topk(logp, min(k, self.vocab_size))  # never the -inf padding ids
        return list(zip(ids.tolist(), values.tolist(), strict=True))

    def _draw(self, rows: list[Sequence]) -> list[str | None]:
        """Choose each row's next token from its logits (rows that sample alike together,
        each from its own generator) and report it; the finish reason of rows that end."""
        if not rows:
            return []
        stepped, batch = self.stepped
        if (
            stepped is not None
            and len(batch) == len(rows)
            and all(a is b for a, b in zip(batch, rows, strict=True))
        ):
            logits = stepped  # the last step's rows, in order: not copied into a stack of them
        else:
            logits = torch.stack([s.logits for s in rows if s.logits is not None])
        logits = self._visible(logits)  # (B, V)
        tokens = [0] * len(rows)
        groups: dict[Sampling, list[int]] = {}
        for i, s in enumerate(rows):
            groups.setdefault(s.sampling, []).append(i)
        for sampling, idx in groups.items():
            gens = [rows[i].generator for i in idx]
            some = logits if len(idx) == len(rows) else logits[idx]  # (every row: no copy)
            drawn = sampling.draw(some, None if sampling.greedy else gens)
            for i, t in zip(idx, drawn.tolist(), strict=True):
                tokens[i] = t
        wanted = [i for i, s in enumerate(rows) if s.logprobs is not None]
        logp = F.log_softmax(logits[wanted], dim=-1) if wanted else None
        finishes: list[str | None] = []
        for i, (seq, token) in enumerate(zip(rows, tokens, strict=True)):
            seq.logits = None
            if logp is not None and seq.logprobs is not None:
                row = logp[wanted.index(i)]
                scored = Scored(token, float(row[token]), self._top(row, seq.logprobs))
            else:
                scored = Scored(token, None)
            seq.tokens.append(token)
            seq.report(Event("token", scored=[scored]))
            if token in seq.end_ids:
                finishes.append("stop")
            else:
                finishes.append("length" if seq.generated >= seq.max_tokens else None)
        return finishes

    def _step(self, rows: list[Sequence]) -> None:
        """The next logits of every row, after its newest token; rows fresh from an
        encoding of their own (or a changed batch) go into a rebuilt batch cache first."""
        cache = self.cache
        if (
            cache is None
            or cache.pos >= cache.max_len
            or any(s.own is not None for s in rows)
            or [s.row for s in rows] != list(range(cache.batch_size))
        ):
            cache = self._rebuild(rows)
        if len(rows) == 1 and self._run(rows[0], cache):
            return
        tokens = torch.tensor([[s.tokens[-1]] for s in rows], device=self.device)
        logits = self.next_logits(tokens, kv_cache=cache).float()  # (B, V)
        for i, s in enumerate(rows):
            s.cached += 1
            s.logits = logits[i]
        self.stepped = (logits, list(rows))

    def _run(self, seq: Sequence, cache: KVCache) -> bool:
        """A sequence decoding alone, greedy or drawn from its logits (no logprobs asked),
        with nobody waiting: several steps in one C call (kernels.run_steps, as `sample`
        runs them), whose tokens but the last are reported here, each as _draw reports it,
        and the last left to _draw with its logits (the generator moved a draw a token, so
        that _draw finds the same). False where it does not apply (the caller steps)."""
        sampling, gen = seq.sampling, seq.generator
        if self.next_logits is not self.model.next_logits:  # (compiled, or no C step)
            return False
        if seq.cancelled or seq.logprobs is not None or not sampling.from_logits:
            return False  # (cancelled while its last token was reported: it leaves at the next step)
        if not (sampling.greedy or (gen is not None and gen.device.type == "cpu")):
            return False
        room = min(cache.max_len, self.config.block_size) - cache.pos
        n = min(self.per_run, seq.max_tokens - seq.generated, room)
        with self.lock:
            if self.waiting or n < 2:  # (a request waiting joins at the next step)
                return False
        u = None if sampling.greedy else uniforms_ahead(gen, n)
        t0 = time.perf_counter()
        token = torch.tensor([[seq.tokens[-1]]], device=self.device)
        temperature = 0.0 if sampling.greedy else sampling.divisor
        run = kernels.run_steps(self.model, token, cache, n, self.vocab_size, seq.end_ids, temperature, u)
        if run is None:
            return False
        ids, logits = run
        self.per_run = max(2, run_length(time.perf_counter() - t0, ids.numel(), RUN_SECONDS))
        seq.cached += ids.numel()
        for token in ids[:-1].tolist():  # (no end id among them: a run stops after one)
            if u is not None:
                torch.rand(1, 1, generator=gen, dtype=torch.float64)
            seq.tokens.append(token)
            seq.report(Event("token", scored=[Scored(token, None)]))
            if seq.cancelled:
                break
        seq.logits = logits[-1]
        self.stepped = (logits[-1:], [seq])
        return True

    def _rebuild(self, rows: list[Sequence]) -> KVCache:
        """A batch cache holding each row's keys right-aligned at the same slot."""
        old = self.cache
        pos = max(s.cached for s in rows)
        cache = KVCache(
            self.config, len(rows), min(self.config.block_size, pos + HEADROOM), self.device, self.cache_dtype
        )
        valid = torch.ones(len(rows), cache.max_len, dtype=torch.bool, device=self.device)
        for i, s in enumerate(rows):
            n = s.cached
            src = s.own if s.own is not None else old  # rows are right-aligned in both
            assert src is not None
            src.settle()  # (never reordered here; read as stored)
            k, v = src.k[:, s.row, src.pos - n : src.pos], src.v[:, s.row, src.pos - n : src.pos]
            cache.k[:, i, pos - n : pos] = k
            cache.v[:, i, pos - n : pos] = v
            valid[i, : pos - n] = False
            s.own, s.row = None, i
        cache.pos = pos
        cache.key_mask = valid
        self.cache = cache
        return cache
