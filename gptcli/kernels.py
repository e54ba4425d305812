"""Faster decoding kernels for bf16 models on the CPU.

Decoding one token reads every weight once and does little else, so its speed is set by
the bytes of weights read per token. With bf16 weights, the stock CPU matmul for a single
row reaches about half the machine's memory bandwidth; a product written as an elementwise
multiply and a reduction, compiled by TorchInductor, streams the weights at close to full
bandwidth (bench/RESULTS.md). It is used for the Linear layers of a bf16 model on the CPU
when one or two rows go through them (decoding); prefill, training and anything else keep
the stock kernel. Likewise the CPU's fused bf16 attention is slow for a single query (and
grows slower with the context): one new token attends through a compiled fp32 product
and softmax instead. Without a working compiler everything quietly falls back to eager.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.model import MLP, CausalSelfAttention

MAX_ROWS = 2  # beyond this the stock matmul reuses each weight across rows and wins
_state: dict[str, Any] = {"ok": True, "gemv": None, "attend": None}


def _gemv_impl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T + b, accumulated in fp32."""
    y = (x[:, None, :].float() * w[None, :, :].float()).sum(-1)  # (M, N)
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype)


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


def _compiled(name: str) -> Any:
    if _state[name] is None:
        _state[name] = torch.compile({"gemv": _gemv_impl, "attend": _attend_impl}[name], dynamic=True)
    return _state[name]


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # the model is bf16 on the CPU (use_fast_decode checked); decoding sends one row or two
    rows = x.numel() // x.size(-1)
    if rows <= MAX_ROWS and _state["ok"] and not torch.is_grad_enabled():
        try:
            y = _compiled("gemv")(x.reshape(rows, x.size(-1)), self.weight, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        except Exception:  # no C++ compiler, or the backend failed: use the stock kernel
            _state["ok"] = False
    return F.linear(x, self.weight, self.bias)


def _attend(
    self: CausalSelfAttention,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    attentions: list[torch.Tensor] | None = None,
) -> torch.Tensor:
    if q.size(2) == 1 and attentions is None and _state["ok"] and not torch.is_grad_enabled():
        try:
            return _compiled("attend")(q, k, v, mask)
        except Exception:
            _state["ok"] = False
    return CausalSelfAttention.attend(self, q, k, v, mask, attentions)


def use_fast_decode(model: nn.Module) -> bool:
    """Route the model's Linear layers through the decoding kernel and single-query
    attention through its own, and compile each MLP whole (its two products and the GELU in
    one call, rather than many small ones): bf16 on the CPU only. Returns whether it applies."""
    p = next(model.parameters())
    if p.dtype != torch.bfloat16 or p.device.type != "cpu":
        return False
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_forward, module)
        elif isinstance(module, CausalSelfAttention):
            module.attend = types.MethodType(_attend, module)
    for module in model.modules():
        if isinstance(module, MLP) and _state["ok"]:
            module.forward = _compiled_or_plain(module.forward)
    return True


def _compiled_or_plain(fn: Any) -> Any:
    """fn compiled for any number of rows, falling back to fn itself if compiling fails."""
    compiled = torch.compile(fn, dynamic=True)

    def call(*args: Any, **kwargs: Any) -> Any:
        if _state["ok"]:
            try:
                return compiled(*args, **kwargs)
            except Exception:
                _state["ok"] = False
        return fn(*args, **kwargs)

    return call
