"""Continuous batching (gptcli/infer/engine.py): a sequence's tokens do not depend on what
is decoded beside it, whenever it joins or leaves, through window slides; its own sampling
and seed; scores of the prompt; failures and cancellation."""

from __future__ import annotations

import queue
import threading
import time

import pytest
import torch
import torch.nn.functional as F

from gptcli.config import ModelConfig
from gptcli.errors import UsageError
from gptcli.infer import kernels
from gptcli.infer.engine import DecodingThread, Engine, Event, QueueFull, Sequence, Unavailable
from gptcli.infer.generate import GREEDY, SAMPLE, Sampling, cache_dtype, generate, row_generators
from gptcli.infer.quantize import quantize
from gptcli.model import GPT, KVCache


def small_model(block: int = 24, fast: bool = True) -> GPT:
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=61, block_size=block, n_layer=2, n_head=2, n_embd=32)).eval()
    if fast:
        kernels.use_fast_decode(model)
    return model


def alone(
    model: GPT, prompt: list[int], n: int, sampling: Sampling = GREEDY, seed: int | None = None
) -> list[int]:
    gens = row_generators(seed, 1) if seed is not None else None
    with torch.no_grad():
        return [int(s.tokens[0]) for s in generate(model, prompt, n, sampling=sampling, generator=gens)]


class Collect:
    """A sequence's events, waited for."""

    def __init__(self) -> None:
        self.events: queue.Queue[Event] = queue.Queue()

    def __call__(self, event: Event) -> None:
        self.events.put(event)

    def wait(self) -> tuple[list[int], str, list[Event]]:
        tokens, seen = [], []
        while True:
            e = self.events.get(timeout=60)
            seen.append(e)
            if e.kind == "token":
                tokens.append(e.scored[0].id)
            elif e.kind in ("done", "error"):
                return tokens, e.finish or e.message or "", seen


class LeaveAt(Collect):
    """A client that leaves after its at-th token (as the server cancels at a stop string)."""

    def __init__(self, at: int) -> None:
        super().__init__()
        self.at, self.tokens = at, 0
        self.seq: Sequence | None = None

    def __call__(self, event: Event) -> None:
        super().__call__(event)
        self.tokens += event.kind == "token"
        if self.tokens == self.at and self.seq is not None:
            self.seq.cancel()


def seq(prompt, n, sampling=GREEDY, seed=None, **kw) -> tuple[Sequence, Collect]:
    c = Collect()
    gen = row_generators(seed, 1)[0] if seed is not None else None
    return Sequence(list(prompt), n, sampling, gen, c, **kw), c


@pytest.mark.parametrize(
    ("fast", "compile"),
    [(True, False), (False, False), (False, True)],
    ids=["c-step", "model-code", "compiled"],
)
def test_tokens_do_not_depend_on_the_batch_joining_leaving_or_sliding(fast, compile):
    """(serve --compile: the same tokens, and rows joining, leaving and sliding compile no
    graph beyond the ones warm_up built)"""
    from torch._dynamo.utils import counters

    model = small_model(block=24, fast=fast)
    engine = Engine(model, max_batch=4, max_queue=16, compile=compile)
    if compile:
        torch._dynamo.reset()
        engine.warm_up()
        graphs = counters["stats"]["unique_graphs"]
        assert graphs >= 1
    try:
        # prompts of different lengths, greedy and seeded sampling, some long enough to slide
        # the 24-token window, submitted in waves so they join a running batch
        specs = [
            ([1, 2, 3], 30, GREEDY, None),
            ([5] * 20, 12, SAMPLE, 7),
            ([9, 8], 5, Sampling(0.8, top_k=5), 3),
            ([4, 4, 4, 4, 4, 4, 4], 40, GREEDY, None),
            ([2], 25, SAMPLE, 11),
            ([3, 1, 4, 1, 5, 9, 2, 6], 9, Sampling(1.3, top_p=0.9), 0),
        ]
        pending = []
        for i, (prompt, n, sampling, seed) in enumerate(specs):
            s, c = seq(prompt, n, sampling, seed)
            engine.submit([s])
            pending.append((prompt, n, sampling, seed, c))
            if i % 2:
                threading.Event().wait(0.05)
        for prompt, n, sampling, seed, c in pending:
            tokens, finish, _ = c.wait()
            assert finish == "length"
            assert tokens == alone(model, prompt, n, sampling, seed), (prompt, sampling)
        if compile:
            assert counters["stats"]["unique_graphs"] == graphs
        deadline = time.monotonic() + 10  # all done: the loop lets go of the last batch's logits
        while engine.stepped[1] and time.monotonic() < deadline:
            threading.Event().wait(0.01)
        assert engine.stepped == (None, [])
    finally:
        engine.close()


