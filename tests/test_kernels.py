"""The decoding kernel: same results as the stock matmul, used only where it should be."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptcli import kernels
from gptcli.config import ModelConfig
from gptcli.generate import generate
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
        got = [int(s.tokens[0]) for s in generate(fast, [1, 2, 3], 12, temperature=0.0)]
        want = [int(s.tokens[0]) for s in generate(stock, [1, 2, 3], 12, temperature=0.0)]
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
        out = [int(s.tokens[0]) for s in generate(model, [1, 2], 5, temperature=0.0)]
    assert len(out) == 5 and kernels._state["ok"] is False


def test_single_query_attention_matches_the_fused_kernel():
    fast = small_model(torch.bfloat16)
    kernels.use_fast_decode(fast)
    attn = fast.transformer.h[0].attn
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, n, 32, generator=g).bfloat16() for n in (1, 9, 9))
    mask = torch.rand(3, 1, 1, 9, generator=g) < 0.7
    mask[..., -1] = True  # every row sees at least its own token
    with torch.no_grad():
        for m in (None, mask):
            want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=m)
            torch.testing.assert_close(attn.attend(q, k, v, m).float(), want, atol=0.02, rtol=0.02)
        # more than one query (prefill) goes through the model's own path
        q4 = torch.randn(3, 2, 4, 32, generator=g).bfloat16()
        got = attn.attend(q4, k[:, :, :4], v[:, :, :4], None)
    want = F.scaled_dot_product_attention(
        q4.float(), k[:, :, :4].float(), v[:, :, :4].float(), is_causal=True
    )
    torch.testing.assert_close(got.float(), want, atol=0.02, rtol=0.02)
    assert kernels._state["ok"]  # the compiled kernel ran (no silent fallback)


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
    from gptcli.tokenizer import load_tokenizer

    def patched(model: GPT) -> bool:
        return getattr(model.lm_head.forward, "__func__", None) is kernels._forward

    assert not patched(load_model(str(trained), "cpu", "fp32").model)
    fast = load_model(str(trained), "cpu", "bf16").model
    assert patched(fast) and fast.lm_head.weight.dtype == torch.bfloat16
    stock = load_model(str(trained), "cpu", "fp32").model.to(torch.bfloat16)
    prompt = load_tokenizer(str(trained)).encode("The fox")
    with torch.no_grad():
        got = [int(s.tokens[0]) for s in generate(fast, prompt, 10, temperature=0.0)]
        want = [int(s.tokens[0]) for s in generate(stock, prompt, 10, temperature=0.0)]
    assert got == want and kernels._state["ok"]
