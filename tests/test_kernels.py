"""The decoding kernels: same results as the stock model, used only where they should be."""

from __future__ import annotations

import torch

from gptcli.config import ModelConfig
from gptcli.infer import kernels
from gptcli.infer.generate import GREEDY, generate
from gptcli.model import GPT, KVCache


def small_model(dtype: torch.dtype) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=97, block_size=32, n_layer=2, n_head=2, n_embd=64)).eval().to(dtype)


def test_only_bf16_models_on_the_cpu_use_it():
    assert not kernels.use_fast_decode(small_model(torch.float32))
    assert kernels.use_fast_decode(small_model(torch.bfloat16))


def test_decoding_with_the_kernel_matches_the_stock_matmul():
    stock, fast = small_model(torch.bfloat16), small_model(torch.bfloat16)
    kernels.use_fast_decode(fast)
    x = torch.randn(1, 1, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        for a, b in zip(stock.modules(), fast.modules(), strict=True):
            if isinstance(a, torch.nn.Linear) and a.in_features == 64:
                torch.testing.assert_close(b(x).float(), a(x).float(), atol=0.05, rtol=0.02)
        got = [int(s.tokens[0]) for s in generate(fast, [1, 2, 3], 12, sampling=GREEDY)]
        want = [int(s.tokens[0]) for s in generate(stock, [1, 2, 3], 12, sampling=GREEDY)]
    assert got == want
    # training and long inputs keep the stock kernel (the wrapper is only for 1-2 rows, no grad)
    h = torch.randn(4, 64, dtype=torch.bfloat16, requires_grad=True)
    fast.lm_head(h).float().sum().backward()
    assert h.grad is not None


def test_a_failing_compiler_falls_back_to_the_stock_kernel(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setitem(kernels._state, "gemv", broken)
    monkeypatch.setitem(kernels._state, "ok", True)
    model = small_model(torch.bfloat16)
    kernels.use_fast_decode(model)
    with torch.no_grad():
        out = [int(s.tokens[0]) for s in generate(model, [1, 2], 5, sampling=GREEDY)]
    assert len(out) == 5 and kernels._state["ok"] is False


def test_one_token_through_a_compiled_block_matches_the_stock_block():
    stock, fast = small_model(torch.bfloat16), small_model(torch.bfloat16)
    kernels.use_fast_decode(fast)
    g = torch.Generator().manual_seed(0)
    for rows in (1, 3):  # the reduction kernel for few rows, the matmul for more
        x = torch.randn(rows, 1, 64, generator=g).bfloat16()
        mask = torch.rand(rows, 1, 1, 9, generator=g) < 0.7
        mask[..., -1] = True  # every row sees at least its own token
        for m in (None, mask):
            caches = []
            for _ in range(2):
                cache = KVCache(stock.config, rows, 16, dtype=torch.bfloat16)
                cache.k.normal_(generator=torch.Generator().manual_seed(1))
                cache.v.normal_(generator=torch.Generator().manual_seed(2))
                cache.pos = 8
                caches.append(cache)
            with torch.no_grad():
                want = stock.transformer.h[1](x, m, caches[0])
                got = fast.transformer.h[1](x, m, caches[1])
            torch.testing.assert_close(got.float(), want.float(), atol=0.05, rtol=0.02)
            # the new token's keys and values went to position 8 of layer 1, as the stock code does
            torch.testing.assert_close(caches[1].k.float(), caches[0].k.float(), atol=0.02, rtol=0.01)
            torch.testing.assert_close(caches[1].v.float(), caches[0].v.float(), atol=0.02, rtol=0.01)
    assert kernels._state["ok"] and kernels._state["block"] is not None  # compiled, no fallback


def test_padded_batch_decoding_with_the_kernels_matches_the_stock_model():
    stock, fast = small_model(torch.bfloat16), small_model(torch.bfloat16)
    kernels.use_fast_decode(fast)
    idx = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    pad = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    new = torch.tensor([[8], [9]])
    logits = []
    with torch.no_grad():
        for model in (stock, fast):
            cache = KVCache(model.config, 2, 8, dtype=torch.bfloat16)
            model(idx, kv_cache=cache, attention_mask=pad)
            logits.append(model(new, kv_cache=cache)[0].float())  # one query per row: the kernel
    torch.testing.assert_close(logits[1], logits[0], atol=0.05, rtol=0.05)
    assert kernels._state["ok"]


def test_the_cli_decodes_bf16_models_through_the_kernels(trained):
    from gptcli.cli.common import load_model
    from gptcli.data.tokenizer import load_tokenizer

    def patched(model: GPT) -> bool:
        return getattr(model.lm_head.forward, "__func__", None) is kernels._linear_forward

    assert not patched(load_model(str(trained), "cpu", "fp32").model)
    fast = load_model(str(trained), "cpu", "bf16").model
    assert patched(fast) and fast.lm_head.weight.dtype == torch.bfloat16
    stock = load_model(str(trained), "cpu", "fp32").model.to(torch.bfloat16)
    prompt = load_tokenizer(str(trained)).encode("The fox")
    with torch.no_grad():
        got = [int(s.tokens[0]) for s in generate(fast, prompt, 10, sampling=GREEDY)]
        want = [int(s.tokens[0]) for s in generate(stock, prompt, 10, sampling=GREEDY)]
    assert got == want and kernels._state["ok"]
