"""Faster decoding for bf16 models on the CPU.

Decoding one token reads every weight once and does little else, so its speed is set by
the bytes of weights read per token. With bf16 weights, the stock CPU matmul for a single
row reaches about half the machine's memory bandwidth; a product written as an elementwise
multiply and a reduction, compiled by TorchInductor, streams the weights at close to full
bandwidth (bench/RESULTS.md). The CPU's fused bf16 attention is slow for a single query
too, and grows slower with the context.

So a bf16 model on the CPU decodes each new token through one compiled call per block:
LayerNorm, the q/k/v product, the KV-cache write, single-query attention in fp32, the
output projection and the MLP, all in one TorchInductor kernel, with no Python between
the ops. The remaining Linear layers (the unembedding) take the reduction kernel when one
or two rows go through them. Prefill, training and anything else keep the model's own
code. Without a working compiler everything quietly falls back to eager.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model import Block, KVCache, Probe, gelu

MAX_ROWS = 2  # beyond this the stock matmul reuses each weight across rows and wins
_state: dict[str, Any] = {"ok": True, "gemv": None, "block": None}


def _gemv_impl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T + b, accumulated in fp32."""
    y = (x[:, None, :].float() * w[None, :, :].float()).sum(-1)  # (M, N)
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype)


def _linear_impl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """F.linear for x (B, 1, K): the reduction for up to MAX_ROWS rows, the matmul beyond."""
    if x.size(0) > MAX_ROWS:
        return F.linear(x, w, b)
    return _gemv_impl(x[:, 0], w, b)[:, None]


def _attend_impl(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs)) v for one query per row, in fp32: q (B, nh, 1, hs),
    k and v (B, nh, S, hs), mask (B, 1, 1, S) or None."""
    scores = (q.float() * k.float()).sum(-1, keepdim=True) * q.size(-1) ** -0.5  # (B, nh, S, 1)
    if mask is not None:
        scores = scores.masked_fill(~mask.transpose(-1, -2), float("-inf"))
    p = scores.softmax(dim=-2)
    return (p * v.float()).sum(-2, keepdim=True).to(q.dtype)  # (B, nh, 1, hs)


def _block_step_impl(
    x: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    mask: torch.Tensor | None,
    w: tuple[torch.Tensor | None, ...],
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Block.forward for one new token per row, x (B, 1, C), attending over this layer's
    cache (B, nh, S, hs), whose last position it fills with its keys and values. w: the
    block's weights in order (ln_1, c_attn, attn c_proj, ln_2, c_fc, mlp c_proj; weight
    then bias each).

    Returns the block's output and both LayerNorm outputs: handing those back makes the
    compiler store them, rather than recompute the normalisation inside every row of the
    product that reads them."""
    ln1_w, ln1_b, attn_w, attn_b, proj_w, proj_b, ln2_w, ln2_b, fc_w, fc_b, out_w, out_b = w
    B, _, C = x.shape
    nh, hs = k_cache.size(1), k_cache.size(3)
    h1 = F.layer_norm(x, (C,), ln1_w, ln1_b, 1e-5)
    q, k, v = _linear_impl(h1, attn_w, attn_b).split(C, dim=2)  # (B, 1, C) each
    k_cache[:, :, -1:] = k.view(B, 1, nh, hs).transpose(1, 2)
    v_cache[:, :, -1:] = v.view(B, 1, nh, hs).transpose(1, 2)
    y = _attend_impl(q.view(B, nh, 1, hs), k_cache, v_cache, mask)
    x = x + _linear_impl(y.reshape(B, 1, C), proj_w, proj_b)
    h2 = F.layer_norm(x, (C,), ln2_w, ln2_b, 1e-5)
    x = x + _linear_impl(gelu(_linear_impl(h2, fc_w, fc_b)), out_w, out_b)
    return x, h1, h2


# the gemv takes any number of rows and columns; the block step keeps its sizes static,
# except the number of cached positions (marked dynamic where it is called)
_COMPILE = {"gemv": (_gemv_impl, True), "block": (_block_step_impl, None)}


def _compiled(name: str) -> Any:
    if _state[name] is None:
        fn, dynamic = _COMPILE[name]
        _state[name] = torch.compile(fn, dynamic=dynamic)
    return _state[name]


def _linear_forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # the model is bf16 on the CPU (use_fast_decode checked); decoding sends one row or two
    rows = x.numel() // x.size(-1)
    if rows <= MAX_ROWS and _state["ok"] and not torch.is_grad_enabled():
        try:
            y = _compiled("gemv")(x.reshape(rows, x.size(-1)), self.weight, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        except Exception:  # no C++ compiler, or the backend failed: use the stock kernel
            _state["ok"] = False
    return F.linear(x, self.weight, self.bias)


def _block_forward(
    self: Block,
    x: torch.Tensor,
    mask: torch.Tensor | None,
    kv_cache: KVCache | None = None,
    probe: Probe | None = None,
) -> torch.Tensor:
    attn, mlp = self.attn, self.mlp
    if (
        x.size(1) == 1
        and kv_cache is not None
        and probe is None
        and not attn.explicit
        and not self.training
        and _state["ok"]
        and not torch.is_grad_enabled()
    ):
        layer = attn.layer_idx
        w = (self.ln_1.weight, self.ln_1.bias, attn.c_attn.weight, attn.c_attn.bias, attn.c_proj.weight)
        w += (attn.c_proj.bias, self.ln_2.weight, self.ln_2.bias, mlp.c_fc.weight, mlp.c_fc.bias)
        w += (mlp.c_proj.weight, mlp.c_proj.bias)
        end = kv_cache.pos + 1
        k, v = kv_cache.k[layer, :, :, :end], kv_cache.v[layer, :, :, :end]  # (B, nh, S, hs)
        for t in (k, v, mask):
            if t is not None:
                torch._dynamo.maybe_mark_dynamic(t, 3 if t is mask else 2)  # S
        try:
            return _compiled("block")(x, k, v, mask, w)[0]
        except Exception:
            _state["ok"] = False
    return Block.forward(self, x, mask, kv_cache, probe)


def use_fast_decode(model: nn.Module) -> bool:
    """Decode one token at a time through one compiled call per block, and route the other
    Linear layers through the reduction kernel: bf16 on the CPU only. Returns whether it
    applies."""
    p = next(model.parameters())
    if p.dtype != torch.bfloat16 or p.device.type != "cpu":
        return False
    # one graph per model shape and batch size, plus one for a full cache: leave room for a
    # few models in one process before torch.compile gives up and runs the step eagerly
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    for module in model.modules():
        if isinstance(module, Block):
            module.forward = types.MethodType(_block_forward, module)
        elif isinstance(module, nn.Linear):
            module.forward = types.MethodType(_linear_forward, module)
    return True
