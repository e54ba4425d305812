"""Checkpoints: our run dirs on disk, and Hugging Face GPT-2 weights in and out."""

from __future__ import annotations

import torch

# Hugging Face's GPT-2 stores these projections as Conv1D, i.e. weight (in, out): the
# transpose of nn.Linear's (out, in).
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_to_gptcli_state_dict(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a Hugging Face GPT2LMHeadModel / GPT2Model state dict onto our parameter names."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in hf.items():
        name = key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of old transformers versions, not weights
        if name.endswith(_CONV1D):
            tensor = tensor.t()
        out[name] = tensor.contiguous()
    out.setdefault("lm_head.weight", out["transformer.wte.weight"])
    return out


def gptcli_to_hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in Hugging Face GPT2LMHeadModel's layout (tied lm_head left out)."""
    return {
        name: (t.t() if name.endswith(_CONV1D) else t).contiguous()
        for name, t in sd.items()
        if name != "lm_head.weight"
    }
