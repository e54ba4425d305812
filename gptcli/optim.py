"""How the weights move: the optimizer and the learning-rate schedule.

AdamW with weight decay on matrices and embeddings only (fused where the device supports
it); linear warmup, then cosine decay to min_lr at max_iters, or at max_time if that
budget runs out first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn as nn

from gptcli.config import TrainConfig


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings, none on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


def lr_at(
    step: int, cfg: TrainConfig, elapsed: float = 0.0, decay_from: Sequence[float] | None = None
) -> float:
    """Linear warmup over warmup_iters, then cosine decay to min_lr at max_iters, or at
    max_time if that budget runs out first.

    decay_from (step, lr, elapsed): where the cosine starts, instead of (warmup_iters, lr, 0).
    A resumed run given a new max_iters or max_time decays from its current rate to min_lr
    at the new end, rather than jumping back up the old curve."""
    if step < cfg.warmup_iters and decay_from is None:
        return cfg.lr * (step + 1) / (cfg.warmup_iters + 1)
    s0, lr0, e0 = decay_from if decay_from is not None else (cfg.warmup_iters, cfg.lr, 0.0)
    progress = (step - s0) / max(1, cfg.max_iters - s0)
    if cfg.max_time:
        progress = max(progress, (elapsed - e0) / max(1e-9, cfg.max_time - e0))
    coeff = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return cfg.min_lr + coeff * (lr0 - cfg.min_lr)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr
