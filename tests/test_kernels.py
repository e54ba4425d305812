"""The CPU decoding step (gptcli/infer/decode.c): the same logits and KV cache as the
model's own code for every dtype, row count and cache length it takes; built once, cached
by what it was built from, and never in the way when it cannot be built."""

from __future__ import annotations

import ctypes
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from gptcli.config import ModelConfig
from gptcli.files import DiskFull
from gptcli.infer import generate as generate_module
from gptcli.infer import kernels
from gptcli.infer.generate import GREEDY, SAMPLE, Sampling, draw_from, generate, inverse_cdf
from gptcli.infer.quantize import Int8Linear, quantize
from gptcli.model import GPT, KVCache
from tests.helpers import run

pytestmark = pytest.mark.skipif(kernels._compiler() is None, reason="no C compiler on this machine")


def small_model(
    dtype: torch.dtype, n_embd: int = 64, n_head: int = 2, int8: bool = False, bias: bool = True
) -> GPT:
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=97, block_size=48, n_layer=2, n_head=n_head, n_embd=n_embd, bias=bias)
    model = GPT(config).eval().to(dtype)
    with torch.no_grad():  # LayerNorms and biases away from 1 and 0, as in a trained model
        for name, p in model.named_parameters():
            if "ln" in name or name.endswith("bias"):
                p.add_(torch.randn_like(p) * 0.1)
    return quantize(model) if int8 else model


def library() -> ctypes.CDLL:
    kernels.LIBRARY.start()
    lib = kernels.LIBRARY.wait()
    assert lib is not None, kernels.LIBRARY.failed
    return lib


def use_isa(isa: str, tmp_path: Path, monkeypatch) -> None:
    """Decode, from here on in this test, through the library as built for isa (kernels.ISAS)."""
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library(kernels.isa_flags(isa)))


def stub_source(tmp_path: Path) -> Path:
    """A C file with the library's names, built in a moment where decode.c takes seconds."""
    stub = tmp_path / "stub.c"
    stub.write_text("".join(f"int {name}(void) {{ return -1; }}\n" for name in kernels.FUNCTIONS))
    return stub


def steps_both_ways(model: GPT, rows: int, prompt_len: int, steps: int, padded: bool, reorder: bool = False):
    """Logits and caches after `steps` one-token steps, by the model's code and by the C step.
    reorder: the rows reordered after every step, as beam search does (the C step then reads
    each slot from the row the cache's `sources` names; the model's code settles first)."""
    g = torch.Generator().manual_seed(rows * 100 + prompt_len)
    idx = torch.randint(0, 97, (rows, prompt_len), generator=g)
    mask = None
    if padded:  # left padding of different lengths, as a batch of prompts has
        mask = torch.ones(rows, prompt_len, dtype=torch.long)
        for r in range(rows):
            mask[r, : r % 3 if rows > 1 else 2] = 0
    dtype = model.transformer.wte.weight.dtype
    out = []
    for step in (GPT.next_logits, model.next_logits):
        cache = KVCache(model.config, rows, prompt_len + steps, dtype=dtype)
        logits = []
        with torch.no_grad():
            GPT.next_logits(model, idx, kv_cache=cache, attention_mask=mask)
            for i in range(steps):
                new = torch.randint(0, 97, (rows, 1), generator=torch.Generator().manual_seed(i))
                logits.append(
                    step(model, new, kv_cache=cache) if step is GPT.next_logits else step(new, kv_cache=cache)
                )
                if reorder:
                    cache.reorder(torch.randint(0, rows, (rows,), generator=torch.Generator().manual_seed(i)))
        cache.settle()
        out.append((torch.stack(logits).float(), cache))
    return out


# the products' row counts by their number of sums per row (AVX-512: 1 and 2 rows: 4; 3 to 8:
# 2; 9 to 16: 1; AVX2's packed bf16, in groups of up to 6 rows: 1 row: 2 sums for each of 4
# blocks; 2 rows: 2 a block; 3: 1 a block, in C; 4 to 6: 1 a block, in assembly, 4 rows alone
# 3 blocks at once, the blocks left over one at a time, in C); 9, 11, 13,
# 20 and 32 rows: a block's products in several passes (of 16, or of 6 and then 3, 5, 1 or 2)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 13, 16, 20, 32])
@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8"])
# 48: widths that fit no 16-key or 32-column vector; 50: an odd number of input pairs (the
# products' sums split over alternate pairs end on a lone pair); 45: odd, so bf16 weights are
# read as stored
@pytest.mark.parametrize("shape", [(64, 2), (48, 2), (50, 2), (45, 3)])
def test_the_c_step_gives_the_models_logits_and_cache(rows, kind, shape, two_threads):
    check_the_c_step(rows, kind, shape)


@pytest.mark.parametrize("rows", [1, 4])
@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8"])
def test_a_model_trained_without_biases_gives_the_models_logits(rows, kind, two_threads):
    """--no-bias: LayerNorms and products with no bias (the step read a LayerNorm's absent bias
    through a null pointer)."""
    check_the_c_step(rows, kind, (64, 2), bias=False)


@pytest.fixture
def two_threads():
    """Two threads for the C step, whatever the machine has (or the suite's workers leave
    each: conftest): which outputs and rows each thread takes depends on how many share them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 9, 16])
def test_rows_of_a_bf16_cache_attended_whole_give_the_models_logits(rows, two_threads):
    """Heads of 64 in a bf16 cache, 2 threads: where the larger share of rows is at most a
    quarter above the mean (2, 4, 9, 16), each row's keys are read as one stream and its
    values 4 heads at a time (attend_rows; 5 heads: a pass of 4, then one); 3 rows by (row,
    head) pairs, one by its slots (attend_split); with padding masks and the rows reordered as
    beams are."""
    check_the_c_step(rows, "bf16", (320, 5), sharp=True)


@pytest.mark.parametrize("threads", [2, 3])
def test_one_row_of_a_bf16_cache_attended_by_its_slots_gives_the_models_logits(threads):
    """One row, heads of 64 in a bf16 cache: the threads share its slots (attend_split), each
    attending to its part, then the parts weighed together; 3 threads (uneven parts), and a
    padded prompt (masked slots in the first part only)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        check_the_c_step(1, "bf16", (320, 5), sharp=True)
        check_the_c_step(1, "bf16", (320, 5), sharp=True, padded=True)
    finally:
        torch.set_num_threads(before)


