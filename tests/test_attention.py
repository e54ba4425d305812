"""Attention capture: the weights are the model's own, and the top-k are its probabilities."""

from __future__ import annotations

import math

import torch

from gptcli.config import ModelConfig
from gptcli.inspect.attention import AttentionMaps, capture
from gptcli.model import GPT


def trained_like_model() -> GPT:
    torch.manual_seed(0)
    model = GPT(ModelConfig(vocab_size=31, block_size=16, n_layer=3, n_head=4, n_embd=32)).eval()
    with torch.no_grad():  # larger weights than the init, so the maps are far from uniform
        for p in model.parameters():
            p.mul_(8.0)
    return model


QK = list[tuple[torch.Tensor, torch.Tensor]]


def capture_with_qk(model: GPT, ids: list[int]) -> tuple[AttentionMaps, QK]:
    """capture(), and the Q and K of every layer taken from the model's own c_attn
    projections during that same forward pass (another pass, through the fused kernel,
    would differ in the last bits of each layer's input, which large weights amplify)."""
    out: list[torch.Tensor] = []
    hooks = [
        b.attn.c_attn.register_forward_hook(lambda m, i, o: out.append(o.detach()))
        for b in model.transformer.h
    ]
    try:
        maps = capture(model, ids)
    finally:
        for h in hooks:
            h.remove()
    C, nh = model.config.n_embd, model.config.n_head
    qk = []
    for qkv in out:
        q, k, _ = qkv[0].split(C, dim=-1)
        T = q.size(0)
        qk.append((q.view(T, nh, C // nh).transpose(0, 1), k.view(T, nh, C // nh).transpose(0, 1)))
    return maps, qk


def test_weights_are_masked_softmax_of_the_models_own_q_and_k():
    model = trained_like_model()
    ids = [3, 14, 15, 9, 2, 6, 5, 3, 5, 8]
    maps, qks = capture_with_qk(model, ids)
    T = len(ids)
    assert maps.attention.shape == (3, 4, T, T)
    torch.testing.assert_close(maps.attention.sum(-1), torch.ones(3, 4, T))
    assert torch.all(maps.attention.triu(diagonal=1) == 0)
    mask = torch.ones(T, T, dtype=torch.bool).tril()
    for layer, (q, k) in enumerate(qks):
        scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (nh, T, T)
        expected = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        torch.testing.assert_close(maps.attention[layer], expected, atol=1e-5, rtol=0)
    assert maps.attention.max() > 0.5  # not a near-uniform map that any formula would match


def test_top_k_are_the_softmax_of_the_last_logits():
    model = trained_like_model()
    ids = [1, 2, 3, 4]
    maps = capture(model, ids)
    with torch.no_grad():
        logits, _ = model(torch.tensor([ids]))  # the fused path
    probs = logits[0, -1].softmax(-1)
    torch.testing.assert_close(maps.next_probs, probs, atol=1e-6, rtol=0)
    top_ids, top_probs = maps.top_k(5)
    assert top_ids == torch.topk(probs, 5).indices.tolist()
    assert top_probs == sorted(top_probs, reverse=True)


def test_select_layers_heads_and_mean():
    maps = capture(trained_like_model(), [1, 2, 3])
    assert maps.select([0, 2], [1]).shape == (2, 1, 3, 3)
    mean = maps.select([1], "mean")
    torch.testing.assert_close(mean[0, 0], maps.attention[1].mean(0))
