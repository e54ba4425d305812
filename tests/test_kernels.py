"""The decoding kernel: same results as the stock matmul, used only where it should be."""

from __future__ import annotations

import torch

from gptcli import kernels
from gptcli.config import ModelConfig
from gptcli.generate import generate
from gptcli.model import GPT


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
