"""A faster matrix-vector product for decoding on the CPU.

Decoding one token reads every weight once and does little else, so its speed is set by
the bytes of weights read per token. With bf16 weights, the stock CPU matmul for a single
row reaches about half the machine's memory bandwidth; a product written as an elementwise
multiply and a reduction, compiled by TorchInductor, streams the weights at close to full
bandwidth (bench/RESULTS.md). It is used for the Linear layers of a bf16 model on the CPU
when one or two rows go through them (decoding); prefill, training and anything else keep
the stock kernel. Without a working compiler everything quietly falls back to eager.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

MAX_ROWS = 2  # beyond this the stock matmul reuses each weight across rows and wins
_state: dict[str, Any] = {"ok": True, "gemv": None}


def _gemv_impl(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    """x (M, K) @ w (N, K)^T + b, accumulated in fp32."""
    y = (x[:, None, :].float() * w[None, :, :].float()).sum(-1)  # (M, N)
    if b is not None:
        y = y + b.float()
    return y.to(x.dtype)


def _gemv() -> Any:
    if _state["gemv"] is None:
        _state["gemv"] = torch.compile(_gemv_impl, dynamic=True)
    return _state["gemv"]


def _forward(self: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    # the model is bf16 on the CPU (use_fast_decode checked); decoding sends one row or two
    rows = x.numel() // x.size(-1)
    if rows <= MAX_ROWS and _state["ok"] and not torch.is_grad_enabled():
        try:
            y = _gemv()(x.reshape(rows, x.size(-1)), self.weight, self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        except Exception:  # no C++ compiler, or the backend failed: use the stock kernel
            _state["ok"] = False
    return F.linear(x, self.weight, self.bias)


def use_fast_decode(model: nn.Module) -> bool:
    """Route the model's Linear layers through the decoding kernel, and compile each MLP
    whole (its two products and the GELU in one call, rather than many small ones): bf16
    on the CPU only. Returns whether it applies."""
    from gptcli.model import MLP

    p = next(model.parameters())
    if p.dtype != torch.bfloat16 or p.device.type != "cpu":
        return False
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.forward = types.MethodType(_forward, module)
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
