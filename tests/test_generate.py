"""Decoding: greedy = argmax, top-k/top-p stay in their sets, KV cache = no cache, stops."""

from __future__ import annotations

import json

import pytest
import torch

from gptcli.config import ModelConfig
from gptcli.data.tokenizer import CharTokenizer, gpt2_tokenizer
from gptcli.infer.completion import TextStream, complete, encode_prompt, top_k_of
from gptcli.infer.generate import GREEDY, Sampling, draw_from, filter_logits, generate
from gptcli.model import GPT


@pytest.fixture(scope="module")
def model() -> GPT:
    torch.manual_seed(0)
    m = GPT(ModelConfig(vocab_size=23, block_size=12, n_layer=2, n_head=2, n_embd=16)).eval()
    with torch.no_grad():  # sharpen the random model so that its distributions are not flat
        m.lm_head.weight.mul_(40)
    return m


def naive_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """Argmax decoding the slow way: a full forward pass over the window at every step."""
    seq = list(prompt)
    for _ in range(n):
        logits, _ = model(torch.tensor([seq[-model.config.block_size :]]))
        seq.append(int(logits[0, -1].argmax()))
    return seq[len(prompt) :]


def naive_sliding_greedy(model: GPT, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding with a full forward pass at every step over a window that follows the
    documented policy on its own: once the text outgrows block_size, keep its last 3/4 block."""
    block = model.config.block_size
    keep = block * 3 // 4
    seq, start = list(prompt), max(0, len(prompt) - block)
    for _ in range(n):
        logits, _ = model(torch.tensor([seq[start:]]))
        seq.append(int(logits[0, -1].argmax()))
        if len(seq) - start > block:
            start = len(seq) - keep
    return seq[len(prompt) :]


def test_greedy_past_the_context_slides_the_window(model):
    for prompt in ([1, 5, 7], list(range(12)), list(range(2, 16))):  # short, exactly a block, longer
        got = [int(s.tokens[0]) for s in generate(model, prompt, 40, sampling=GREEDY)]
        assert got == naive_sliding_greedy(model, prompt, 40)


def test_the_cache_holds_what_the_prompt_and_new_tokens_need(model, monkeypatch):
    """Its first cache has room for the prompt and the new tokens, up to the window (and the
    whole window after a slide); the tokens are the same as without a cache."""
    import gptcli.infer.generate as gen

    sizes = []

    class Recorded(gen.KVCache):
        def __init__(self, config, batch_size, max_len, *args, **kwargs):
            sizes.append(max_len)
            super().__init__(config, batch_size, max_len, *args, **kwargs)

    monkeypatch.setattr(gen, "KVCache", Recorded)
    for prompt, n, want in (([1, 5, 7], 4, [7]), ([1, 5, 7], 9, [12]), ([1, 5, 7], 14, [12, 12])):
        sizes.clear()
        got = [int(s.tokens[0]) for s in generate(model, prompt, n, sampling=GREEDY)]
        assert sizes == want and got == naive_sliding_greedy(model, prompt, n)


def test_argmax_is_torchs_for_ties_nans_infinities_and_views():
    from gptcli.infer.generate import argmax

    rows = torch.randn(6, 50257)
    rows[1, [7, 9000]] = 50.0  # a tie: the first
    rows[2, 123] = float("nan")  # NaN wins, as in torch
    rows[3] = float("-inf")
    rows[4, [5, 6]] = float("inf")
    for logits in (rows, rows[:, ::3], rows[:1].expand(4, -1), rows[0], rows.T.contiguous().T):
        got = argmax(logits)
        assert got.dtype == torch.long and torch.equal(got, logits.argmax(dim=-1))


CONTINUED = [([2, 0, 1, 1], 1), ([0, 1, 2, 3], 0), ([3, 3, 3, 3], 3), ([1, 0, 3, 2], 0), ([0, 0, 1, 1], 2)]


@pytest.mark.parametrize("parents,copies", CONTINUED)
def test_beams_keep_their_cache_rows_where_they_can(parents, copies):
    """Each cache row goes to one beam, every beam gets a row, and only a row's second and
    later continuations are copied into another row."""
    from gptcli.infer.generate import _cache_rows

    order = _cache_rows(parents)
    assert sorted(order) == list(range(len(parents)))  # a permutation of the beams
    placed = [parents[beam] for beam in order]  # the row each cache row is filled from
    assert sum(src != row for row, src in enumerate(placed)) == copies


@pytest.mark.parametrize("rows,V,k", [(4, 50257, 8), (1, 7, 2), (3, 2, 6), (5, 23, 10)])
def test_top_of_all_is_topk_over_the_flattened_scores(rows, V, k):
    from gptcli.infer.generate import top_of_all

    scores = torch.randn(rows, V, generator=torch.Generator().manual_seed(V))
    scores[0, :2] = float("-inf")
    want = torch.topk(scores.view(-1), k)
    got = top_of_all(scores, k)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)


def test_temperature_zero_is_argmax_decoding(model):
    prompt = [1, 5, 7]
    got = [int(s.tokens[0]) for s in generate(model, prompt, 8, sampling=GREEDY)]
    assert got == naive_greedy(model, prompt, 8)


@pytest.mark.parametrize("n", [6, 30])  # 30 new tokens slide well past block_size = 12
def test_kv_cache_sampling_equals_no_cache_sampling(model, n):
    def run(use_cache: bool) -> list[list[int]]:
        g = torch.Generator().manual_seed(123)
        steps = generate(
            model, [2, 3, 4], n, num_samples=3, sampling=Sampling(1.3), generator=g, use_cache=use_cache
        )
        return torch.stack([s.tokens for s in steps], 1).tolist()

    assert run(True) == run(False)


def test_top_k_and_top_p_never_leave_their_sets(model):
    g = torch.Generator().manual_seed(0)
    for step in generate(model, [3], 25, num_samples=16, sampling=Sampling(top_k=3), generator=g):
        allowed = torch.topk(step.probs, 3, dim=-1).indices
        assert all(int(t) in allowed[i].tolist() for i, t in enumerate(step.tokens))
    g = torch.Generator().manual_seed(0)
    for step in generate(model, [3], 25, num_samples=16, sampling=Sampling(top_p=0.6), generator=g):
        for i, t in enumerate(step.tokens.tolist()):
            probs, order = torch.sort(step.probs[i], descending=True)
            mass_before = torch.cumsum(probs, 0) - probs
            nucleus = order[mass_before < 0.6].tolist()
            assert t in nucleus


def test_filter_logits_by_hand():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    assert torch.isinf(filter_logits(logits, top_k=2)[0, 2:]).all()
    assert torch.isfinite(filter_logits(logits, top_k=2)[0, :2]).all()
    probs = logits.softmax(-1)[0]  # 0.644, 0.237, 0.087, 0.032
    kept = torch.isfinite(filter_logits(logits, top_p=0.7)[0])
    assert kept.tolist() == [True, True, False, False]
    assert probs[0] < 0.7 < probs[0] + probs[1]
    # the top token always stays, however small top_p
    assert torch.isfinite(filter_logits(logits, top_p=0.01)[0]).tolist() == [True, False, False, False]


def test_sample_next_follows_temperature():
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    g = torch.Generator().manual_seed(0)
    freq = torch.bincount(Sampling(1.0).draw(logits, g), minlength=3) / 20000
    torch.testing.assert_close(freq, torch.tensor([0.7, 0.2, 0.1]), atol=0.015, rtol=0)
    # temperature 0.5: q proportional to p^2
    q = torch.tensor([0.49, 0.04, 0.01]) / 0.54
    freq = torch.bincount(Sampling(0.5).draw(logits, g), minlength=3) / 20000
    torch.testing.assert_close(freq, q, atol=0.015, rtol=0)


def test_draw_from_matches_its_distribution_and_never_draws_zero_mass():
    g = torch.Generator().manual_seed(0)

    def draws(q: torch.Tensor, n: int) -> torch.Tensor:
        return torch.cat([draw_from(q.expand(5000, -1), g) for _ in range(n // 5000)])

    # three likely ids among 8,192, the rest sharing 10%, some exactly 0
    V = 8192
    q = torch.full((V,), 0.1 / 7900)
    q[1000:1292] = 0.0
    q[[7, 300, V - 1]] = torch.tensor([0.5, 0.3, 0.1])
    ids = draws(q / q.sum(), 40000)
    assert ids.dtype == torch.long and ids.shape == (40000,)
    freq = torch.bincount(ids, minlength=V) / 40000
    torch.testing.assert_close(freq[[7, 300, V - 1]], (q / q.sum())[[7, 300, V - 1]], atol=0.01, rtol=0)
    assert not ((ids >= 1000) & (ids < 1292)).any()
    # a tail of tiny probabilities keeps its share: 1% spread over 8,191 ids
    q = torch.full((V,), 0.01 / (V - 1))
    q[0] = 0.99
    tail = (draws(q, 20000) > 0).float().mean().item()
    assert 0.0075 < tail < 0.0125
    # a vocabulary that is not a whole number of 1,024-id blocks, mass on the blocks' edges
    q = torch.zeros(3001)
    q[[1023, 1024, 3000]] = torch.tensor([0.25, 0.25, 0.5])
    freq = torch.bincount(draws(q, 20000), minlength=3001) / 20000
    torch.testing.assert_close(freq[[1023, 1024, 3000]], q[[1023, 1024, 3000]], atol=0.015, rtol=0)
    assert freq.sum() == 1 and freq[[1023, 1024, 3000]].sum() == 1
    # one-hot rows always give their id; the same seed, the same draws
    assert draw_from(torch.eye(5), g).tolist() == [0, 1, 2, 3, 4]
    rows = torch.softmax(torch.randn(4, 100, generator=g), -1)
    a = draw_from(rows, torch.Generator().manual_seed(3))
    assert torch.equal(a, draw_from(rows, torch.Generator().manual_seed(3)))


def test_padded_vocabulary_ids_are_never_sampled():
    torch.manual_seed(1)
    m = GPT(ModelConfig(vocab_size=40, block_size=8, n_layer=1, n_head=1, n_embd=8)).eval()
    with torch.no_grad():
        m.lm_head.weight[30:] += 5.0  # make the padding rows attractive
    g = torch.Generator().manual_seed(0)
    for step in generate(m, [1], 10, num_samples=8, generator=g, vocab_size=30):
        assert (step.tokens < 30).all()


def test_plain_sampling_takes_the_softmax_of_the_logits_to_the_same_bits():
    """At temperature 1 without top-k or top-p, q is softmax(logits) as they are: the same
    bits as the max subtracted first (what every other temperature does), so seeded draws
    stay what they were."""
    torch.manual_seed(0)
    for rows in (1, 16):
        x = torch.randn(rows, 50257) * 4 + 3
        shifted = (x - x.max(dim=-1, keepdim=True).values) / 1.0
        assert torch.equal(Sampling(temperature=1.0).distribution(x), shifted.softmax(-1))


def test_text_stream_stops_at_a_stop_string_and_holds_back_its_prefix():
    tok = CharTokenizer(list("abcdefgh \n"))
    stream = TextStream(tok, stops=["cde"])
    deltas = [stream.push(i) for i in tok.encode("abcdefg")]
    assert deltas[:2] == ["a", "b"]
    assert deltas[2] == ""  # "c" might start "cde": held back
    assert "".join(deltas) == "ab" and stream.finish == "stop" and stream.text == "ab"


def test_text_stream_cuts_before_the_first_stop_string_whatever_the_order_of_the_list():
    """Stops that complete with the same token: the text ends before the earliest, so it
    holds none of them (it ended before the one listed first, and held an earlier one)."""
    import random

    tok = gpt2_tokenizer()
    ids = tok.encode(" caught a mouse because")
    for stops in (["use", "mo"], ["mo", "use"]):
        stream = TextStream(tok, stops=stops)
        out = "".join(stream.push(i) for i in ids)
        assert out == stream.text == " caught a " and stream.finish == "stop", stops

    chars = CharTokenizer(list("abc"))  # one character a token: a reference by prefixes
    rng = random.Random(0)
    for _ in range(2000):
        text = "".join(rng.choice("abc") for _ in range(12))
        stops = ["".join(rng.choice("abc") for _ in range(rng.randint(1, 4))) for _ in range(3)]
        end = next((e for e in range(1, 13) if any(text[:e].endswith(s) for s in stops)), None)
        want = text if end is None else text[: min(end - len(s) for s in stops if text[:end].endswith(s))]
        stream = TextStream(chars, stops=stops)
        out = "".join(stream.push(i) for i in chars.encode(text)) + stream.close()
        assert out == stream.text == want and not any(s in out for s in stops), (text, stops)


def test_text_stream_ends_at_end_of_text_and_joins_partial_characters():
    tok = gpt2_tokenizer()
    stream = TextStream(tok)
    ids = tok.encode("hi 🐇 there")
    deltas = [stream.push(i) for i in ids]
    assert all("\ufffd" not in d for d in deltas)  # bytes of the emoji wait for each other
    assert stream.push(tok.eot_id) == "" and stream.finish == "eot"
    assert "".join(deltas) == "hi 🐇 there" == stream.text


def test_text_stream_decodes_each_token_once_and_gives_the_whole_decoding():
    """Random GPT-2 ids (bytes of characters split across tokens, invalid sequences): each
    step hands out a prefix of the whole decoding so far, the deltas join into it, and the
    ids decoded along the way stay a few per token, not the whole text again each time."""
    import random

    tok = gpt2_tokenizer()
    decoded = 0
    real = tok.decode

    def counting(ids):
        nonlocal decoded
        decoded += len(ids)
        return real(ids)

    rng = random.Random(0)
    text = "naïve 🐇 façade, 東京 — " * 40
    ids = tok.encode(text) + [rng.randrange(256) for _ in range(200)]  # single bytes, some invalid
    stream = TextStream(tok, stops=["never there"])
    tok.decode = counting
    out = ""
    for i, token in enumerate(ids):
        out += stream.push(token)
        assert real(ids[: i + 1]).startswith(out)
    out += stream.close()
    assert out == real(ids) == stream.text
    assert decoded < 12 * len(ids) + len(ids)  # the close decodes the whole once


def test_text_stream_reads_a_token_in_its_context():
    """A decoder that drops the space a token starts with at the start of a text (as
    sentencepiece's does): the stream gives the whole decoding's spaces."""
    pieces = ["▁the", "▁cat", "s", "▁sat", "."]

    class Spaced:
        end_ids: tuple[int, ...] = ()

        def decode(self, ids):
            return "".join(pieces[i] for i in ids).replace("▁", " ").removeprefix(" ")

    stream = TextStream(Spaced())
    deltas = [stream.push(i) for i in [0, 1, 2, 3, 4]]
    assert "".join(deltas) + stream.close() == "the cats sat." == Spaced().decode([0, 1, 2, 3, 4])
    assert deltas[1] == " cat"


def test_complete_stops_each_sample_on_its_own(model):
    tok = CharTokenizer(list("abcdefghijklmnopqrstuvw"))
    results = complete(
        model,
        tok,
        encode_prompt(tok, "abc", 12),
        max_new_tokens=20,
        num_samples=4,
        seed=3,
        stops=["e"],
        show_probs=2,
    )
    assert len(results) == 4
    for r in results:
        assert "e" not in r.text
        assert r.finish in ("stop", "length")
        assert len(r.steps) == len(r.ids) or r.finish == "stop"
        assert all(len(s.ids) == 2 for s in r.steps)
    again = complete(
        model, tok, encode_prompt(tok, "abc", 12), max_new_tokens=20, num_samples=4, seed=3, stops=["e"]
    )
    assert [r.text for r in again] == [r.text for r in results]  # --seed reproduces


def test_prompts_default_to_start_of_document_and_are_cut_from_the_left():
    assert encode_prompt(gpt2_tokenizer(), None, 1024).ids == [50256]
    char = CharTokenizer(list("ab\n"))
    assert encode_prompt(char, "", 8).ids == [2]  # no end-of-text token: a newline
    p = encode_prompt(char, "ab" * 10, 8)
    assert len(p.ids) == 8 and p.dropped == 12 and p.text == char.decode(p.ids)


def test_top_k_of_reports_the_rank_of_the_chosen_token():
    probs = torch.tensor([0.1, 0.5, 0.3, 0.1])
    t = top_k_of(probs, 2, chosen=2)
    assert t.ids == [1, 2] and t.chosen_rank == 2 and t.chosen_prob == pytest.approx(0.3)


def test_impossible_sampling_settings_are_refused():
    for kwargs in (
        {"temperature": -1.0}, {"temperature": float("nan")}, {"top_k": 0}, {"top_p": 0.0}, {"top_p": 1.5},
    ):  # fmt: skip
        with pytest.raises(ValueError, match="need temperature >= 0"):
            Sampling(**kwargs)


def test_sampling_says_when_it_reshapes_p():
    assert not Sampling().reshapes and not GREEDY.reshapes and not Sampling(0.0, top_k=3).reshapes
    assert Sampling(0.7).reshapes and Sampling(top_k=3).reshapes and Sampling(top_p=0.9).reshapes
    assert not Sampling(top_p=1.0).reshapes
    assert Sampling(0.7, 3, 0.9).describe() == "T=0.7, top-k 3, top-p 0.9" and Sampling().describe() == ""


@pytest.fixture(scope="module")
def decoder_model():
    """A small model with weights large enough that its greedy choices are clear-cut."""
    from gptcli.config import ModelConfig
    from gptcli.model import GPT

    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=97, block_size=32, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("ahead", [True, False], ids=["ahead-as-on-cuda", "cpu"])
def test_compiled_decoding_queues_each_tokens_next_step_before_yielding_it(decoder_model, monkeypatch, ahead):
    """--compile on CUDA decodes a step ahead of its caller (the host's part of a token then
    runs while the device computes the next): when token t is yielded, the step that feeds it
    is already asked for, and none after the last token; on the CPU, where that step is the
    host's own work, only once the caller asks for the next token. The tokens, read on the
    host, and the logits are eager decoding's, with sampling too, across window slides."""
    from gptcli.infer import generate as gen
    from gptcli.infer.generate import row_generators

    fed: list[list[int]] = []
    push = gen._Context.push

    def step(device):  # the compiled step's stand-in: eager, over the same static cache
        return lambda model, tokens, cache: model.next_logits(tokens, kv_cache=cache)

    def pushed(ctx, tokens):
        fed.append(tokens.tolist())
        return push(ctx, tokens)

    monkeypatch.setattr(gen, "compiled_step", step)
    monkeypatch.setattr(gen._Context, "push", pushed)
    monkeypatch.setattr(gen, "runs_ahead", lambda device: ahead)
    prompt = [5, 17, 42, 3]
    it = generate(decoder_model, prompt, 40, num_samples=2, sampling=GREEDY, compile=True)
    first = next(it)
    assert first.tokens.device.type == "cpu"
    assert fed == ([first.tokens.tolist()] if ahead else [])  # (asked for before the caller saw it)
    steps = [first, *it]
    assert len(fed) == 39  # (a step for each token but the last)
    eager = list(generate(decoder_model, prompt, 40, num_samples=2, sampling=GREEDY))
    assert [s.tokens.tolist() for s in steps] == [s.tokens.tolist() for s in eager]
    torch.testing.assert_close(torch.stack([s.logits for s in steps]), torch.stack([s.logits for s in eager]))
    drawn = Sampling(temperature=0.9, top_k=20)

    def sampled(compile: bool) -> list[list[int]]:
        gens = row_generators(7, 2)
        steps = generate(
            decoder_model, prompt, 40, num_samples=2, sampling=drawn, generator=gens, compile=compile
        )
        return [s.tokens.tolist() for s in steps]

    assert sampled(True) == sampled(False)


def test_compiled_decoding_runs_ahead_on_cuda_alone():
    from gptcli.infer.generate import runs_ahead

    assert runs_ahead(torch.device("cuda", 1))
    assert not any(runs_ahead(torch.device(d)) for d in ("cpu", "mps", "meta"))


def test_compiled_static_cache_decoding_gives_the_eager_tokens(decoder_model):
    """--compile's path (a static KV cache, a compiled one-token step) in fp32: the same
    greedy tokens as eager decoding, across a window slide (60 tokens, block 32) and for
    several rows, and the same beams; after warm-up, 200 more steps compile nothing new."""
    import torch._dynamo

    from gptcli.infer.generate import beam_search

    prompt = [5, 17, 42, 3]

    def greedy(compile: bool, n: int = 60, rows: int = 1) -> list[list[int]]:
        steps = generate(decoder_model, prompt, n, num_samples=rows, sampling=GREEDY, compile=compile)
        return [s.tokens.tolist() for s in steps]

    assert greedy(True) == greedy(False)
    assert greedy(True, rows=3) == greedy(False, rows=3)
    eager = [(h.ids, h.score) for h in beam_search(decoder_model, prompt, 3, 20)]
    compiled = [(h.ids, h.score) for h in beam_search(decoder_model, prompt, 3, 20, compile=True)]
    assert [ids for ids, _ in compiled] == [ids for ids, _ in eager]
    assert [s for _, s in compiled] == pytest.approx([s for _, s in eager], abs=1e-4)
    torch._dynamo.config.error_on_recompile = True
    try:
        assert greedy(True, n=200) == greedy(False, n=200)  # several slides, no new graph
    finally:
        torch._dynamo.config.error_on_recompile = False


def test_sample_and_beam_take_compile_and_give_the_same_text(trained):
    from tests.helpers import run

    said: list[str] = []  # (a compile keeps a command silent for up to a minute: it says so, on stderr)

    def sample(*flag: str) -> dict:
        args = ["--prompt", "The fox", "--temp", "0", "--max-new-tokens", "30", "--dtype", "fp32", "--json"]
        result = run("sample", "--ckpt", trained, *args, *flag)
        assert result.exit_code == 0, result.output
        said.append(result.stderr)
        return json.loads(result.stdout)

    assert sample("--compile") == sample("--no-compile") == sample()
    beams = []
    for flag in ("--compile", "--no-compile"):
        result = run("beam", "The fox", "--ckpt", trained, "--beams", "3", "--json", flag)
        said.append(result.stderr)
        beams.append(json.loads(result.stdout)["hypotheses"])
    assert [h["ids"] for h in beams[0]] == [h["ids"] for h in beams[1]]
    compiling = ["compiling the decoding step (torch.compile" in err for err in said]
    assert compiling == [True, False, False, True, False], said


def test_a_run_asks_for_about_the_budget_read_when_it_is_asked(monkeypatch):
    """run_length: steps of `seconds / steps` each filling about RUN_SECONDS (as the module
    holds it at the call, so a test or a caller can change it), at least 1, at most MAX_RUN."""
    import gptcli.infer.generate as generate_module

    assert generate_module.run_length(0.01, 1) == int(generate_module.RUN_SECONDS / 0.01)
    assert generate_module.run_length(0.01, 1, budget=0.05) == 5
    assert generate_module.run_length(10.0, 1) == 1
    monkeypatch.setattr(generate_module, "RUN_SECONDS", 1e9)
    assert generate_module.run_length(10.0, 1) == generate_module.MAX_RUN
