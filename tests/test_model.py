"""The model against Hugging Face's GPT2LMHeadModel on the same weights (fp32, atol 1e-5)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gptcli.config import ModelConfig
from gptcli.model import GPT, IGNORE_INDEX, KVCache, Probe
from gptcli.store.hf import gptcli_to_hf_state_dict
from tests.helpers import ours_from_hf

ATOL = 1e-5

SHAPES = [
    # (n_layer, n_head, n_embd, vocab, n_positions), (batch, T)
    ((2, 4, 32, 97, 64), (1, 1)),
    ((2, 4, 32, 97, 64), (3, 17)),
    ((3, 2, 48, 101, 40), (2, 40)),
    ((1, 1, 16, 13, 8), (4, 8)),
]


@pytest.mark.parametrize(("arch", "shape"), SHAPES)
def test_logits_match_hugging_face(hf_gpt2, arch, shape):
    n_layer, n_head, n_embd, vocab, n_pos = arch
    hf = hf_gpt2(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab, n_positions=n_pos)
    ours = ours_from_hf(hf)
    idx = torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(idx).logits
        logits, loss = ours(idx)
    assert loss is None
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=0)


def test_loss_is_mean_next_token_nll_like_hugging_face(hf_gpt2):
    hf = hf_gpt2()
    ours = ours_from_hf(hf)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = hf(idx, labels=idx).loss  # HF shifts labels inside
        _, loss = ours(idx[:, :-1], idx[:, 1:])
    torch.testing.assert_close(loss, ref, atol=ATOL, rtol=0)


def test_ignored_targets_do_not_count():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8)).eval()
    x = torch.randint(0, 11, (1, 8))
    y = torch.randint(0, 11, (1, 8))
    y_masked = y.clone()
    y_masked[0, :3] = IGNORE_INDEX
    with torch.no_grad():
        logits, loss = model(x, y_masked)
    expected = F.cross_entropy(logits[0, 3:], y[0, 3:])
    torch.testing.assert_close(loss, expected)


def _padded_batch(lengths, T, vocab, left: bool, seed=3):
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, vocab, (len(lengths), T), generator=g)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for b, n in enumerate(lengths):
        if left:
            mask[b, T - n :] = 1
        else:
            mask[b, :n] = 1
    return idx, mask


@pytest.mark.parametrize("left", [False, True], ids=["right-padded", "left-padded"])
def test_padded_prompts_match_hugging_face_and_unpadded(hf_gpt2, left):
    hf = hf_gpt2()
    ours = ours_from_hf(hf)
    lengths, T = [5, 12, 9], 12
    idx, mask = _padded_batch(lengths, T, 97, left)
    position_ids = (mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(idx, attention_mask=mask, position_ids=position_ids).logits
        logits, _ = ours(idx, attention_mask=mask)
        for b in range(len(lengths)):
            real = mask[b].bool()
            torch.testing.assert_close(logits[b, real], ref[b, real], atol=ATOL, rtol=0)
            # and padding changes nothing: the same prompt alone gives the same logits
            alone, _ = ours(idx[b : b + 1, real])
            torch.testing.assert_close(logits[b, real], alone[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize(("arch", "shape"), SHAPES[1:])
def test_kv_cache_decoding_matches_full_forward_and_hugging_face(hf_gpt2, arch, shape):
    n_layer, n_head, n_embd, vocab, n_pos = arch
    hf = hf_gpt2(n_layer=n_layer, n_head=n_head, n_embd=n_embd, vocab_size=vocab, n_positions=n_pos)
    ours = ours_from_hf(hf)
    B, T = shape
    idx = torch.randint(0, vocab, (B, T), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = hf(idx).logits
        cache = KVCache(ours.config, batch_size=B, max_len=T)
        prefill = max(1, T // 3)
        parts = [ours(idx[:, :prefill], kv_cache=cache)[0]]
        # then a chunk of several tokens at once, then one token at a time
        chunk_end = min(T, prefill + 3)
        if chunk_end > prefill:
            parts.append(ours(idx[:, prefill:chunk_end], kv_cache=cache)[0])
        for t in range(chunk_end, T):
            parts.append(ours(idx[:, t : t + 1], kv_cache=cache)[0])
        cached = torch.cat(parts, dim=1)
        full, _ = ours(idx)
    assert cache.pos == T
    torch.testing.assert_close(cached, full, atol=ATOL, rtol=0)
    torch.testing.assert_close(cached, ref, atol=ATOL, rtol=0)


def test_kv_cache_with_left_padded_prompts_matches_hugging_face(hf_gpt2):
    hf = hf_gpt2()
    ours = ours_from_hf(hf)
    lengths, T, new = [4, 10, 7], 10, 6
    idx, mask = _padded_batch(lengths, T, 97, left=True)
    cont = torch.randint(0, 97, (3, new), generator=torch.Generator().manual_seed(5))
    full_idx = torch.cat([idx, cont], 1)
    full_mask = torch.cat([mask, torch.ones(3, new, dtype=torch.long)], 1)
    position_ids = (full_mask.cumsum(1) - 1).clamp(min=0)
    with torch.no_grad():
        ref = hf(full_idx, attention_mask=full_mask, position_ids=position_ids).logits
        cache = KVCache(ours.config, batch_size=3, max_len=T + new)
        first, _ = ours(idx, kv_cache=cache, attention_mask=mask)
        steps = [ours(cont[:, t : t + 1], kv_cache=cache)[0] for t in range(new)]
    got = torch.cat([first, *steps], 1)
    real = full_mask.bool()
    torch.testing.assert_close(got[real], ref[real], atol=ATOL, rtol=0)


def test_cache_expand_and_reorder_select_rows():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=17, block_size=16, n_layer=2, n_head=2, n_embd=8)).eval()
    prompt = torch.randint(0, 17, (1, 5))
    nxt = torch.tensor([[3], [7], [11]])
    with torch.no_grad():
        cache = KVCache(model.config, batch_size=1, max_len=16)
        model(prompt, kv_cache=cache)
        cache.expand(3)
        step, _ = model(nxt, kv_cache=cache)
        cache.reorder(torch.tensor([2, 0]))
        step2, _ = model(torch.tensor([[1], [1]]), kv_cache=cache)
        for row, (tok, src) in enumerate([(11, 2), (3, 0)]):
            seq = torch.cat([prompt, torch.tensor([[tok, 1]])], 1)
            full, _ = model(seq)
            torch.testing.assert_close(step[src, -1], full[0, -2], atol=ATOL, rtol=0)
            torch.testing.assert_close(step2[row, -1], full[0, -1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("index", [[2, 0, 1, 1], [1, 0, 3, 2], [0, 1, 2, 3], [3, 3, 3, 3]])
def test_reordering_in_place_keeps_what_each_row_is_given(index):
    """Rows swapped, rotated, repeated or left alone: each row gets its source's keys,
    values and key mask as they were before the reorder."""
    config = ModelConfig(vocab_size=17, block_size=16, n_layer=2, n_head=2, n_embd=8)
    cache = KVCache(config, batch_size=4, max_len=16)
    cache.k.copy_(torch.randn_like(cache.k))
    cache.v.copy_(torch.randn_like(cache.v))
    cache.set_key_mask(torch.rand(4, 16) > 0.5)
    cache.pos = 9
    k, v, mask = cache.k.clone(), cache.v.clone(), cache.key_mask.clone()
    buffers = cache.k.data_ptr(), cache.v.data_ptr()
    cache.reorder(torch.tensor(index))
    assert torch.equal(cache.k, k) and torch.equal(cache.v, v)  # recorded, not yet copied
    cache.settle()
    assert (cache.k.data_ptr(), cache.v.data_ptr()) == buffers  # in place
    for dst, src in enumerate(index):
        assert torch.equal(cache.k[:, dst, :9], k[:, src, :9])
        assert torch.equal(cache.v[:, dst, :9], v[:, src, :9])
        assert torch.equal(cache.key_mask[dst], mask[src])


def test_reorders_between_steps_are_recorded_then_settled():
    """Beam steps on the CPU: each step writes every row's new slot in that row, then the
    rows are reordered. Nothing is copied until settle, which leaves each row holding its
    own history, as if every reorder had copied (histories kept here as lists)."""
    config = ModelConfig(vocab_size=17, block_size=16, n_layer=2, n_head=2, n_embd=8)
    cache = KVCache(config, batch_size=4, max_len=12)
    gen = torch.Generator().manual_seed(0)
    history: list[list[torch.Tensor]] = [[] for _ in range(4)]  # per row: its slots' (L, nh, 2, hs)
    for step in range(10):
        new = torch.randn(config.n_layer, 4, config.n_head, 2, config.head_dim, generator=gen)
        cache.k[:, :, step], cache.v[:, :, step] = new[..., 0, :], new[..., 1, :]
        for r in range(4):
            history[r].append(new[:, r])
        cache.pos += 1
        index = torch.randint(0, 4, (4,), generator=gen)
        before = cache.k.clone()
        cache.reorder(index)
        assert torch.equal(cache.k, before)  # only recorded
        history = [list(history[i]) for i in index.tolist()]
    assert cache.sources is not None and not bool((cache.sources[:, :10] == cache.sources[:, :1]).all())
    cache.settle()
    assert cache.sources is None
    for r in range(4):
        want = torch.stack(history[r], dim=1)  # (L, S, nh, 2, hs)
        assert torch.equal(cache.k[:, r, :10], want[..., 0, :])
        assert torch.equal(cache.v[:, r, :10], want[..., 1, :])
    cache.reorder(torch.tensor([1, 0, 3, 2]))
    cache.reset()  # emptied: what was recorded goes too
    assert cache.sources is None and cache.pos == 0


class Seen(Probe):
    """Keeps everything a probe is shown."""

    def __init__(self) -> None:
        self.residuals: list[torch.Tensor] = []
        self.attention_maps: list[torch.Tensor] = []

    def residual(self, layer: int, x: torch.Tensor) -> None:
        assert layer == len(self.residuals)
        self.residuals.append(x)

    def attention(self, layer: int, weights: torch.Tensor) -> None:
        assert layer == len(self.attention_maps)
        self.attention_maps.append(weights)


def test_a_probe_sees_the_residual_stream_hugging_face_reports(hf_gpt2):
    """Layer 0 is the embeddings, layer l the output of block l: Hugging Face's
    hidden_states, whose last entry has already been through ln_f."""
    hf = hf_gpt2()
    ours = ours_from_hf(hf)
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = hf(idx, output_hidden_states=True).hidden_states
        seen = Seen()
        h = ours.hidden_states(idx, probe=seen)
    assert len(seen.residuals) == len(ref) == 3
    for x, r in zip(seen.residuals[:-1], ref[:-1], strict=True):
        torch.testing.assert_close(x, r, atol=ATOL, rtol=0)
    torch.testing.assert_close(ours.transformer.ln_f(seen.residuals[-1]), ref[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(h, ref[-1], atol=ATOL, rtol=0)


def test_attention_weights_match_hugging_face_eager(hf_gpt2):
    hf = hf_gpt2()
    hf.config._attn_implementation = "eager"
    ours = ours_from_hf(hf)
    idx = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = hf(idx, output_attentions=True).attentions
        seen = Seen()
        h = ours.hidden_states(idx, probe=seen)
        attn = seen.attention_maps
        logits, _ = ours(idx)
    assert len(attn) == len(ref) == 2
    for a, r in zip(attn, ref, strict=True):
        assert a.shape == (2, 4, 9, 9)
        torch.testing.assert_close(a, r, atol=ATOL, rtol=0)
        torch.testing.assert_close(a.sum(-1), torch.ones(2, 4, 9))
        assert torch.all(a.triu(diagonal=1) == 0)
    # computing the weights explicitly gives the same logits as the fused kernel
    torch.testing.assert_close(ours.lm_head(h), logits, atol=ATOL, rtol=0)


def test_gpt2_init_and_weight_tying():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=500, block_size=32, n_layer=4, n_head=4, n_embd=128)
    model = GPT(cfg)
    assert model.lm_head.weight is model.transformer.wte.weight
    std = model.transformer.h[0].mlp.c_fc.weight.std().item()
    assert abs(std - 0.02) < 0.002
    proj = model.transformer.h[0].attn.c_proj.weight.std().item()
    assert abs(proj - 0.02 / math.sqrt(2 * cfg.n_layer)) < 0.002
    assert torch.all(model.transformer.h[0].attn.c_attn.bias == 0)


def test_from_weights_holds_the_given_weights_tied_and_trainable():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=61, block_size=16, n_layer=2, n_head=2, n_embd=32)
    src = GPT(cfg).eval()
    state = {k: v.clone() for k, v in src.state_dict().items() if k != "lm_head.weight"}
    model = GPT.from_weights(cfg, state).eval()
    assert model.lm_head.weight is model.transformer.wte.weight
    assert not any(t.is_meta for t in [*model.parameters(), *model.buffers()])
    assert all(p.dtype == torch.float32 and p.requires_grad for p in model.parameters())
    x = torch.randint(0, 61, (2, 9))
    torch.testing.assert_close(model(x)[0], src(x)[0], atol=0, rtol=0)
    # a state without some weights: those are initialized as GPT(config) would, the rest kept
    partial = {k: v for k, v in state.items() if "h.1.mlp" not in k}
    filled = GPT.from_weights(cfg, partial)
    assert not any(p.is_meta for p in filled.parameters())
    torch.testing.assert_close(filled.transformer.h[0].mlp.c_fc.weight, src.transformer.h[0].mlp.c_fc.weight)
    assert abs(filled.transformer.h[1].mlp.c_fc.weight.std().item() - 0.02) < 0.005


def test_state_dict_round_trips_through_hugging_face_layout(hf_gpt2):
    hf = hf_gpt2()
    ours = ours_from_hf(hf)
    back = gptcli_to_hf_state_dict(ours.state_dict())
    for name, t in hf.state_dict().items():
        if name in back:
            torch.testing.assert_close(back[name], t)
    assert "lm_head.weight" not in back


def test_block_size_is_enforced():
    model = GPT(ModelConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=4))
    with pytest.raises(ValueError, match="block_size"):
        model(torch.zeros(1, 5, dtype=torch.long))


def test_compiled_model_computes_the_same_function():
    """Under torch.compile the GELU is written with a sigmoid (faster kernel): same logits."""
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)  # large activations, where the two GELU forms would differ if they could
        x = torch.randint(0, 50, (2, 16))
        eager = model(x)[0]
        compiled = torch.compile(model)(x)[0]
    torch.testing.assert_close(compiled, eager, atol=1e-4, rtol=1e-5)
    model.set_attention("explicit")
    with torch.no_grad():
        torch.testing.assert_close(model(x)[0], eager, atol=1e-4, rtol=1e-5)


def test_crop_block_size_keeps_what_a_shorter_context_sees():
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=50, block_size=32, n_layer=2, n_head=2, n_embd=16)).eval()
    x = torch.randint(0, 50, (2, 8))
    with torch.no_grad():
        before = model(x)[0]
        model.crop_block_size(8)
        after = model(x)[0]
    assert model.config.block_size == 8 and model.transformer.wpe.weight.shape == (8, 16)
    torch.testing.assert_close(after, before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="positions exceed"):
        model(torch.randint(0, 50, (1, 9)))


@pytest.mark.parametrize("kind", ["lm", "classify", "choice", "sft"])
def test_every_tasks_training_step_is_one_graph(kind):
    """What --compile compiles (the model and the task's loss as one module) traces into a
    single graph for every task: no graph break (a Python branch on a tensor's value, a
    .item()), so a GPU step runs without host round trips."""
    import numpy as np

    from gptcli.config import ModelConfig
    from gptcli.model import GPT
    from gptcli.tasks import Example, LMTask, SFTTask, SupervisedTask
    from gptcli.train.setup import TaskLoss

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    n_classes = {"classify": 3, "choice": 1}.get(kind, 0)
    model = GPT(
        ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, n_classes=n_classes)
    )
    if kind == "lm":
        data = rng.integers(0, 50, 1000).astype(np.uint16)
        task = LMTask(data, data, 16, 50)
    elif kind == "sft":
        rows = [(rng.integers(0, 50, int(rng.integers(5, 16))).tolist(), 3) for _ in range(8)]
        task = SFTTask({"train": rows, "val": rows}, 16)
    else:

        def seqs(n: int) -> list[list[int]]:
            return [rng.integers(0, 50, int(rng.integers(4, 16))).tolist() for _ in range(n)]

        examples = [Example(seqs(1 if kind == "classify" else 2 + i % 3), i % 2) for i in range(8)]
        task = SupervisedTask(kind, {"train": examples, "val": examples}, 0.5, 16)
    batch = task.batch("train", torch.arange(4), torch.device("cpu"))
    explained = torch._dynamo.explain(TaskLoss(model.train(), task))(batch)
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    assert explained.graph_count == 1


def test_lm_batches_cross_to_the_device_as_one_contiguous_tensor(monkeypatch):
    """x and y are views of one (B, T + 1) tensor copied once (pinned and non-blocking on a
    GPU), holding exactly the windows of the token stream."""
    import numpy as np

    from gptcli.tasks import base, lm

    data = np.arange(500, dtype=np.uint16) % 50
    task = lm.LMTask(data, data, 16, 50)
    copied = []
    real = base.to_device
    monkeypatch.setattr(lm, "to_device", lambda t, d: copied.append(t.is_contiguous()) or real(t, d))
    batch = task.batch("train", torch.tensor([0, 7, 100]), torch.device("cpu"))
    assert copied == [True]  # one copy, of a contiguous tensor
    for row, i in enumerate([0, 7, 100]):
        assert batch["x"][row].tolist() == data[i : i + 16].tolist()
        assert batch["y"][row].tolist() == data[i + 1 : i + 17].tolist()


def test_attention_over_a_growing_cache_never_asks_cudnn(monkeypatch):
    """cuDNN's attention builds a graph for each new shape (tens to hundreds of ms on a GPU): over a
    cache that grows a slot a step (the server's batch, sample and beam without --compile),
    and for a prompt read into a static one, it is left out, so that no step builds one.
    Training, and the compiled step over a static cache (one shape), keep every kernel; the
    flags are as before after each call, and a kernel the user turned off stays off."""
    seen: list[bool] = []
    sdpa = F.scaled_dot_product_attention

    def recording(*args, **kwargs):
        seen.append(torch.backends.cuda.cudnn_sdp_enabled())
        assert not torch.backends.cuda.mem_efficient_sdp_enabled()  # (turned off below)
        return sdpa(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", recording)
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)
    model = GPT(config).eval()
    assert torch.backends.cuda.cudnn_sdp_enabled()
    efficient = torch.backends.cuda.mem_efficient_sdp_enabled()
    torch.backends.cuda.enable_mem_efficient_sdp(False)
    try:
        _decode_and_record(model, config, seen)
    finally:
        torch.backends.cuda.enable_mem_efficient_sdp(efficient)


def _decode_and_record(model: GPT, config: ModelConfig, seen: list[bool]) -> None:
    with torch.no_grad():
        model(torch.randint(0, 50, (2, 8)))
        assert seen == [True, True]
        seen.clear()
        cache = KVCache(config, 2, 12, torch.device("cpu"), torch.float32)
        model.next_logits(torch.randint(0, 50, (2, 5)), kv_cache=cache)
        model.next_logits(torch.randint(0, 50, (2, 1)), kv_cache=cache)
        cache.key_mask = torch.ones(2, 12, dtype=torch.bool)  # (the server's batch: padded rows)
        model.next_logits(torch.randint(0, 50, (2, 1)), kv_cache=cache)
        assert seen == [False] * 6
        assert torch.backends.cuda.cudnn_sdp_enabled()
        seen.clear()
        static = KVCache(config, 2, 12, torch.device("cpu"), torch.float32, static=True)
        model.next_logits(torch.randint(0, 50, (2, 3)), kv_cache=static)  # (a prompt: a new shape)
        model.next_logits(torch.randint(0, 50, (2, 1)), kv_cache=static)
        assert seen == [False, False, True, True]
        assert torch.backends.cuda.cudnn_sdp_enabled()


def test_a_step_over_a_growing_cache_is_one_graph():
    """What `serve --compile` compiles (a step over the batch's growing cache, symbolic
    sizes) leaves cuDNN out without a graph break."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16)
    model = GPT(config).eval()
    cache = KVCache(config, 2, 12, torch.device("cpu"), torch.float32)
    with torch.no_grad():
        model.next_logits(torch.randint(0, 50, (2, 5)), kv_cache=cache)
        explained = torch._dynamo.explain(model.next_logits)(torch.randint(0, 50, (2, 1)), kv_cache=cache)
    assert explained.graph_break_count == 0, [str(r.reason) for r in explained.break_reasons]
    assert explained.graph_count == 1