@pytest.mark.parametrize("fast", [True, False], ids=["c-step", "model-code"])
def test_prompts_that_join_together_are_encoded_together_as_if_alone(fast):
    model = small_model(block=24, fast=fast)
    engine = Engine(model, max_batch=8, max_queue=0)
    try:
        prompts = [[1, 2, 3], [7] * 11, [4], [5, 6, 5, 6, 5, 6]]
        pairs = [
            seq(p, 15, SAMPLE if i % 2 else GREEDY, seed=i if i % 2 else None) for i, p in enumerate(prompts)
        ]
        engine.submit([s for s, _ in pairs])  # one submit: prefilled in one padded batch
        for i, (p, (_, c)) in enumerate(zip(prompts, pairs, strict=True)):
            tokens, finish, _ = c.wait()
            assert finish == "length"
            assert tokens == alone(model, p, 15, SAMPLE if i % 2 else GREEDY, i if i % 2 else None)
        # prompts to score, of different lengths, together: each as the model scores it alone
        scored = [seq(p, 0, logprobs=1, score_prompt=True) for p in prompts]
        engine.submit([s for s, _ in scored])
        for p, (_, c) in zip(prompts, scored, strict=True):
            events = c.wait()[2]
            with torch.no_grad():
                logp = model(torch.tensor([p]))[0][0].log_softmax(-1)
            got = [x.logprob for x in events[0].scored[1:]]
            want = [float(logp[t - 1, p[t]]) for t in range(1, len(p))]
            assert got == pytest.approx(want, abs=1e-5)
    finally:
        engine.close()


def test_prompt_scores_are_the_models_log_probabilities():
    model = small_model()
    engine = Engine(model)
    try:
        prompt = [3, 1, 4, 1, 5, 9]
        s, c = seq(prompt, 0, logprobs=3, score_prompt=True)
        engine.submit([s])
        tokens, finish, events = c.wait()
        assert tokens == [] and finish == "length"
        scored = events[0].scored
        assert events[0].kind == "prompt" and [x.id for x in scored] == prompt
        with torch.no_grad():
            logp = model(torch.tensor([prompt]))[0][0].log_softmax(-1)
        assert scored[0].logprob is None
        for t in range(1, len(prompt)):
            assert scored[t].logprob == pytest.approx(float(logp[t - 1, prompt[t]]), abs=1e-5)
            top = torch.topk(logp[t - 1], 3)
            assert [i for i, _ in scored[t].top] == top.indices.tolist()
    finally:
        engine.close()


def test_end_tokens_cancel_queue_limit_and_failures():
    model = small_model()
    engine = Engine(model, max_batch=2, max_queue=0)
    try:
        greedy = alone(model, [1, 2], 10)
        s, c = seq([1, 2], 10, end_ids=(greedy[3],))
        engine.submit([s])
        tokens, finish, _ = c.wait()
        assert finish == "stop" and tokens == greedy[: greedy.index(greedy[3]) + 1]
        # a cancelled sequence ends at once, with "cancelled"
        s, c = seq([1], 10_000)
        engine.submit([s])
        c.events.get(timeout=60)
        s.cancel()
        assert c.wait()[1] == "cancelled"
        # more than the queue takes: refused whole
        with pytest.raises(QueueFull):
            engine.submit([seq([1], 1)[0] for _ in range(3)])  # 3 > max_batch + max_queue
        # a failing step fails its sequences; the engine serves the next one
        real = model.next_logits
        model.next_logits = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("injected"))
        s, c = seq([1, 2], 5)
        engine.submit([s])
        tokens, message, _ = c.wait()
        assert "decoding failed: injected" in message
        model.next_logits = real
        s, c = seq([1, 2], 5)
        engine.submit([s])
        assert c.wait()[0] == alone(model, [1, 2], 5)
    finally:
        engine.close()