def check_the_c_step(
    rows: int, kind: str, shape: tuple[int, int], sharp: bool = False, bias: bool = True, padded: bool = False
) -> None:
    library()
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    model = small_model(dtype, *shape, int8=kind == "int8", bias=bias)
    if sharp:  # queries and keys 6x as large: attention far from uniform, as in a trained model
        with torch.no_grad():
            for block in model.transformer.h:
                block.attn.c_attn.weight[: 2 * shape[0]].mul_(6)
    assert kernels.use_fast_decode(model)
    # a prompt of 20 and 4 steps: attention over more than 16 positions (the 16-key blocks); the
    # rows reordered between steps as beams are
    both = steps_both_ways(model, rows, 20, 4, padded=padded or rows > 1, reorder=rows > 1)
    (want, want_cache), (got, got_cache) = both
    decoder = model.__dict__["_decoder"]  # the C step ran
    stored = {"bf16": kernels.BF16, "int8": kernels.I8}.get(kind)
    if stored is not None and library().gptcli_packs(stored):  # and read packed copies of the weights
        even = shape[0] % 2 == 0
        assert all(bool(layer.attn.packed) == even and layer.out.packed for layer in decoder.layers)
        assert bool(decoder.model.head.packed) == even
    if kind == "bf16":  # activations rounded to bf16 at different points: within bf16 rounding
        # (sharp: within 0.8% of the largest here; a scale of 1/7 for 1/8 strays 2.5% to 3%)
        tol = dict(atol=(0.015 if sharp else 0.03) * want.abs().max().item(), rtol=0)
        assert (got.argmax(-1) == want.argmax(-1)).float().mean() >= 0.9
    else:  # (int8 with VNNI: activations as int16, within 1/65,534 of their row's largest here)
        tol = dict(atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    for got_t, want_t in ((got_cache.k, want_cache.k), (got_cache.v, want_cache.v)):
        if sharp:  # (keys 6x as large as the logits: within bf16 rounding of their own size)
            tol = dict(atol=0.03 * want_t.float().abs().max().item(), rtol=0)
        torch.testing.assert_close(got_t.float(), want_t.float(), **tol)
    assert got_cache.pos == want_cache.pos == 24


# 45: bf16 weights read as stored; 320 in 5 heads of 64: a bf16 cache's rows (the prompt's
# tokens) attended whole (attend_rows)
PREFILLS = [(kind, shape) for kind in ("fp32", "bf16", "int8") for shape in ((64, 2), (45, 3))]


@pytest.mark.parametrize("kind, shape", [*PREFILLS, ("bf16", (320, 5))])
def test_the_c_prefill_gives_the_models_logits_and_cache(kind, shape, monkeypatch, two_threads):
    """A prompt of one row encoded by the C prefill (its tokens in calls of PREFILL_ROWS, each
    attending to the slots before it, causally), after what a cache already holds, then
    decoded on by the C step: the model's logits and cache all along."""
    library()
    monkeypatch.setattr(kernels, "PREFILL_ROWS", 16)  # (the tiny model's block is 48)
    dtype = torch.bfloat16 if kind == "bf16" else torch.float32
    model = small_model(dtype, *shape, int8=kind == "int8")
    assert kernels.use_fast_decode(model)
    prefills = []
    real = kernels.Decoder.prefill
    monkeypatch.setattr(kernels.Decoder, "prefill", lambda self, *a: prefills.append(1) or real(self, *a))
    g = torch.Generator().manual_seed(7)
    parts = [torch.randint(0, 97, (1, n), generator=g) for n in (2, 17, 16, 5)]  # 40 slots, then 4 steps
    steps = [torch.randint(0, 97, (1, 1), generator=g) for _ in range(4)]
    out = []
    for fast in (False, True):
        cache = KVCache(model.config, 1, 44, dtype=dtype)
        logits = []
        with torch.no_grad():
            for x in parts + steps:
                logits.append(
                    model.next_logits(x, kv_cache=cache)
                    if fast
                    else GPT.next_logits(model, x, kv_cache=cache)
                )
        out.append((torch.cat(logits).float(), cache))
    (want, want_cache), (got, got_cache) = out
    assert len(prefills) == 4  # every part of the prompt through the C prefill
    if kind == "bf16":
        tol = dict(atol=0.03 * want.abs().max().item(), rtol=0)
    else:
        tol = dict(atol=2e-5, rtol=1e-5)
    torch.testing.assert_close(got, want, **tol)
    torch.testing.assert_close(got_cache.k.float(), want_cache.k.float(), **tol)
    torch.testing.assert_close(got_cache.v.float(), want_cache.v.float(), **tol)
    assert got_cache.pos == want_cache.pos == 44


def test_rows_the_cache_does_not_have_are_refused_as_the_models_code_refuses_them():
    """A step of 4 rows on a cache of one row: the model's own error, nothing written past the
    cache (the C step stored the keys of rows the cache does not have)."""
    library()
    model = small_model(torch.float32)
    assert kernels.use_fast_decode(model)
    cache = KVCache(model.config, 1, 10)
    with torch.no_grad():
        model.next_logits(torch.tensor([[1, 2, 3]]), kv_cache=cache)
        with pytest.raises(RuntimeError, match="must match"):
            model.next_logits(torch.tensor([[5], [6], [7], [8]]), kv_cache=cache)


def test_ids_outside_the_vocabulary_are_refused_before_anything_is_stored():
    """The C step and prefill read the embeddings at each id: one outside them is an
    IndexError, as the model's own embedding raises, with the cache as it was."""
    library()
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    with torch.no_grad():
        for ids in ([[1, 97]], [[-1, 3, 4]], [[97]], [[5], [-2]]):
            cache = KVCache(model.config, len(ids), 20)
            before = cache.k.clone()
            with pytest.raises(IndexError, match="outside the model's embeddings"):
                model.next_logits(torch.tensor(ids), kv_cache=cache)
            assert cache.pos == 0 and torch.equal(cache.k, before)
        assert "_decoder" in model.__dict__  # (the C path was the one asked)


def test_long_prompts_from_weights_read_as_stored_keep_the_models_code(monkeypatch):
    """Past STORED_PREFILL tokens, a model whose products read their weights as stored (fp32)
    encodes its prompt with torch's products, which are faster there; packed ones never."""
    library()
    monkeypatch.setattr(kernels, "STORED_PREFILL", 8)
    prefills = []
    real = kernels.Decoder.prefill
    monkeypatch.setattr(
        kernels.Decoder, "prefill", lambda self, *a: prefills.append(a[1].numel()) or real(self, *a)
    )
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    with torch.no_grad():
        for n in (8, 9):
            model.next_logits(torch.arange(n)[None], kv_cache=KVCache(model.config, 1, 20))
    assert prefills == [8]
    packed = small_model(torch.bfloat16)
    kernels.use_fast_decode(packed)
    with torch.no_grad():
        packed.next_logits(
            torch.arange(9)[None], kv_cache=KVCache(packed.config, 1, 20, dtype=torch.bfloat16)
        )
    assert prefills == ([8, 9] if packed.__dict__["_decoder"].packed else [8])


@pytest.mark.parametrize("isa", kernels.ISAS)
def test_every_instruction_set_path_gives_the_models_logits(isa, tmp_path, monkeypatch, two_threads):
    """The library as it is built for other CPUs (AVX-512 without BF16, AVX2, none), run
    here where this CPU has the instructions: the same logits, in every dtype and row count."""
    if not kernels.cpu_has_isa(isa):
        pytest.skip(f"this CPU lacks {isa}")
    use_isa(isa, tmp_path, monkeypatch)
    library()
    for kind in ("fp32", "bf16", "int8"):
        for rows in (1, 5):
            model = small_model(torch.bfloat16 if kind == "bf16" else torch.float32, int8=kind == "int8")
            assert kernels.use_fast_decode(model)
            (want, _), (got, cache) = steps_both_ways(model, rows, 20, 3, padded=rows > 1, reorder=rows > 1)
            assert "_decoder" in model.__dict__
            tol = 0.03 * want.abs().max().item() if kind == "bf16" else 2e-5
            torch.testing.assert_close(got, want, atol=tol, rtol=1e-5, msg=f"{isa} {kind} rows={rows}")
            assert cache.pos == 23


@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_int8_products_keep_a_nan_activation_nan(isa, tmp_path, monkeypatch):
    """int8 products multiply the activations as int16 with a scale a row: a row holding a
    NaN gives NaN logits, as the model's own code does, not finite ones."""
    if isa != "native":
        if not kernels.cpu_has_isa(isa):
            pytest.skip(f"this CPU lacks {isa}")
        use_isa(isa, tmp_path, monkeypatch)
    library()
    model = small_model(torch.float32, int8=True)
    with torch.no_grad():
        model.transformer.ln_f.weight[0] = float("nan")  # every row's input to the unembedding
    assert kernels.use_fast_decode(model)
    (want, _), (got, _) = steps_both_ways(model, 2, 5, 2, padded=False)
    assert want.isnan().all() and got.isnan().all()
    assert "_decoder" in model.__dict__  # (the C step ran)


def test_greedy_fp32_decoding_gives_the_same_tokens_as_the_model(trained):
    library()
    from gptcli.store.loading import load

    stock, fast = load(str(trained)).model.eval(), load(str(trained)).model.eval()
    assert kernels.use_fast_decode(fast)
    prompt = [3, 1, 4, 1, 5]
    with torch.no_grad():
        want = [int(s.tokens[0]) for s in generate(stock, prompt, 60, sampling=GREEDY)]
        got = [int(s.tokens[0]) for s in generate(fast, prompt, 60, sampling=GREEDY)]
    assert got == want


def lively_model(kind: str) -> GPT:
    """small_model with every weight moved (many different ids come out), its embeddings
    padded from id 90 on, where the padding's unembedding (real ids' rows, scaled up) would
    often win."""
    model = small_model(torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3)
        model.lm_head.weight[90:] = 4 * model.lm_head.weight[:7]  # (tied: those ids are never fed)
    return quantize(model) if kind == "int8" else model.to({"bf16": torch.bfloat16}.get(kind, torch.float32))


def decode_both_ways(
    model: GPT, sampling: Sampling, monkeypatch, n: int = 60, stop: int | None = None, **kwargs
):
    """(ids, logits, the generator's state after) of generate() one step a call (no runs at
    all), then in runs of C steps, and the runs' ids (kernels.run_steps); stop: leave the
    loop after that many Steps."""
    real, runs, decodes = kernels.run_steps, [], kernels.decodes

    def spy(*args, **kwargs):
        got = real(*args, **kwargs)
        runs.append(None if got is None else got[0].tolist())
        return got

    monkeypatch.setattr(kernels, "run_steps", spy)
    monkeypatch.setattr(generate_module, "RUN_SECONDS", 1e9)  # (runs of MAX_RUN steps, whatever the load)
    out = []
    for one_at_a_time in (True, False):
        monkeypatch.setattr(kernels, "decodes", (lambda m: False) if one_at_a_time else decodes)
        g = torch.Generator().manual_seed(7)
        steps = []
        for step in generate(
            model, [3, 1, 4, 1, 5], n, sampling=sampling, vocab_size=90, generator=[g], **kwargs
        ):
            steps.append(step)
            if len(steps) == stop:
                break
        out.append(([int(s.tokens[0]) for s in steps], torch.cat([s.logits for s in steps]), g.get_state()))
    return out[0], out[1], runs


@pytest.mark.parametrize("how", ["greedy", "T=1", "T=0.6"])
@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8"])
def test_runs_of_steps_in_one_c_call_are_the_steps_one_at_a_time(kind, how, monkeypatch, two_threads):
    """One sequence, greedy or drawn from the logits, runs several C steps a call
    (kernels.run_steps): the same ids and the same logits, to the bit, as one step a call
    (drawn: the same generator's uniforms, in the same order); across window slides (60
    tokens, block 48); never an id of the embeddings' padding, which here would often win; a
    run ends just after an end id it is given."""
    library()
    model = lively_model(kind)
    assert kernels.use_fast_decode(model)
    sampling = GREEDY if how == "greedy" else Sampling(temperature=float(how[2:]))
    (want, want_logits, want_state), (got, logits, state), runs = decode_both_ways(
        model, sampling, monkeypatch
    )
    assert got == want and torch.equal(logits, want_logits) and torch.equal(state, want_state)
    # (the first id comes from the prompt's logits, and the steps that slide the window by push)
    assert max(map(len, runs)) > 1 and sum(map(len, runs)) >= 55 and len(set(got)) > 5
    assert max(got) < 90 and logits[:, 90:].eq(float("-inf")).all()
    with torch.no_grad():  # the padding would have won: the model's own argmax over every id
        seq = torch.tensor([[3, 1, 4, 1, 5, *got[:40]]])
        assert (model(seq)[0][0, 4:].argmax(-1) >= 90).any()

    end = got[20]
    (want, _, _), (got, _, _), runs = decode_both_ways(model, sampling, monkeypatch, end_ids=[end])
    assert got == want and all(end not in run[:-1] for run in runs) and any(run[-1] == end for run in runs)
    # left in the middle of a run: the generator where one step at a time leaves it
    (want, _, want_state), (got, _, state), runs = decode_both_ways(model, sampling, monkeypatch, stop=13)
    assert got == want and torch.equal(state, want_state) and sum(map(len, runs)) > 13

    cache = KVCache(model.config, 2, 16, dtype=model.transformer.wte.weight.dtype)
    assert kernels.run_steps(model, torch.tensor([[1]]), cache, 4, 90) is None  # two rows
    stock = small_model(torch.float32)  # (no C step)
    assert kernels.run_steps(stock, torch.tensor([[1]]), KVCache(stock.config, 1, 16), 4, 90) is None


def test_a_run_ends_where_a_row_has_nothing_to_draw_from_and_torch_draws_it(monkeypatch, two_threads):
    """NaN logits from position 13 on: the C draw refuses the row, the run ends there with id
    -1 (after steps it drew), and torch's draw takes that row at its uniform, as one step at
    a time does."""
    library()
    model = lively_model("fp32")
    with torch.no_grad():
        model.transformer.wpe.weight[13] = float("nan")
    assert kernels.use_fast_decode(model)
    (want, _, want_state), (got, _, state), runs = decode_both_ways(model, SAMPLE, monkeypatch, n=16)
    assert got == want and torch.equal(state, want_state)
    assert any(len(run) > 1 and run[-1] == -1 and min(run[:-1]) >= 0 for run in runs)


@pytest.mark.parametrize("beams", [1, 2, 4, 5])
@pytest.mark.parametrize("kind", ["fp32", "bf16", "int8"])
def test_runs_of_beam_steps_in_one_c_call_find_the_beams_of_one_step_at_a_time(kind, beams, monkeypatch):
    """Beam search runs several C steps a call (kernels.beam_steps), which take the beams on
    by beam_search's rules in C: the same hypotheses, log-probabilities and scores, to the
    bit, as one step a call; with hypotheses ending at an end id (the final LayerNorm tilted
    towards it), length penalties, and the embeddings' padding, which never ranks."""
    library()
    model = lively_model(kind)
    end = 7
    with torch.no_grad():
        e = model.transformer.wte.weight[end].float()
        model.transformer.ln_f.bias.add_((3.0 * e / e.norm() ** 2).to(model.transformer.ln_f.bias.dtype))
    assert kernels.use_fast_decode(model)
    from gptcli.infer.generate import beam_search

    real, runs, caches = kernels.beam_steps, [], []

    def spy(one_at_a_time: bool):
        def step(model, tokens, cache, *args):
            got = None if one_at_a_time else real(model, tokens, cache, *args)
            runs.append(0 if got is None else got[0].size(0))
            caches.append(cache)
            return got

        return step

    monkeypatch.setattr(generate_module, "RUN_SECONDS", 1e9)  # (runs of MAX_RUN steps, whatever the load)
    ended_early = 0
    for prompt, alpha, n in (([3, 1, 4, 1, 5], 1.0, 30), ([9], 0.5, 40), ([2, 7, 1, 8], 2.0, 20)):
        found, fed = [], []
        for one_at_a_time in (True, False):
            caches.clear()
            monkeypatch.setattr(kernels, "beam_steps", spy(one_at_a_time))
            hyps = beam_search(model, prompt, beams, n, length_penalty=alpha, end_ids=[end], vocab_size=90)
            found.append([(h.ids, h.logprob, h.score, h.finished) for h in hyps])
            fed.append(caches[-1].pos if caches else None)
        assert found[1] == found[0]
        assert fed[1] == fed[0]  # (the runs stopped where the search did: no step past it)
        assert all(max(ids) < 90 for ids, *_ in found[1])
        ended_early += any(finished and len(ids) < n for ids, _, _, finished in found[1])
    assert ended_early and max(runs) > 1
    cache = KVCache(model.config, 2, 16, dtype=model.transformer.wte.weight.dtype)  # (no beams' sources)
    assert real(model, torch.tensor([[1], [2]]), cache, 4, 90, [], 0, torch.zeros(2), 4) is None


@pytest.mark.parametrize("beams", [2, 4])
def test_beams_through_the_c_step_find_what_the_models_code_finds(beams):
    """Beam search reads each beam's history where it was written (no rows copied): the
    same hypotheses and scores as through the model's own code, which copies them (fp32;
    histories past 16 slots, the 16-key blocks)."""
    library()
    from gptcli.infer.generate import beam_search

    stock, fast = small_model(torch.float32), small_model(torch.float32)
    assert kernels.use_fast_decode(fast)
    for prompt in ([3, 1, 4, 1, 5], [7]):
        want = beam_search(stock, prompt, beams, 40, end_ids=[])
        got = beam_search(fast, prompt, beams, 40, end_ids=[])
        assert "_decoder" in fast.__dict__  # the C step ran
        assert [h.ids for h in got] == [h.ids for h in want]
        torch.testing.assert_close([h.logprob for h in got], [h.logprob for h in want], atol=1e-4, rtol=0)


def test_the_model_moved_or_reloaded_is_read_anew():
    library()
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    first, _ = steps_both_ways(model, 1, 5, 1, padded=False)[1]
    with torch.no_grad():
        model.transformer.ln_f.weight.mul_(2.0)  # in place: the C step's copies must follow
    (want, _), (got, _) = steps_both_ways(model, 1, 5, 1, padded=False)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(got, first)
    model.to(torch.bfloat16)  # new tensors
    (want, _), (got, _) = steps_both_ways(model, 1, 5, 1, padded=False)
    torch.testing.assert_close(got, want, atol=0.03 * want.abs().max().item(), rtol=0)
    before = got
    with torch.no_grad():  # a block's weights (read from a packed copy) changed in place
        model.transformer.h[0].mlp.c_fc.weight.mul_(-3.0)
    (want, _), (got, _) = steps_both_ways(model, 1, 5, 1, padded=False)
    torch.testing.assert_close(got, want, atol=0.03 * want.abs().max().item(), rtol=0)
    assert not torch.allclose(got, before, atol=0.03 * want.abs().max().item())


def test_a_weight_or_module_replaced_or_adapters_added_are_read_as_the_model_reads_them():
    """A parameter replaced anywhere (not only at the few the quick check looks at), or LoRA
    adapters put on after a first generation: the next generation reads the model as it is
    now (the adapters: through the model's own code, which the C step does not run)."""
    from gptcli.lora import LoRASettings, add_adapters

    library()
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    first, _ = steps_both_ways(model, 1, 5, 1, padded=False)[1]
    block = model.transformer.h[1].attn
    block.c_attn.weight = torch.nn.Parameter(torch.randn_like(block.c_attn.weight) * 0.2)
    (want, _), (got, _) = steps_both_ways(model, 1, 5, 1, padded=False)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert not torch.allclose(got, first, atol=1e-3)
    add_adapters(model, LoRASettings(rank=2, alpha=4.0))
    with torch.no_grad():
        for m in model.modules():
            if hasattr(m, "lora_B"):
                m.lora_B.normal_(0, 0.5)
    (want, _), (got, _) = steps_both_ways(model, 1, 5, 1, padded=False)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    assert "_decoder" not in model.__dict__  # (the model's own code ran)
    assert kernels.use_fast_decode(model) is False  # unmerged adapters: not for the C step


def test_a_cache_made_for_another_model_is_left_to_the_models_code():
    """The C step reads the cache by the model's own shape: one made for a model of fewer
    layers or another width (a caller's mistake) gets the model's own error, not memory
    written past the cache's end."""
    library()
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    for other in ({"n_layer": 1}, {"n_embd": 32}):
        config = dataclasses.replace(model.config, **other)
        cache = KVCache(config, 1, 8)
        with torch.no_grad(), pytest.raises((IndexError, RuntimeError)):
            model.next_logits(torch.tensor([[3]]), kv_cache=cache)
    cache = KVCache(model.config, 1, 8)
    cache.v = cache.v.to(torch.bfloat16)  # keys and values of two dtypes
    with torch.no_grad(), pytest.raises(RuntimeError):
        model.next_logits(torch.tensor([[3]]), kv_cache=cache)


@pytest.mark.parametrize("n_embd", [64, 72])  # (72: inputs past the last 16)
def test_fp32_logits_of_a_row_are_the_same_bits_whatever_else_is_in_the_batch(n_embd):
    """A row decoded in fp32 beside others gets exactly the logits it gets alone (the products
    of one row and of several sum in one order): a sample of a batch is what its seed gives
    alone, near-ties included."""
    library()
    model = small_model(torch.float32, n_embd=n_embd, n_head=2)
    kernels.use_fast_decode(model)
    prompts = torch.randint(0, 97, (3, 5), generator=torch.Generator().manual_seed(4))
    alone = [KVCache(model.config, 1, 16) for _ in range(3)]
    with torch.no_grad():
        for r in range(3):  # (each prompt encoded alone: torch's own products may vary with the batch)
            GPT.next_logits(model, prompts[r : r + 1], kv_cache=alone[r])
        batch = KVCache(model.config, 3, 16)
        batch.k.copy_(torch.cat([c.k for c in alone], dim=1))
        batch.v.copy_(torch.cat([c.v for c in alone], dim=1))
        batch.pos = alone[0].pos
        tokens = torch.tensor([[7], [11], [13]])
        for _ in range(3):
            together = model.next_logits(tokens, kv_cache=batch)
            for r in range(3):
                assert torch.equal(together[r], model.next_logits(tokens[r : r + 1], kv_cache=alone[r])[0])
            tokens = together.argmax(-1, keepdim=True)
    assert "_decoder" in model.__dict__  # (the C step ran)


def test_the_weights_are_checked_once_a_generation(monkeypatch):
    """Per token the check cost more than the C step's own Python; per cache it is once."""
    library()
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    calls = []
    real = kernels._weights_key
    monkeypatch.setattr(kernels, "_weights_key", lambda m: calls.append(1) or real(m))
    for _ in range(2):
        steps = list(generate(model, [1, 2, 3], 12, sampling=GREEDY))
        assert len(steps) == 12 and "_decoder" in model.__dict__
    assert len(calls) == 2  # once for each generation's cache, not 11 times each


def test_training_probes_and_static_caches_keep_the_models_code():
    library()
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    cache = KVCache(model.config, 1, 8)
    with torch.no_grad():
        GPT.next_logits(model, torch.tensor([[1, 2]]), kv_cache=cache)
    x = torch.tensor([[3]])
    logits = model.next_logits(x, kv_cache=cache)  # gradients on: the model's code
    assert logits.requires_grad and "_decoder" not in model.__dict__


def test_the_library_is_built_once_and_named_by_what_it_was_built_from(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    lib = kernels._Library()
    assert lib.start() is True  # building, in the background
    assert lib.wait() is not None, lib.failed
    built = list((tmp_path / "k").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"
    again = kernels._Library()
    assert again.start() is False and again.lib is not None  # loaded from the cache, not rebuilt
    changed = tmp_path / "decode.c"
    shutil.copy(kernels.SOURCE, changed)
    changed.write_text(changed.read_text() + "\n/* changed */\n")
    monkeypatch.setattr(kernels, "SOURCE", changed)
    assert kernels.library_path(kernels._compiler()) != built[0]  # a changed source builds anew


@pytest.mark.parametrize("cc", ["none", "broken"])
def test_without_a_working_compiler_decoding_uses_the_models_code(cc, tmp_path, monkeypatch):
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    if cc == "none":
        monkeypatch.setattr(kernels, "_compiler", lambda: None)
    else:
        fake = tmp_path / "cc"
        fake.write_text("#!/bin/sh\necho 'cc: error: no such thing' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setattr(kernels, "_compiler", lambda: str(fake))
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library())
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    kernels.LIBRARY.wait()
    assert kernels.LIBRARY.lib is None
    assert ("no C compiler" if cc == "none" else "did not build (cc: error") in kernels.LIBRARY.failed
    with torch.no_grad():
        out = [int(s.tokens[0]) for s in generate(model, [1, 2], 5, sampling=GREEDY)]
    assert len(out) == 5 and "_decoder" not in model.__dict__
    assert not list((tmp_path / "k").glob("*.so"))  # nothing half-written left behind


def test_a_cc_that_does_not_run_falls_back_and_a_cc_with_flags_builds(tmp_path, monkeypatch):
    """CC naming a program that is not there: the model's code decodes (the server too, where
    this was an error at start); CC as a command with its own flags ("gcc -O2"): built."""
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    lib = kernels._Library()
    assert lib.start() is False and lib.lib is None
    assert "did not run" in lib.failed and "no-such-cc" in lib.failed
    monkeypatch.setattr(kernels, "LIBRARY", lib)
    model = small_model(torch.float32)
    kernels.use_fast_decode(model)
    with torch.no_grad():
        out = [int(s.tokens[0]) for s in generate(model, [1, 2], 5, sampling=GREEDY)]
    assert len(out) == 5 and "_decoder" not in model.__dict__
    real = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    monkeypatch.setenv("CC", f"{real} -Wall -Werror")
    monkeypatch.setattr(kernels, "SOURCE", stub_source(tmp_path))
    lib = kernels._Library()
    assert lib.start() is True and lib.wait() is not None, lib.failed
    assert kernels.library_path(f"{real} -Wall") != kernels.library_path(real)  # built apart


def test_samples_of_one_prompt_read_its_slots_where_they_were_written():
    """expand(n) copies the prompt's slots once and records the other rows' (cache.sources):
    the C step reads them there, the model's own attention after they are moved, and both
    sample the same tokens as a model decoding without the C step (fp32)."""
    library()
    model, plain = small_model(torch.float32), small_model(torch.float32)
    kernels.use_fast_decode(model)

    def samples(m: GPT) -> list[list[int]]:
        g = torch.Generator().manual_seed(5)
        steps = generate(m, [1, 2, 3, 4], 12, num_samples=5, sampling=Sampling(1.0), generator=g)
        return torch.stack([s.tokens for s in steps], 1).tolist()

    assert samples(model) == samples(plain)
    cache = KVCache(plain.config, 1, 10)
    with torch.no_grad():
        plain.next_logits(torch.tensor([[1, 2, 3]]), kv_cache=cache)
    before = cache.k[:, 0, :3].clone()
    cache.expand(3)
    assert cache.k.size(1) == 3 and cache.sources is not None and cache.sources[:, :3].eq(0).all()
    cache.settle()
    assert all(torch.equal(cache.k[:, r, :3], before) for r in range(3))


def test_the_c_draw_finds_the_ids_torchs_search_finds():
    """Sampling's inverse-CDF draw in C against torch's (generate.inverse_cdf): the same ids,
    whole blocks of zero mass and all mass on the last id included; at the ends of [0, 1)
    ids of mass > 0 (where a point falls within 1e-16 of the total, the two sums' rounding
    may pick neighbours)."""
    library()
    g = torch.Generator().manual_seed(0)
    for V in (5, 1024, 1025, 3001, 50257):
        for scale in (0.5, 3.0, 20.0):
            q = torch.softmax(torch.randn(16, V, generator=g) * scale, -1)
            q[:4, : V // 3] = 0.0  # blocks with no mass at all
            q[4] = 0.0
            q[4, V - 1] = 1.0  # everything on the last id
            u = torch.rand(16, 1, generator=g, dtype=torch.float64)
            got = kernels.draw(q, u)
            assert got is not None and got.dtype == torch.long
            assert torch.equal(got, inverse_cdf(q, u)), V
            u[0], u[1] = 0.0, 1.0 - 2.0**-53
            ends = kernels.draw(q, u)
            assert ends is not None and (q.gather(-1, ends[:, None]) > 0).all()
            assert ends[0] == (q[0] > 0).nonzero()[0, 0]  # the first id with any mass
    # one u for every row, as torch broadcasts it (a list of one generator for a batch)
    one = torch.full((1, 1), 0.5, dtype=torch.float64)
    assert torch.equal(kernels.draw(q, one), inverse_cdf(q, one))
    # not a CPU float32 q, or a u of another number of rows: torch's search does it (or refuses)
    assert kernels.draw(q.double(), u) is None and kernels.draw(q, u[:3]) is None
    assert kernels.draw(q[:, :0], u) is None


def test_the_c_sample_draws_what_torchs_softmax_and_draw_find():
    """Sampling from logits in C (no softmax written out) against torch's softmax of
    logits / T and its inverse-CDF search, at the same uniforms: the same ids but where a
    point falls within rounding of the edge between two ids; -inf logits never drawn, not even
    at u = 0; the largest at a temperature near 0; rows torch must do (NaN, +inf, nothing
    finite) refused."""
    library()
    g = torch.Generator().manual_seed(0)
    for V in (1, 7, 1024, 1025, 3001, 50257):
        for t in (1.0, 0.7, 2.5):
            x = torch.randn(64, V, generator=g) * 3
            x[:, V // 2 : V // 2 + 3] = float("-inf")  # (V > 1) padding: never drawn
            x[:, 0] = float("-inf") if V > 1 else 0.0
            u = torch.rand(64, 1, generator=g, dtype=torch.float64)
            u[0] = 0.0
            got = kernels.sample(x, u, t)
            q = torch.softmax(x / t, -1).double()
            want = inverse_cdf(q.float(), u)
            assert got is not None and got.dtype == torch.long
            assert (x.gather(-1, got[:, None]) > float("-inf")).all()
            cum = q.cumsum(-1)
            for r in (got != want).nonzero()[:, 0].tolist():  # only where u is on an edge
                edge = cum[r, min(got[r], want[r])].item()
                assert abs(edge - u[r].item()) < 1e-5, (V, t, r)
            assert (got != want).sum() <= 2, (V, t)
    x = torch.randn(4, 3001, generator=g)
    u = torch.rand(4, 1, generator=g, dtype=torch.float64)
    assert torch.equal(kernels.sample(x, u, torch.finfo(torch.float32).tiny), x.argmax(-1))
    for bad in (float("nan"), float("inf")):
        y = x.clone()
        y[2, 5] = bad
        assert kernels.sample(y, u, 1.0) is None
    assert kernels.sample(torch.full((4, 9), float("-inf")), u, 1.0) is None
    assert kernels.sample(x.double(), u, 1.0) is None and kernels.sample(x, u.float(), 1.0) is None
    assert kernels.sample(x, u[:3], 1.0) is None and kernels.sample(x[:, :0], u, 1.0) is None
    assert kernels.sample(x, u, 1e39) is None  # (a temperature float cannot hold: torch's code)


def test_the_c_argmax_is_torchs_and_a_steps_own_is_handed_out_once():
    """gptcli_argmax against torch's argmax: ties (the first), NaN before and after the largest
    and in a later block than it (the first NaN), infinities, rows all -inf, widths around its
    blocks of 512. A step's own argmax (found while its logits were in cache) is given for
    those logits once, and never for logits changed since or for others."""
    lib = library()
    g = torch.Generator().manual_seed(0)
    for V in (1, 3, 511, 512, 513, 1100, 50257):
        x = torch.randn(8, V, generator=g)
        x[1, [V // 3, V - 1]] = 50.0
        x[2, V - 1] = float("nan")
        x[3, 0], x[3, V - 1] = 9.0, float("nan")
        x[4] = float("-inf")
        x[5, [V // 2, V - 1]] = float("inf")
        x[6, 0], x[6, V - 1] = float("nan"), 99.0
        x[7] = 1.0
        got = kernels.argmax(x)
        assert got is not None and got.dtype == torch.long and torch.equal(got, x.argmax(-1)), V
    x = torch.randn(4, 600, generator=g)
    assert kernels.argmax(x.double()) is None and kernels.argmax(x[:, ::2]) is None
    assert kernels.argmax(x[:, :0]) is None and kernels.argmax(x[0]) is None

    model = small_model(torch.float32)
    assert kernels.use_fast_decode(model) and lib is not None
    cache = KVCache(model.config, 3, 12)
    with torch.no_grad():
        GPT.next_logits(model, torch.randint(0, 97, (3, 4), generator=g), kv_cache=cache)
        logits = model.next_logits(torch.tensor([[1], [2], [3]]), kv_cache=cache)
        own = kernels._LAST_ARGMAX[2]
        assert kernels.argmax(logits) is own and torch.equal(own, logits.argmax(-1))
        again = kernels.argmax(logits)  # (found anew: the first caller may have changed own)
        assert again is not own and torch.equal(again, logits.argmax(-1))
        logits = model.next_logits(torch.tensor([[4], [5], [6]]), kv_cache=cache)
        assert kernels.argmax(logits.clone()) is not kernels._LAST_ARGMAX[2]
        logits[:, 7] = 1e9
        assert torch.equal(kernels.argmax(logits), torch.full((3,), 7))
    with torch.inference_mode():  # (its tensors have no version: no step's own argmax kept)
        logits = model.next_logits(torch.tensor([[7], [8], [9]]), kv_cache=cache)
        assert kernels._LAST_ARGMAX[0] is None and torch.equal(kernels.argmax(logits), logits.argmax(-1))


def test_sampling_draws_in_c_unless_top_k_or_top_p(monkeypatch):
    """Sampling.draw takes the C sample for a plain or tempered distribution (the uniforms
    drawn as draw_from draws them: the same ids from the same seed as q's own draw, but for
    rounding at an edge), and q's draw with top-k or top-p."""
    library()
    calls = []
    real = kernels.sample
    monkeypatch.setattr(kernels, "sample", lambda *a: calls.append(1) or real(*a))
    x = torch.randn(16, 5000, generator=torch.Generator().manual_seed(1)) * 4
    for sampling in (Sampling(1.0), Sampling(0.8)):
        got = sampling.draw(x, torch.Generator().manual_seed(3))
        want = draw_from(sampling.distribution(x), torch.Generator().manual_seed(3))
        assert (got == want).float().mean() >= 15 / 16
    assert len(calls) == 2
    Sampling(0.8, top_k=40).draw(x, torch.Generator().manual_seed(3))
    Sampling(1.0, top_p=0.9).draw(x, torch.Generator().manual_seed(3))
    assert len(calls) == 2
    u = torch.rand(16, 1, dtype=torch.float64)
    assert kernels.sample(x, u, 1.0) is not None
    assert kernels.sample(x, u.to("meta"), 1.0) is None  # (uniforms C cannot read: not handed to it)


def test_the_c_ranking_of_beams_is_torchs_topk_over_the_sums():
    """gptcli_top_rows against torch.topk over offsets[r] + x[r, j] for j < n: the same values and
    indices, dead rows (offset -inf) and ids past n never ranked, places left over -inf and -1."""
    library()
    g = torch.Generator().manual_seed(0)
    shapes = ((4, 50257, 50257, 8), (4, 50304, 50257, 8), (3, 100, 7, 6), (1, 5, 5, 2), (16, 999, 999, 32))
    for rows, V, n, k in shapes:
        x = torch.randn(rows, V, generator=g) * 4
        offsets = -torch.rand(rows, generator=g) * 30
        if rows > 1:
            offsets[1] = float("-inf")  # a dead beam
        x[0, :3] = float("-inf")  # banned ids
        got = kernels.top_rows(x, offsets, n, k)
        assert got is not None
        total = offsets[:, None] + x
        total[:, n:] = float("-inf")
        want = torch.topk(total.view(-1), k)
        assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices), (rows, V, n)
    # fewer live entries than k: the rest are -inf at index -1
    x = torch.tensor([[0.5, float("-inf"), 2.0]])
    values, index = kernels.top_rows(x, torch.zeros(1), 3, 4)
    assert values.tolist() == [2.0, 0.5, float("-inf"), float("-inf")] and index.tolist() == [2, 0, -1, -1]
    # equal sums: the lower index first
    values, index = kernels.top_rows(torch.ones(2, 4), torch.zeros(2), 4, 3)
    assert index.tolist() == [0, 1, 2]
    assert kernels.top_rows(x.double(), torch.zeros(1), 3, 2) is None  # not fp32: torch ranks


def test_the_c_best_is_the_ranking_at_each_rows_log_sum_exp():
    """gptcli_best (one call, the rows shared by the threads) against top_rows at offsets =
    scores - logsumexp: the same values and indices, ties across rows and within a row with
    the lower index first, dead beams, rows holding NaN or +inf and ids past n never ranked."""
    library()
    g = torch.Generator().manual_seed(2)
    for rows, V, n, k in (
        (4, 50257, 50257, 8),
        (4, 50304, 50257, 8),
        (3, 100, 7, 6),
        (1, 5, 5, 2),
        (16, 999, 999, 32),
    ):
        x = torch.randn(rows, V, generator=g) * 4
        scores = -torch.rand(rows, generator=g) * 30
        if rows > 2:
            scores[1] = float("-inf")  # a dead beam
            x[2, 4] = float("nan")  # no continuation of a row whose log-sum-exp is not finite
        got = kernels.best(x, scores, n, k)
        want = kernels.top_rows(x, scores - kernels.logsumexp(x), n, k)
        assert got is not None and torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (rows, V, n)
        if rows > 2:
            assert not ((got[1] // V) == 2).any() and not ((got[1] // V) == 1).any()
    # ties: across rows and within one, the lower index first; fewer live entries than k
    values, index = kernels.best(torch.zeros(3, 4), torch.zeros(3), 4, 6)
    assert index.tolist() == [0, 1, 2, 3, 4, 5]
    values, index = kernels.best(torch.tensor([[0.0, float("-inf")]]), torch.zeros(1), 2, 3)
    assert index.tolist() == [0, -1, -1] and values[1:].eq(float("-inf")).all()
    assert kernels.best(torch.zeros(2, 4).double(), torch.zeros(2), 4, 2) is None  # not fp32: torch ranks


def test_the_c_log_sum_exp_is_torchs():
    library()
    g = torch.Generator().manual_seed(1)
    for rows, V, scale in ((4, 50257, 1.0), (4, 50257, 30.0), (3, 7, 5.0), (2, 1, 1.0)):
        x = torch.randn(rows, V, generator=g) * scale
        x[0, : V // 2] = float("-inf")
        got = kernels.logsumexp(x)
        torch.testing.assert_close(got, torch.logsumexp(x, -1), atol=1e-5, rtol=1e-6)
    nothing = kernels.logsumexp(torch.full((1, 5), float("-inf")))
    assert nothing is not None and nothing.item() == float("-inf")


# --- --quantize int8 ---------------------------------------------------------------------------


def test_int8_weights_are_within_half_a_step_of_the_originals():
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 40)
    q = Int8Linear(linear.weight, linear.bias)
    assert q.weight.dtype == torch.int8 and q.scale.shape == (40,)
    back = q.weight.float() * q.scale[:, None]
    assert ((back - linear.weight).abs() <= q.scale[:, None] / 2 + 1e-7).all()
    x = torch.randn(3, 64)
    for dtype in (torch.float32, torch.bfloat16):  # bf16: torch's int8 weight-only kernel
        torch.testing.assert_close(q(x.to(dtype)).float(), linear(x).detach(), atol=0.05, rtol=0.05)


@pytest.mark.parametrize("width", [40, 72, 100])
def test_int8_products_of_bf16_inputs_of_any_width(width):
    """Widths that are not multiples of 16 (torch's int8 kernel gave inf, NaN or a crash)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(width, 97)
    q = Int8Linear(linear.weight, linear.bias)
    x = torch.randn(5, width)
    want = torch.nn.functional.linear(x, q.weight.float() * q.scale[:, None], linear.bias).detach()
    torch.testing.assert_close(q(x.bfloat16()).float(), want, atol=0.05, rtol=0.05)


def test_int8_products_of_bf16_inputs_compile():
    """--compile --quantize int8 --dtype bf16: the compiled step multiplies int8 weights of
    bf16 inputs (Inductor failed on torch's int8 op; the weights are widened instead)."""
    layer = Int8Linear(torch.randn(32, 64, generator=torch.Generator().manual_seed(0)), torch.randn(32))
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    got = torch.compile(lambda x: layer(x), dynamic=False)(x).float()
    want = layer(x).float()
    torch.testing.assert_close(got, want, atol=0.02 * want.abs().max().item(), rtol=0)


def test_quantize_replaces_the_products_and_unties_the_unembedding():
    model = small_model(torch.float32, int8=True)
    assert all(isinstance(m, Int8Linear) for m in (model.lm_head, model.transformer.h[0].mlp.c_fc))
    assert model.transformer.wte.weight.dtype == torch.float32  # lookups stay as they were
    out = model(torch.tensor([[1, 2, 3]]))[0]
    assert out.shape == (1, 3, 97) and torch.isfinite(out).all()


def test_int8_greedy_text_agrees_with_the_unquantized_model(trained):
    """>= 95% of 200 greedy tokens the same as the same model unquantized, in fp32 and bf16."""
    library()
    from gptcli.store.loading import load

    prompt = [3, 1, 4, 1, 5]
    for dtype in (torch.float32, torch.bfloat16):
        plain = load(str(trained)).model.eval().to(dtype)
        int8 = quantize(load(str(trained)).model.eval().to(dtype))
        for m in (plain, int8):
            kernels.use_fast_decode(m)
        with torch.no_grad():
            want = [int(s.tokens[0]) for s in generate(plain, prompt, 200, sampling=GREEDY)]
            got = [int(s.tokens[0]) for s in generate(int8, prompt, 200, sampling=GREEDY)]
        agree = sum(a == b for a, b in zip(got, want, strict=True)) / 200
        assert agree >= 0.95, (dtype, agree)


def test_the_verbs_take_quantize_int8(trained, corpus, monkeypatch):
    import gptcli.infer.quantize as q

    quantized = []
    monkeypatch.setattr(q, "quantize", lambda model, kind: quantized.append(kind) or quantize(model, kind))
    plain = run("eval", str(corpus), "--ckpt", str(trained), "--dtype", "fp32", "--json")
    int8 = run("eval", str(corpus), "--ckpt", str(trained), "--dtype", "fp32", "--quantize", "int8", "--json")
    assert plain.exit_code == 0 and int8.exit_code == 0, int8.output
    import json

    rows = [json.loads(r.stdout) for r in (plain, int8)]
    assert abs(rows[1]["ppl"] / rows[0]["ppl"] - 1) < 0.01, rows
    assert [(r["dtype"], r["quantize"]) for r in rows] == [("fp32", None), ("fp32", "int8")]  # told apart
    assert quantized == ["int8"]  # the second eval only
    for verb in (
        ["sample", "-n", "20", "--temp", "0"],
        ["beam", "The fox", "-n", "8"],
        ["inspect-attn", "The fox"],
        ["inspect-lens", "The fox"],
    ):
        quantized.clear()
        result = run(*verb, "--ckpt", str(trained), "--quantize", "int8")
        assert result.exit_code == 0, (verb, result.output)
        assert quantized == ["int8"], verb
    bad = run("sample", "--ckpt", str(trained), "--quantize", "int4")
    assert bad.exit_code == 2 and "--quantize" in bad.stderr and "int8" in bad.stderr


def test_a_first_run_says_it_is_building_the_kernel(trained, tmp_path, monkeypatch):
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library())
    first = run("sample", "--ckpt", str(trained), "-n", "5", "--temp", "0")
    assert first.exit_code == 0 and "building the CPU decoding kernel" in first.stderr
    kernels.LIBRARY.wait()
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library())  # a new process, the cache warm
    second = run("sample", "--ckpt", str(trained), "-n", "5", "--temp", "0")
    assert second.exit_code == 0 and "building" not in second.stderr
    assert second.stdout == first.stdout


def test_a_kernel_that_cannot_be_used_is_said_in_scripts_too(trained, tmp_path, monkeypatch):
    """Not at a terminal (a script, CI, a server's log): why decoding runs slower is a warning."""
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setenv("CC", str(tmp_path / "no-such-cc"))
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library())
    result = run("sample", "--ckpt", str(trained), "-n", "3", "--temp", "0")
    assert result.exit_code == 0
    assert "warning: the C compiler" in result.stderr
    assert "decoding runs the model's own code" in result.stderr


@pytest.mark.parametrize("end", ["exit", "ctrl-c"])
def test_a_build_outlives_the_command_that_started_it(end, tmp_path):
    """A command shorter than the build (a short `sample`, or one stopped with Ctrl-C) ends
    while the compiler runs: the build goes on in a process of its own session, and the
    next command loads its library."""
    real = kernels._compiler()
    slow = tmp_path / "slow-cc"  # a compiler slower than the command
    slow.write_text(f'#!/bin/sh\n[ "$1" = --version ] || sleep 2\nexec {real} "$@"\n')
    slow.chmod(0o755)
    stub = stub_source(tmp_path)
    env = {**os.environ, "GPTCLI_KERNELS_DIR": str(tmp_path / "k"), "CC": str(slow)}
    code = (  # (SIGINT as a terminal leaves it, whatever a launcher set: bash's `&` ignores it)
        "import pathlib, signal, time; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from gptcli.infer import kernels; "
        f"kernels.SOURCE = pathlib.Path({str(stub)!r}); "
        "print(kernels.library_path(kernels._compiler()), flush=True); "
        "assert kernels.LIBRARY.start()"  # (the command's last word, where it exits)
        + ("; print('started', flush=True); time.sleep(60)" if end == "ctrl-c" else "")
    )
    command = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    library = Path(command.stdout.readline().strip())
    if end == "ctrl-c":
        assert command.stdout.readline().strip() == "started"
        os.killpg(command.pid, signal.SIGINT)  # as a terminal's Ctrl-C: the command's whole group
    assert (command.wait(timeout=60) == 0) == (end == "exit")  # (Ctrl-C: killed by SIGINT)
    assert not library.exists()  # the command has ended, the build not yet
    deadline = time.monotonic() + 60
    while (not library.exists() or len(list(library.parent.iterdir())) > 1) and time.monotonic() < deadline:
        time.sleep(0.1)  # (the build's private directory goes just after the library lands)
    assert [p.name for p in library.parent.iterdir()] == [library.name]  # nothing half-written beside it
    assert all(hasattr(ctypes.CDLL(str(library)), name) for name in kernels.FUNCTIONS)  # a whole library


def test_every_pointer_the_step_reads_lies_in_memory_the_decoder_holds():
    """The weights are checked once a generation, so a model cast or moved in the middle of
    one (its parameters' .data replaced, their old memory freed unless something holds it)
    must leave every pointer the C step reads inside memory the Decoder keeps."""
    lib = library()
    models = {
        "fp32": (small_model(torch.float32), torch.bfloat16),
        "bf16": (small_model(torch.bfloat16), torch.float32),
        "int8": (small_model(torch.bfloat16, int8=True), torch.float32),
    }
    for name, (model, other) in models.items():
        decoder = kernels.Decoder(model, lib)
        model.to(other)  # every floating-point parameter's .data replaced
        storages = [t.untyped_storage() for t in decoder.keep]
        spans = [(st.data_ptr(), st.data_ptr() + st.nbytes()) for st in storages]
        m = decoder.model
        pointers = {f: getattr(m, f) for f in ("wte", "wpe", "lnf_w", "lnf_b")}
        mats = {"head": m.head}
        for i in range(m.n_layer):
            layer = m.layers[i]
            pointers |= {f"{i}.{f}": getattr(layer, f) for f in ("ln1_w", "ln1_b", "ln2_w", "ln2_b")}
            mats |= {f"{i}.{f}": getattr(layer, f) for f in ("attn", "proj", "fc", "out")}
        for mat_name, mat in mats.items():
            pointers |= {f"{mat_name}.{f}": getattr(mat, f) for f in ("w", "scale", "bias", "packed")}
        outside = [f for f, p in pointers.items() if p is not None and not any(a <= p < b for a, b in spans)]
        assert not outside, (name, outside)
        assert pointers["wte"] is not None and pointers["0.fc.w"] is not None


def test_a_reset_cache_starts_a_new_generation_and_reads_changed_weights():
    """A cache emptied by reset() and filled again is a new generation: weights changed in
    place before it are read anew, as the model's own code reads them (bf16: the C step reads
    the LayerNorms from fp32 copies, on every CPU)."""
    library()
    model = small_model(torch.bfloat16)
    kernels.use_fast_decode(model)
    prompt, new = torch.tensor([[3, 1, 4, 1, 5]]), torch.tensor([[9]])

    def after_reset_and_prefill(cache: KVCache) -> torch.Tensor:
        cache.reset()
        GPT.next_logits(model, prompt, kv_cache=cache)
        return model.next_logits(new, kv_cache=cache)  # the C step

    cache = KVCache(model.config, 1, 16, dtype=torch.bfloat16)
    with torch.no_grad():
        before = after_reset_and_prefill(cache)
        assert "_decoder" in model.__dict__
        model.transformer.ln_f.weight.mul_(-2.0)  # in place, between two generations
        got = after_reset_and_prefill(cache)
        fresh = KVCache(model.config, 1, 16, dtype=torch.bfloat16)
        GPT.next_logits(model, prompt, kv_cache=fresh)
        want = GPT.next_logits(model, new, kv_cache=fresh).float()
    tolerance = 0.03 * want.abs().max().item()
    torch.testing.assert_close(got, want, atol=tolerance, rtol=0)
    assert not torch.allclose(got, before, atol=tolerance)


def test_a_library_cut_short_is_built_anew_not_loaded(tmp_path, monkeypatch):
    """A cached library cut short (copied in, a disk that lost its end) would kill the process
    with SIGBUS at its first call: it is recognized by its headers and built anew in its place;
    one that does not load at all (garbage) too."""
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(kernels, "SOURCE", stub_source(tmp_path))
    first = kernels._Library()
    assert first.start() is True and first.wait() is not None, first.failed
    (path,) = (tmp_path / "k").glob("*.so")
    whole = path.read_bytes()
    assert kernels.whole_library(path)
    for broken in (whole[: len(whole) // 2], whole[:100]):
        (tmp_path / "broken").write_bytes(broken)  # a new file in its place: the loaded one stays whole
        os.replace(tmp_path / "broken", path)
        assert not kernels.whole_library(path)
        again = kernels._Library()
        assert again.start() is True, "a broken library is built anew, not loaded"
        assert again.wait() is not None and again.failed is None
        assert path.read_bytes() == whole and [p.name for p in (tmp_path / "k").iterdir()] == [path.name]
    # garbage under a name this process never loaded (the loader reuses a name it has loaded)
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k2"))
    garbage = kernels.library_path(kernels._compiler())
    garbage.parent.mkdir()
    garbage.write_bytes(b"garbage")
    again = kernels._Library()
    assert again.start() is True and again.wait() is not None and again.failed is None
    assert garbage.read_bytes() == whole


def test_a_library_built_that_does_not_load_is_not_built_again_at_every_command(tmp_path, monkeypatch):
    """A library that builds but does not load (a cache on a disk mounted noexec; a CC that
    writes no library): recorded as a refused build is, the reason said with what to do."""
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    fake = tmp_path / "cc"
    version = '#!/bin/sh\ncase "$*" in *--version*) exit 0;; esac\n'
    writes_garbage = 'while [ "$1" != "-o" ]; do shift; done; echo garbage > "$2"\n'
    fake.write_text(version + writes_garbage)
    fake.chmod(0o755)
    monkeypatch.setattr(kernels, "_compiler", lambda: str(fake))
    first = kernels._Library()
    assert first.start() is True and first.wait() is None and "did not load" in first.failed
    record = kernels.kernel_build.failure_record(kernels.library_path(str(fake)))
    assert record.read_text().startswith(kernels.kernel_build.NOT_LOADED)
    again = kernels._Library()
    assert again.start() is False and again.lib is None  # not built again
    assert "was built but did not load (" in again.failed and "GPTCLI_KERNELS_DIR" in again.failed
    assert f"delete {record} to try again" in again.failed


@pytest.mark.parametrize("writes", ["garbage", "nothing"])
def test_the_build_itself_records_a_library_that_cannot_be_used(writes, tmp_path):
    """The build process (which outlives a short command) records the verdict, not the
    command that waits for it: a library that does not load, or none written (CC=true)."""
    fake = tmp_path / "cc"
    garbage = 'while [ "$1" != "-o" ]; do shift; done; echo garbage > "$2"\n'
    fake.write_text("#!/bin/sh\n" + (garbage if writes == "garbage" else "exit 0\n"))
    fake.chmod(0o755)
    path = tmp_path / "k" / "lib.so"
    with pytest.raises(OSError):
        kernels.kernel_build.build(str(fake), kernels.SOURCE, path, [["-shared"]])
    why = kernels.kernel_build.refused(path)
    assert why is not None and ("did not load" in why if writes == "garbage" else "wrote no library" in why)
    assert not path.exists() or writes == "garbage"


def test_a_refused_build_says_the_compilers_first_error(tmp_path, monkeypatch):
    """gcc without the C library's headers ends with 'compilation terminated.': its first
    error is what says why."""
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    fake = tmp_path / "cc"
    errors = "decode.c:17:10: fatal error: math.h: No such file or directory\ncompilation terminated."
    fake.write_text(f'#!/bin/sh\ncase "$*" in *--version*) exit 0;; esac\necho "{errors}" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setattr(kernels, "_compiler", lambda: str(fake))
    lib = kernels._Library()
    assert lib.start() is True and lib.wait() is None
    assert "did not build (decode.c:17:10: fatal error: math.h: No such file or directory)" in lib.failed


def test_a_directory_at_the_librarys_name_is_said(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(kernels, "SOURCE", stub_source(tmp_path))
    path = kernels.library_path(kernels._compiler())
    path.mkdir(parents=True)
    lib = kernels._Library()
    assert lib.start() is False and lib.lib is None and f"{path} is in the way" in lib.failed


def test_a_kernels_dir_that_cannot_be_written_is_said_once_and_nothing_is_built(tmp_path, monkeypatch):
    """GPTCLI_KERNELS_DIR naming a file (or a read-only disk): the reason, with what to do, and
    no build process that would fail at every run while saying 'once'."""
    in_the_way = tmp_path / "notes.txt"
    in_the_way.write_text("mine")
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(in_the_way))
    lib = kernels._Library()
    assert lib.start() is False and lib.lib is None
    assert "cannot be kept in" in lib.failed and "GPTCLI_KERNELS_DIR" in lib.failed
    assert in_the_way.read_text() == "mine"
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(in_the_way / "kernels"))  # the file is above it
    lib = kernels._Library()
    assert lib.start() is False and f"({in_the_way} is a file, not a directory)" in lib.failed


def test_a_relative_kernels_dir_is_where_the_library_is_loaded_from(tmp_path, monkeypatch):
    """GPTCLI_KERNELS_DIR=. : loaded from the working directory (a bare file name would send
    the loader to the system's library path instead)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", ".")
    monkeypatch.setattr(kernels, "SOURCE", stub_source(tmp_path))
    lib = kernels._Library()
    assert lib.start() is True and lib.wait() is not None, lib.failed
    again = kernels._Library()
    assert again.start() is False and again.lib is not None, again.failed


def test_a_build_clears_what_a_killed_build_of_the_same_library_left(tmp_path, monkeypatch):
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(kernels, "SOURCE", stub_source(tmp_path))
    path = kernels.library_path(kernels._compiler())
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    from gptcli import files

    left = path.parent / f".{path.name}.{files._host()}-{dead.pid}-abcdef.tmpdir"
    left.mkdir(parents=True)
    (left / path.name).write_bytes(b"half a library")
    other = path.parent / "mine.txt"
    other.write_text("kept")
    lib = kernels._Library()
    assert lib.start() is True and lib.wait() is not None, lib.failed
    assert sorted(p.name for p in path.parent.iterdir()) == sorted([path.name, "mine.txt"])


def test_a_build_the_compiler_refused_is_not_tried_again_at_every_command(tmp_path, monkeypatch):
    """The same source, compiler and flags fail the same way: the next command says why and
    how to try again, instead of 'building ... once' at every run; deleting the record does."""
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    fake = tmp_path / "cc"
    version = '#!/bin/sh\ncase "$*" in *--version*) exit 0;; esac\n'  # (one build key for both)
    fake.write_text(version + 'echo "cc: error: no headers" >&2\nexit 1\n')
    fake.chmod(0o755)
    monkeypatch.setattr(kernels, "_compiler", lambda: str(fake))
    first = kernels._Library()
    assert first.start() is True and first.wait() is None
    assert "did not build (cc: error: no headers)" in first.failed
    record = kernels.kernel_build.failure_record(kernels.library_path(str(fake)))
    assert record.read_text() == "cc: error: no headers\n"
    again = kernels._Library()
    assert again.start() is False and again.lib is None  # not built again
    assert "cc: error: no headers" in again.failed and f"delete {record} to try again" in again.failed
    record.unlink()
    fake.write_text(version + 'exec cc "$@"\n')  # the headers installed
    monkeypatch.setattr(kernels, "SOURCE", stub_source(tmp_path))
    third = kernels._Library()
    assert third.start() is True and third.wait() is not None, third.failed
    assert not record.exists()


@pytest.mark.parametrize(
    "fails", ["cc1: fatal error: cannot write decode.s: No space left on device", "killed"]
)
def test_a_build_the_machine_failed_is_tried_again_by_the_next_command(fails, tmp_path):
    """A full disk, a compiler killed (for memory): the source did not fail, so nothing is
    recorded and the next command builds again."""
    from gptcli.infer import kernel_build

    fake = tmp_path / "cc"
    body = "kill -9 $$\n" if fails == "killed" else f'echo "{fails}" >&2\nexit 1\n'
    fake.write_text("#!/bin/sh\n" + body)
    fake.chmod(0o755)
    path = tmp_path / "k" / "lib.so"
    with pytest.raises((OSError, DiskFull)):  # (a full disk says so, for the library's path)
        kernel_build.build(str(fake), stub_source(tmp_path), path, [["-shared"]])
    assert kernel_build.refused(path) is None and list(path.parent.iterdir()) == []


def test_the_build_compiles_the_source_its_library_is_named_after(tmp_path):
    """The library's name comes from the source's text: the build compiles a copy of the
    text it checked against that name, so a source changed meanwhile (an update during the
    seconds of a build) is never stored under the old source's name."""
    from gptcli.infer import kernel_build

    source = stub_source(tmp_path)
    text = source.read_bytes()
    fake = tmp_path / "cc"  # changes the source the moment it starts, then compiles what it was given
    fake.write_text(f'#!/bin/sh\necho "#error changed" >> {source}\nexec {kernels._compiler()} "$@"\n')
    fake.chmod(0o755)
    path = tmp_path / "k" / "lib.so"
    kernel_build.build(str(fake), source, path, [["-shared", "-fPIC"]], kernel_build.digest(text))
    assert path.is_file() and sorted(p.name for p in path.parent.iterdir()) == ["lib.so"]
    with pytest.raises(OSError, match="changed while its library was being built"):  # now another text
        kernel_build.build(
            str(fake), source, tmp_path / "k2" / "lib.so", [["-shared"]], kernel_build.digest(text)
        )
    assert kernel_build.refused(tmp_path / "k2" / "lib.so") is None
    assert kernels.library_path("cc", source=text) != kernels.library_path("cc", source=source.read_bytes())


def test_on_macos_the_librarys_name_follows_the_cpu_sysctl_describes(tmp_path, monkeypatch):
    """macOS has no /proc/cpuinfo: the name takes sysctl's model and features, so a cache
    copied to a Mac whose CPU lacks some of them (Migration Assistant) builds anew instead of
    loading code built with -march=native for the other CPU."""
    monkeypatch.setattr(kernels, "cpu_flags", list)
    monkeypatch.setattr(kernels.sys, "platform", "darwin")
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    names = []
    for features in ("Intel(R) Xeon(R) W-3245 FMA AVX2 AVX512F", "Intel(R) Core(TM) i9-9880H FMA AVX2"):
        bin_dir = tmp_path / f"bin{len(names)}"
        bin_dir.mkdir()
        (bin_dir / "sysctl").write_text(f'#!/bin/sh\necho "{features}"\n')
        (bin_dir / "sysctl").chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        names.append(kernels.library_path("cc", source=b"int x;"))
    assert names[0] != names[1]


def test_a_compiler_that_hangs_is_given_up(tmp_path, monkeypatch):
    """The build gives up a compiler that never finishes (and leaves nothing behind), rather
    than a build process left waiting at every command's start."""
    from gptcli.infer import kernel_build

    fake = tmp_path / "cc"
    fake.write_text('#!/bin/sh\ncase "$*" in *--version*) exit 0;; esac\nexec sleep 60\n')
    fake.chmod(0o755)
    monkeypatch.setattr(kernel_build, "COMPILE_TIMEOUT_S", 0.5)
    path = tmp_path / "k" / "lib.so"
    t0 = time.monotonic()
    with pytest.raises(OSError, match="did not finish in"):
        kernel_build.build(str(fake), stub_source(tmp_path), path, [["-shared"]])
    assert time.monotonic() - t0 < 30
    assert list(path.parent.iterdir()) == []  # no library, no record of a failure


@pytest.mark.skipif(
    sys.platform != "linux" or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc's malloc only"
)
def test_decoding_verbs_keep_freed_memory_for_the_next_generation():
    """A CPU generation's KV cache and logits reuse memory freed before them: once a decoding
    verb starts decoding (cli.common.start_decoding), 64 MB freed and asked for again is not
    mapped in anew, a page fault per 4 KB page on first touch, as it is every time by glibc's
    malloc left as it is."""
    code = """
import resource, sys, types, torch
from gptcli.cli.common import start_decoding
from gptcli.config import ModelConfig
from gptcli.model import GPT
if sys.argv[1] == "decoding":
    config = ModelConfig(vocab_size=97, block_size=16, n_layer=1, n_head=2, n_embd=32)
    start_decoding(types.SimpleNamespace(model=GPT(config)))
faults = []
for _ in range(8):  # 64 MB, freed, 8 times: the fewest faults (the heap settles in a few)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(1 << 24).sum()
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(min(faults))
"""
    faults = {}
    for way in ("decoding", "plain"):
        done = subprocess.run([sys.executable, "-c", code, way], capture_output=True, text=True, check=True)
        faults[way] = int(done.stdout.strip().splitlines()[-1])
    assert faults["plain"] > 10_000  # (16,384 pages)
    assert faults["decoding"] < 1_000


def _vm_flags(address: int) -> list[str]:
    """The VmFlags of the mapping holding address, from /proc/self/smaps."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "VmFlags:":
            return line.split()[1:]
    return []


@pytest.mark.skipif(kernels.MADV_HUGEPAGE is None, reason="huge pages are asked for on Linux only")
def test_a_decoders_weights_are_put_on_huge_pages_after_its_first_steps(monkeypatch, two_threads):
    """The packed copies live in one mapping of their own, 2 MB-aligned (the Decoder's arena).
    After MERGE_AFTER steps, and not before, a thread of the Decoder's own asks for
    every weight the step reads whole to be put on huge pages (VmFlags "hg", MADV_HUGEPAGE;
    MADV_COLLAPSE where the kernel has it), at the same addresses: the steps after give the
    logits they gave before."""
    library()
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=16384, block_size=64, n_layer=1, n_head=2, n_embd=64)
    model = GPT(config).eval().to(torch.bfloat16)  # (its unembedding 2 MB)
    assert kernels.use_fast_decode(model)
    monkeypatch.setattr(kernels, "MERGE_AFTER", 3)
    merges, threads = [], []

    def merge(tensors: list[torch.Tensor]) -> None:
        merges.append(tensors)
        kernels_merge(tensors)

    monkeypatch.setattr(kernels, "merge_pages", merge)
    start = threading.Thread.start
    monkeypatch.setattr(threading.Thread, "start", lambda self: (threads.append(self), start(self)))
    idx = torch.randint(0, 16384, (1, 8), generator=torch.Generator().manual_seed(0))

    def steps(n: int) -> torch.Tensor:
        """the logits of n steps after the prompt idx, in a new cache"""
        cache = KVCache(config, 1, 16, dtype=torch.bfloat16)
        with torch.no_grad():
            model.next_logits(idx, kv_cache=cache)
            return torch.cat([model.next_logits(torch.tensor([[i * 997]]), kv_cache=cache) for i in range(n)])

    before = steps(2)
    assert merges == [] and threads == []
    steps(1)  # the 3rd step asks
    for t in threads:
        t.join()
    decoder = model.__dict__["_decoder"]
    mats = [m for layer in decoder.layers for m in (layer.attn, layer.proj, layer.fc, layer.out)]
    mats.append(decoder.model.head)
    arena = decoder.arena.memory
    assert len(merges) == 1 and merges[0][0] is arena
    assert [t.data_ptr() for t in merges[0][1:]] == [m.w for m in mats if not m.packed]
    if decoder.model.head.packed:  # (packed on this CPU: the copies in the arena, now marked)
        assert all(arena.data_ptr() <= m.packed < arena.data_ptr() + arena.numel() for m in mats if m.packed)
        assert arena.data_ptr() % kernels.HUGE_PAGE == 0 and "hg" in _vm_flags(arena.data_ptr())
    assert torch.equal(steps(2), before)
    assert len(merges) == 1  # (once per Decoder)


kernels_merge = kernels.merge_pages


def test_fresh_tensors_have_memory_of_their_own():
    t = kernels._fresh(3 * (1 << 20) + 5, torch.bfloat16)
    assert t.shape == (3 * (1 << 20) + 5,) and t.dtype == torch.bfloat16
    t.fill_(1.5)  # writable
    assert float(t[-1]) == 1.5
    if kernels.MADV_HUGEPAGE is not None:
        assert t.data_ptr() % kernels.HUGE_PAGE == 0
        kernels.merge_pages([t])
        assert "hg" in _vm_flags(t.data_ptr())
    small = kernels._fresh(1000, torch.float32)
    assert small.numel() == 1000
