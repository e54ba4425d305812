"""LoRA (Hu et al. 2021): finetune a few low-rank matrices beside frozen weights.

A targeted nn.Linear y = x W^T + b becomes y = x W^T + b + (alpha / r) * dropout(x) A^T B^T,
with A (r, in) and B (out, r) the only weights that learn; B starts at zero, so at step 0
the model is exactly the base. Targets (ISSUE-NOTES): attn = attn.c_attn (Q, K, V),
proj = attn.c_proj, mlp = mlp.c_fc and mlp.c_proj.

Why a parametrization of our own rather than PEFT: the adapted module stays an nn.Linear
at the same place with the same weight and bias names, and only gains lora_A and lora_B.
So gptcli's safetensors names, the FSDP units (one per block), torch.compile and the
CPU decoding kernels see the model they always see, and a LoRA checkpoint is just the
adapter tensors under their own names. PEFT would wrap each module in its own classes and
rename every weight (base_model.model...base_layer.weight) and pull in its dependencies;
`export --adapters-only` still writes PEFT's format, which PEFT loads.

For inference, merge() folds each adapter into its weight, W + (alpha / r) B A, and puts
back a plain nn.Linear: every decoding path then reads ordinary weights.

Tokens a LoRA run adds (the chat template's) have no trained row in the frozen base: their
rows of the tied embedding learn as `transformer.wte.token_rows` (TokenRows), saved beside
the adapters and written into the grown base's embedding when merged.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.config import LORA_TARGETS

# --lora-targets name -> the modules of a block it adapts
TARGETS: dict[str, tuple[str, ...]] = {
    "attn": ("attn.c_attn",),
    "proj": ("attn.c_proj",),
    "mlp": ("mlp.c_fc", "mlp.c_proj"),
}
assert tuple(TARGETS) == LORA_TARGETS
TRAINED_WITH_ADAPTERS = ("classifier.",)  # a task's new head learns beside the adapters


@dataclass
class LoRASettings:
    """What a LoRA run adapts, and how (config.FinetuneSettings' lora_* fields, checked there)."""

    rank: int
    alpha: float
    dropout: float = 0.0
    targets: list[str] = field(default_factory=lambda: list(TARGETS))

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> LoRASettings | None:
        """From FinetuneSettings fields (or a checkpoint's metadata); None for full finetuning."""
        rank = int(settings.get("lora_rank") or 0)
        if rank == 0:
            return None
        alpha = settings.get("lora_alpha")
        return cls(
            rank=rank,
            alpha=float(alpha if alpha is not None else 2 * rank),
            dropout=float(settings.get("lora_dropout") or 0.0),
            targets=list(settings.get("lora_targets") or TARGETS),
        )

    @property
    def modules(self) -> tuple[str, ...]:
        """The adapted modules of each block, by name within the block."""
        return tuple(m for t in self.targets for m in TARGETS[t])


class LoRALinear(nn.Linear):
    """An nn.Linear with a frozen weight and bias and a trainable low-rank update beside them."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias  # the same Parameters, frozen
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        device = base.weight.device
        self.lora_A = nn.Parameter(torch.empty(rank, self.in_features, device=device))  # (r, in)
        self.lora_B = nn.Parameter(torch.zeros(self.out_features, rank, device=device))  # (out, r)
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # as nn.Linear (and PEFT) initialise A
        self.scale = alpha / rank
        self.lora_dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = F.linear(x, self.weight, self.bias)  # (B, T, out)
        low_rank = F.linear(F.linear(self.lora_dropout(x), self.lora_A), self.lora_B)  # via (B, T, r)
        return base + self.scale * low_rank

    def delta(self) -> torch.Tensor:
        """(alpha / r) B A, the update to the weight, in float32."""
        return self.scale * (self.lora_B.float() @ self.lora_A.float())  # (out, in)

    def merged(self) -> nn.Linear:
        """A plain nn.Linear computing what this module computes (without dropout)."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        with torch.no_grad():
            weight = (self.weight.float() + self.delta()).to(self.weight.dtype)
        linear.weight = nn.Parameter(weight, requires_grad=False)
        linear.bias = self.bias
        return linear


def _targets(model: nn.Module, modules: Sequence[str]) -> Iterator[tuple[nn.Module, str, str]]:
    """(parent module, attribute, full name) of each targeted Linear, block by block."""
    for i, block in enumerate(model.transformer.h):
        for path in modules:
            parent_path, attr = path.rsplit(".", 1)
            yield block.get_submodule(parent_path), attr, f"transformer.h.{i}.{path}"


def add_adapters(model: nn.Module, settings: LoRASettings) -> None:
    """Put adapters on the targeted Linears and freeze everything else but a task's head."""
    for parent, attr, _ in _targets(model, settings.modules):
        base = getattr(parent, attr)
        setattr(parent, attr, LoRALinear(base, settings.rank, settings.alpha, settings.dropout))
    for name, p in model.named_parameters():
        p.requires_grad_(is_trained(name))


def describe(model: nn.Module, settings: LoRASettings) -> str:
    """One line: the adapters, and how much of the model they train."""
    total = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return (
        f"rank {settings.rank}, alpha {settings.alpha:g} on {', '.join(settings.modules)}: "
        f"{trained:,} of {total:,} parameters train ({100 * trained / total:.2f}%), the base is frozen"
    )


def is_trained(name: str) -> bool:
    """Whether a LoRA run trains (and saves) the parameter of this name."""
    return name.endswith((".lora_A", ".lora_B")) or name.startswith(TRAINED_WITH_ADAPTERS) or name == ROWS


ROWS = "transformer.wte.token_rows"  # a LoRA run's new tokens' rows, (n, C)


class TokenRows(nn.Module):
    """The tied embedding (wte and lm_head) with the rows of ids first .. first + n - 1
    taken from a trainable (n, C) tensor instead of the frozen weight. It stands in for
    wte; its `head` stands in for lm_head and shares the rows."""

    def __init__(self, weight: nn.Parameter, first: int, n: int) -> None:
        super().__init__()
        self.weight, self.first = weight, first  # the frozen (V, C) base
        self.token_rows = nn.Parameter(weight.detach()[first : first + n].clone().float())  # (n, C)
        self.head = _Head(self)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        n = self.token_rows.size(0)
        new = (idx >= self.first) & (idx < self.first + n)  # (B, T)
        rows = F.embedding((idx - self.first).clamp(0, n - 1), self.token_rows)  # (B, T, C)
        return torch.where(new[..., None], rows.to(self.weight.dtype), F.embedding(idx, self.weight))

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        base = F.linear(h, self.weight.to(h.dtype))  # (B, T, V)
        new = F.linear(h, self.token_rows.to(h.dtype))  # (B, T, n)
        end = self.first + self.token_rows.size(0)
        return torch.cat([base[..., : self.first], new, base[..., end:]], dim=-1)

    def merged(self) -> torch.Tensor:
        """The weight with the learnt rows written in."""
        with torch.no_grad():
            w = self.weight.detach().clone()
            w[self.first : self.first + self.token_rows.size(0)] = self.token_rows.to(w.dtype)
        return w


class _Head(nn.Module):
    """lm_head's stand-in: logits through TokenRows (kept unregistered: the rows are saved once)."""

    def __init__(self, rows: TokenRows) -> None:
        super().__init__()
        self._rows = (rows,)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self._rows[0].logits(h)


def train_token_rows(model: nn.Module, ids: Sequence[int]) -> None:
    """Let the rows of ids (new tokens, contiguous) learn beside the adapters."""
    rows = TokenRows(model.lm_head.weight, min(ids), len(ids))
    model.transformer.wte, model.lm_head = rows, rows.head


def has_adapters(model: nn.Module) -> bool:
    return any(isinstance(m, LoRALinear) for m in model.modules())


def hold_base_in(model: nn.Module, dtype: torch.dtype) -> None:
    """Store the frozen weights of the adapted Linears in dtype (bf16 halves them; autocast
    would cast them to it on every forward anyway). The adapters stay float32."""
    for m in model.modules():
        if isinstance(m, LoRALinear):
            m.weight.data = m.weight.data.to(dtype)


def merge(model: nn.Module) -> None:
    """Fold every adapter into its weight, leaving a plain GPT (for inference and export)."""
    rows = model.transformer.wte
    if isinstance(rows, TokenRows):
        weight = nn.Parameter(rows.merged(), requires_grad=False)
        model.transformer.wte = nn.Embedding(*weight.shape, _weight=weight, _freeze=True)
        model.lm_head = nn.Linear(weight.size(1), weight.size(0), bias=False, device="meta")
        model.lm_head.weight = model.transformer.wte.weight
    for name, m in list(model.named_modules()):
        if isinstance(m, LoRALinear):
            parent_name, attr = name.rsplit(".", 1)
            setattr(model.get_submodule(parent_name), attr, m.merged())


def planned_shapes(
    model: nn.Module, settings: LoRASettings, n_classes: int, new_tokens: int = 0
) -> dict[str, tuple[int, ...]]:
    """What a LoRA checkpoint of these settings on this (plain) model holds, computed from
    the base's shapes without building anything: so that the sizes a checkpoint claims
    (rank, classes) are checked against its file before adapters of that size exist."""
    shapes: dict[str, tuple[int, ...]] = {}
    for parent, attr, name in _targets(model, settings.modules):
        base = getattr(parent, attr)
        shapes[f"{name}.lora_A"] = (settings.rank, base.in_features)
        shapes[f"{name}.lora_B"] = (base.out_features, settings.rank)
    if n_classes:
        shapes |= {"classifier.weight": (n_classes, model.config.n_embd), "classifier.bias": (n_classes,)}
    if new_tokens:
        shapes[ROWS] = (new_tokens, model.config.n_embd)
    return shapes


def adapter_shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    """What a LoRA checkpoint of this (adapted) model holds: the adapters and any head."""
    return {n: tuple(p.shape) for n, p in model.named_parameters() if is_trained(n)}


# --- PEFT's format, for export --adapters-only -------------------------------------------------


def peft_tensors(saved: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The adapters of a LoRA checkpoint (saved: name -> tensor, as adapter_shapes names
    them) under PEFT's names for Hugging Face's GPT2LMHeadModel. Its Conv1D layers hold W
    transposed (in, out); PEFT's A (r, in) and B (out, r) are ours as they are (with
    fan_in_fan_out it transposes the product), so nothing is transposed here."""
    return {
        f"base_model.model.{name}.weight": tensor.detach().float().cpu().contiguous()
        for name, tensor in saved.items()
        if name.endswith((".lora_A", ".lora_B"))
    }


def peft_config(settings: LoRASettings, base_name: str) -> dict:
    """adapter_config.json: the targets named by their full suffix, so that attn.c_proj and
    mlp.c_proj stay apart (a plain "c_proj" would match both)."""
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_name,
        "r": settings.rank,
        "lora_alpha": settings.alpha,
        "lora_dropout": settings.dropout,
        "target_modules": list(settings.modules),
        "fan_in_fan_out": True,  # GPT-2's Conv1D stores weights as (in, out)
        "bias": "none",
        "modules_to_save": None,
        "init_lora_weights": True,
        "inference_mode": True,
    }