def test_a_waiting_sequence_whose_client_left_frees_its_place_at_once():
    """A queued sequence cancelled while the batch is full: counted no more, and ended, before
    the batch has room for it (new clients were refused in the meantime)."""
    model = small_model()
    engine = Engine(model, max_batch=1, max_queue=1)
    try:
        a, ca = seq([1, 2], 100_000)
        engine.submit([a])
        ca.events.get(timeout=60)  # decoding
        b, cb = seq([3], 5)
        engine.submit([b])
        assert engine.load() == (1, 1)
        b.cancel()
        assert engine.load() == (1, 0) and cb.wait()[1] == "cancelled"
        c, cc = seq([4], 5)
        engine.submit([c])  # its place
        a.cancel()
        assert cc.wait()[0] == alone(model, [4], 5)
    finally:
        engine.close()


def test_close_ends_what_is_left():
    model = small_model()
    engine = Engine(model, max_batch=1)
    s1, c1 = seq([1], 100_000)
    s2, c2 = seq([2], 5)
    engine.submit([s1, s2])
    c1.events.get(timeout=60)
    engine.close()
    assert c1.wait()[1] == "cancelled" and c2.wait()[1] == "cancelled"
    with pytest.raises(Unavailable):
        engine.submit([seq([1], 1)[0]])


def test_a_listener_that_fails_does_not_stop_the_engine_and_alternatives_stay_in_the_vocabulary():
    model = small_model()
    engine = Engine(model, max_batch=2, vocab_size=40)  # ids 40 to 60: embedding padding
    try:

        def broken(event: Event) -> None:
            raise RuntimeError("the event loop is closed")

        engine.submit([Sequence([1, 2], 50, GREEDY, None, broken)])
        s, c = seq([1, 2], 6, logprobs=50, score_prompt=True)  # more alternatives than ids
        engine.submit([s])
        tokens, finish, events = c.wait()
        assert finish == "length" and len(tokens) == 6 and max(tokens) < 40
        for e in events:
            for x in e.scored:
                assert len(x.top) <= 40 and all(i < 40 and v > float("-inf") for i, v in x.top)
        assert not engine.looping.done()
    finally:
        engine.close()


def test_warm_up_decodes_within_the_limits_it_is_given():
    """One sequence at a time and no queue: the warm-up decodes batches of one only, and
    the engine serves afterwards."""
    model = small_model(block=24)
    engine = Engine(model, max_batch=1, max_queue=0)
    try:
        engine.warm_up(timeout=60)
        s, c = seq([1, 2, 3], 5)
        engine.submit([s])
        assert c.wait()[0] == alone(model, [1, 2, 3], 5)
    finally:
        engine.close()


def test_a_warm_up_that_fails_says_why_in_a_line(monkeypatch):
    """serve --compile with torch's compiler failing (its cache damaged): the reason, with
    what to do, as the error gptcli prints (no class name)."""
    from gptcli.errors import GptcliError

    class BackendCompilerFailed(Exception):
        inner_exception = ImportError("c.main.so: file too short")

    model = small_model()
    engine = Engine(model, max_batch=1)
    monkeypatch.setattr(engine, "next_logits", lambda *a, **k: (_ for _ in ()).throw(BackendCompilerFailed()))
    try:
        with pytest.raises(GptcliError, match=r"before serving: torch's compiler failed \(c.main.so: file"):
            engine.warm_up(timeout=60)
    finally:
        engine.close()


@pytest.mark.parametrize("one_at_a_time", [True, False], ids=["alone", "together"])
def test_a_prompt_that_fails_to_encode_fails_alone(one_at_a_time, monkeypatch):
    """Prompts join while another sequence decodes; one of them cannot be encoded. It ends
    with the error; the sequence decoding goes on, and so do the prompts encoded apart from
    it (one at a time: those before and after it, one already finished among them)."""
    model = small_model()
    monkeypatch.setattr(kernels, "prefills_rows_alone", lambda model: one_at_a_time)
    prefill = Engine._prefill

    def failing(self, seqs):
        if any(s.tokens[:2] == [9, 9] for s in seqs):
            raise RuntimeError("injected")
        return prefill(self, seqs)

    monkeypatch.setattr(Engine, "_prefill", failing)
    engine = Engine(model, max_batch=4)
    try:
        go, busy_events = threading.Event(), Collect()

        def held(event: Event) -> None:  # decoding, held at its first token until they join
            busy_events(event)
            go.wait(timeout=60)

        busy = Sequence([1, 2], 20, GREEDY, None, held)
        engine.submit([busy])
        busy_events.events.get(timeout=60)
        joined = [seq([3, 4], 1), seq([9, 9, 5], 5), seq([6], 5)]
        engine.submit([s for s, _ in joined])
        go.set()
        ends = [c.wait()[:2] for _, c in joined]
        assert ends[1] == ([], "decoding failed: injected")
        if one_at_a_time:
            assert ends[0] == (alone(model, [3, 4], 1), "length")
            assert ends[2] == (alone(model, [6], 5), "length")
        else:  # encoded together: the group fails with it
            assert ends[0] == ends[2] == ([], "decoding failed: injected")
        tokens, finish, _ = busy_events.wait()  # (its first token was read above)
        assert ([busy.tokens[2], *tokens], finish) == (alone(model, [1, 2], 20), "length")
    finally:
        engine.close()


def test_a_prompt_whose_client_left_while_others_were_encoded_is_not_encoded(monkeypatch):
    model = small_model()
    monkeypatch.setattr(kernels, "prefills_rows_alone", lambda model: True)
    encoded, prefill = [], Engine._prefill

    def spy(self, seqs):
        encoded.extend(s.n_prompt for s in seqs)
        return prefill(self, seqs)

    monkeypatch.setattr(Engine, "_prefill", spy)
    engine = Engine(model, max_batch=4)
    try:
        leaving, stays = seq([1, 2, 3], 5), seq([4], 5)
        first = LeaveAt(1)  # its first token out: the next prompt's client leaves
        first.seq = leaving[0]
        s0 = Sequence([5, 6], 5, GREEDY, None, first)
        engine.submit([s0, leaving[0], stays[0]])
        assert first.wait()[:2] == (alone(model, [5, 6], 5), "length")
        assert leaving[1].wait()[:2] == ([], "cancelled")
        assert stays[1].wait()[:2] == (alone(model, [4], 5), "length")
        assert encoded == [2, 1]
    finally:
        engine.close()


def test_a_loop_that_fails_outside_any_step_ends_every_sequence_at_once(monkeypatch):
    """A fault of the loop itself (not of a step: a BaseException, as a Rust panic): what
    waits ends with the error now, not when the engine is closed; the owner is told once
    (on_fault), submit() refuses, and close() returns."""

    class Panic(BaseException):
        pass

    def panic(self, joining):
        raise Panic("injected")

    monkeypatch.setattr(Engine, "_iterate", panic)
    engine = Engine(small_model(), max_batch=1)
    told: list[str] = []
    engine.on_fault(told.append)
    (s1, c1), (s2, c2) = seq([1], 5), seq([2], 5)
    engine.submit([s1, s2])  # one joins and fails the loop, one waits
    why = "the decoding loop stopped (Panic: injected)"
    assert c1.wait()[1] == why and c2.wait()[1] == why
    assert told == [why]
    engine.on_fault(told.append)  # (told at once when it has already failed)
    assert told == [why, why]
    with pytest.raises(Unavailable, match=r"loop stopped \(Panic: injected\)"):
        engine.submit([seq([1], 1)[0]])
    engine.close()
    assert engine.load() == (0, 0)


