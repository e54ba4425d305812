"""--quantize int8: weight-only int8 with one fp32 scale per output row, quantized at load.

Every Linear of the blocks, and the unembedding, keep their weights as int8 (half of bf16's
bytes, a quarter of fp32's) and a scale each output row: w ≈ q * scale, q = round(w /
scale), scale = max |w| of the row / 127. Activations stay in the model's dtype. The token
embedding stays as it was: a lookup reads one row, and the unembedding, tied to it in
GPT-2, gets its own int8 copy. Decoding (and, where the CPU has AVX512-VNNI or AVX2, the
prompt) reads the int8 weights in gptcli/infer/decode.c (on those CPUs multiplied with the
activations as int16 with a scale per row: within 1/11,000 of the row's largest at GPT-2's
widths); everything else (eval's batches) multiplies through torch's int8 weight-only
kernel for bf16 inputs (of widths it takes), or a dequantized weight otherwise.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

QUANTIZE = ("int8",)  # what --quantize takes


class Int8Linear(nn.Module):
    """y = x (q * scale)^T + b, q int8 (out, in), scale fp32 (out)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127.0  # (out,)
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = w.size(1), w.size(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = (*x.shape[:-1], self.out_features)
        # torch's kernel reads its inputs 16 at a time, unchecked: a width not a multiple of 16
        # gave inf or NaN, or crashed (torch 2.13)
        # (not inside torch.compile: Inductor's CPU lowering of the op failed an assertion, torch 2.13)
        if (
            x.dtype == torch.bfloat16
            and x.device.type == "cpu"
            and self.in_features % 16 == 0
            and not torch.compiler.is_compiling()
        ):
            y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, self.in_features), self.weight,
                                                    self.scale.to(torch.bfloat16))  # fmt: skip
            y = y.view(shape)
            return y if self.bias is None else y + self.bias.to(y.dtype)
        w = self.weight.to(x.dtype) * self.scale.to(x.dtype)[:, None]
        return F.linear(x, w, None if self.bias is None else self.bias.to(x.dtype))

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def quantize(model: nn.Module, kind: str = "int8") -> nn.Module:
    """The model with its blocks' Linears and its unembedding in int8 (in place)."""
    if kind not in QUANTIZE:
        raise ValueError(f"unknown quantization {kind!r}")
    for block in model.transformer.h:
        for parent, name in ((block.attn, "c_attn"), (block.attn, "c_proj"), (block.mlp, "c_fc"),
                             (block.mlp, "c_proj")):  # fmt: skip
            linear = getattr(parent, name)
            setattr(parent, name, Int8Linear(linear.weight, linear.bias))
    model.lm_head = Int8Linear(model.transformer.wte.weight, None)  # no longer tied: wte stays for lookups
    return model


def weight_bytes(model: nn.Module) -> int:
    """The bytes of the weights decoding reads per token (the blocks and the unembedding)."""
    mods = [m for m in model.modules() if isinstance(m, nn.Linear | Int8Linear)]
    return sum(m.weight.numel() * m.weight.element_size() for m in mods)