def test_the_owner_is_told_of_a_fault_whenever_it_asks(monkeypatch):
    """on_fault while the loop's future has failed but _ended waits for the lock (held by a
    request being submitted): the callback is kept, and called."""

    class Panic(BaseException):
        pass

    entered, fail = threading.Event(), threading.Event()

    def panic(self, joining):
        entered.set()
        fail.wait(timeout=60)
        raise Panic("injected")

    monkeypatch.setattr(Engine, "_iterate", panic)
    engine = Engine(small_model(), max_batch=1)
    engine.submit([seq([1], 5)[0]])
    told: list[str] = []
    assert entered.wait(timeout=60)
    with engine.lock:
        fail.set()
        deadline = time.time() + 60
        while not engine.looping.done() and time.time() < deadline:
            time.sleep(0.01)
        assert engine.looping.done()  # (and _ended waits for the lock)
        engine.on_fault(told.append)
    assert engine.over.wait(timeout=60)
    assert told == ["the decoding loop stopped (Panic: injected)"]
    engine.close()


def test_load_counts_each_sequence_once():
    model = small_model()
    engine = Engine(model, max_batch=1, max_queue=0)
    try:
        s, c = seq([1, 2], 100_000)
        engine.submit([s])
        seen = set()
        for _ in range(500):  # while it joins, is encoded and decodes
            seen.add(engine.load())
            threading.Event().wait(0.002)
        assert seen <= {(0, 1), (1, 0)} and (1, 0) in seen
        with pytest.raises(QueueFull):  # one is decoding: the batch and the queue are full
            engine.submit([seq([1], 1)[0]])
        s.cancel()
        assert c.wait()[1] == "cancelled"
    finally:
        engine.close()


@pytest.mark.parametrize("how", ["greedy", "T=1", "T=0.7"])
def test_a_sequence_decoding_alone_runs_several_c_steps_a_call_and_gets_the_same_tokens(how, monkeypatch):
    """Alone in the engine, greedy or drawn from its logits, a sequence takes several C steps
    a call (kernels.run_steps): the tokens of generate() one step at a time (its seed's
    draws), through window slides (block 24), ending at an end id ("stop") or at its length;
    a client that leaves mid-run gets no token after it."""
    if kernels._compiler() is None:
        pytest.skip("no C compiler on this machine")
    kernels.LIBRARY.start()
    assert kernels.LIBRARY.wait() is not None
    model = small_model()
    with torch.no_grad():  # (livelier than just initialised: many different ids)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    sampling = GREEDY if how == "greedy" else Sampling(temperature=float(how[2:]))
    real, decodes, runs = kernels.run_steps, kernels.decodes, []

    def spy(*args, **kwargs):
        got = real(*args, **kwargs)
        runs.append(0 if got is None else got[0].numel())
        return got

    monkeypatch.setattr(kernels, "run_steps", spy)
    monkeypatch.setattr(kernels, "decodes", lambda m: False)  # the reference: one step at a time
    want = alone(model, [1, 2, 3], 40, sampling, seed=5)
    monkeypatch.setattr(kernels, "decodes", decodes)
    assert not runs
    engine = Engine(model, max_batch=2)
    try:
        s, c = seq([1, 2, 3], 40, sampling, seed=5)
        engine.submit([s])
        assert c.wait()[:2] == (want, "length") and max(runs) > 1

        end = want[25]
        s, c = seq([1, 2, 3], 40, sampling, seed=5, end_ids=(end,))
        engine.submit([s])
        assert c.wait()[:2] == (want[: want.index(end) + 1], "stop")

        for at in (1, 3):  # (the first token: the prompt's, reported by _draw; the third: a run's)
            leave = LeaveAt(at)
            leave.seq = Sequence([1, 2, 3], 40, sampling, row_generators(5, 1)[0], leave)
            engine.submit([leave.seq])
            tokens, finish, _ = leave.wait()
            assert (tokens, finish) == (want[:at], "cancelled")
    finally:
        engine.close()


def test_the_engine_decodes_in_the_thread_that_loaded_its_model():
    """OpenMP keeps a pool of threads for each thread that runs parallel work: `serve` loads
    its model in the engine's own thread (DecodingThread), which then decodes every step."""
    decoding = DecodingThread()
    with pytest.raises(UsageError, match="no such run"):  # a loading error is the caller's
        decoding.call(lambda: (_ for _ in ()).throw(UsageError("no such run")))
    model = decoding.call(small_model)  # (and the thread goes on after one)
    loaded_in = decoding.call(threading.current_thread)
    assert loaded_in is not threading.main_thread()
    threads, collect = [], Collect()

    def emit(event: Event) -> None:
        threads.append(threading.current_thread())
        collect(event)

    engine = Engine(model, max_batch=1, thread=decoding)
    try:
        engine.submit([Sequence([1, 2, 3], 6, GREEDY, None, emit)])
        tokens, finish, _ = collect.wait()
        assert tokens == alone(model, [1, 2, 3], 6) and finish == "length"
        assert set(threads) == {loaded_in}
    finally:
        engine.close()
    loaded_in.join(timeout=30)
    assert not loaded_in.is_alive()  # the thread ends with the engine


@pytest.mark.parametrize("weights", ["bf16", "int8"])
def test_prompts_joining_together_are_encoded_one_at_a_time_by_the_c_prefill_where_torch_is_slower(
    weights, monkeypatch
):
    """bf16 or int8 weights on a CPU without native bf16 (kernels.prefills_rows_alone): prompts that
    join together are encoded one at a time by the C prefill (as `sample` encodes its
    prompt), not left-padded through torch's bf16 products, several times slower there; so
    each one's first token and its log-probability are those of its prompt alone, to the bit."""
    if kernels._compiler() is None:
        pytest.skip("no C compiler on this machine")
    kernels.LIBRARY.start()
    assert kernels.LIBRARY.wait() is not None
    monkeypatch.setattr(kernels, "cpu_bf16_feature", lambda: None)
    model = small_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
    assert not kernels.prefills_rows_alone(model)  # fp32: torch's products are as fast together
    if weights == "bf16":
        model.to(torch.bfloat16)
    else:
        quantize(model, "int8")
    assert kernels.prefills_rows_alone(model)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10, 11]]
    want = []
    for prompt in prompts:
        cache = KVCache(model.config, 1, len(prompt), torch.device("cpu"), cache_dtype(model))
        with torch.no_grad():
            logits = model.next_logits(torch.tensor([prompt]), kv_cache=cache).float()
        logp = F.log_softmax(logits, dim=-1)[0]
        want.append((int(logp.argmax()), float(logp.max())))
    real, together = GPT.next_logits, []

    def spy(self, idx, **kwargs):  # torch's own code (the C step's fallback)
        if idx.size(0) > 1 and idx.size(1) > 1:
            together.append(idx.shape)
        return real(self, idx, **kwargs)

    monkeypatch.setattr(GPT, "next_logits", spy)
    order, prefill = [], Engine._prefill

    def prefill_spy(self, seqs):
        order.append(("prompt", [s.n_prompt for s in seqs]))
        return prefill(self, seqs)

    monkeypatch.setattr(Engine, "_prefill", prefill_spy)
    engine = Engine(model, max_batch=4)
    try:
        joined = [seq(prompt, 3, logprobs=0) for prompt in prompts]
        for s, c in joined:  # (the events in the order the engine reports them)
            s.emit = lambda e, c=c, n=s.n_prompt: (order.append((e.kind, n)), c(e))
        engine.submit([s for s, _ in joined])  # (together: one group joins)
        for (_, c), (token, logprob) in zip(joined, want, strict=True):
            first = next(e for e in c.wait()[2] if e.kind == "token").scored[0]
            assert (first.id, first.logprob) == (token, logprob)
        assert not together
        # each first token out as soon as its own prompt is read, not after the others'
        assert order[:6] == [
            ("prompt", [3]),
            ("token", 3),
            ("prompt", [2]),
            ("token", 2),
            ("prompt", [6]),
            ("token", 6),
        ]
        monkeypatch.setattr(kernels, "cpu_bf16_feature", lambda: "avx512_bf16")  # torch's are fast
        assert not kernels.prefills_rows_alone(model)
        joined = [seq(prompt, 1) for prompt in prompts]
        engine.submit([s for s, _ in joined])
        assert all(c.wait()[1] == "length" for _, c in joined)
        assert together == [torch.Size([3, 6])]  # left-padded, through torch's products
    finally:
        engine.close()
