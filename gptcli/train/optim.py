"""How the weights move: the optimizers and the learning-rate schedule.

AdamW alone (--optimizer adamw), with weight decay on matrices and embeddings only; or
Muon (--optimizer muon, torch.optim.Muon) for the blocks' hidden matrices, the attention
and MLP projections, with AdamW for everything else: the tied token embedding and head,
the position embedding, LayerNorms, biases and a task's head. LoRA runs keep AdamW alone:
LoRA freezes exactly the matrices Muon is for, and its adapters are thin factors (rank r)
of an update, not the hidden matrices whose whole update Muon orthogonalizes.

The schedule: linear warmup, then cosine decay to min_lr (--schedule cosine), or a
constant rate and a linear decay to min_lr over the last --decay-fraction of the run
(--schedule wsd), each ending at max_iters or at max_time if that budget runs out first.
Muon's rate follows the same curve, scaled to its own peak (--muon-lr), but skips the
warmup, which is AdamW's (rates_at).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn as nn

from gptcli.config import TrainConfig
from gptcli.errors import UsageError
from gptcli.runtime import cpu_bf16_feature

Optimizers = dict[str, torch.optim.Optimizer]  # "adamw", and "muon" when the run uses it

# Muon's settings, chosen by measurement (bench/muon_settings.py): Keller Jordan's
# sqrt(max(1, rows/cols)) rate scaling ("original"), no weight decay on the Muon matrices,
# lr 0.03 and 4 Newton-Schulz steps. The scores behind each choice are in bench/RESULTS.md,
# "Muon settings" (and "Muon settings: the choice in short").
MUON_ADJUST_LR = "original"
MUON_WEIGHT_DECAY = 0.0


class Muon(torch.optim.Muon):
    """torch.optim.Muon, whose Newton-Schulz iteration runs in bf16; with ns_dtype, the same
    step with the iteration in that dtype (the state and settings stay torch's).

    On a CPU without native bf16 matmuls (AVX2) torch's bf16 iteration made a step of the
    bench's 4-layer, 256-wide model take 9.1 s against AdamW's 0.42 s (bf16 matmuls ran at
    14 GFLOP/s there, fp32 at 79); in fp32 it takes 0.6 s. So there, and only there, gptcli
    runs it in fp32 (make_optimizers). The tests check that this step with ns_dtype bf16 equals
    torch's exactly."""

    def __init__(self, params: Any, ns_dtype: torch.dtype | None = None, **settings: Any) -> None:
        super().__init__(params, **settings)
        self.ns_dtype = ns_dtype  # None: torch's own step

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        if self.ns_dtype is None:
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, decay, momentum = group["lr"], group["weight_decay"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = _orthogonalize(
                    update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype
                )
                p.mul_(1 - lr * decay)
                p.add_(update, alpha=-lr * _lr_scale(group["adjust_lr_fn"], p.shape))
        return loss


def _orthogonalize(
    g: torch.Tensor, coefficients: Sequence[float], steps: int, eps: float, dtype: torch.dtype
) -> torch.Tensor:
    """The quintic Newton-Schulz iteration of torch.optim.Muon (Keller Jordan's), in dtype:
    roughly U V^T of g = U S V^T."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x.div(x.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def _lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's learning-rate adjustment for a rows x cols matrix."""
    rows, cols = shape[:2]
    if adjust_lr_fn in (None, "original"):
        return math.sqrt(max(1.0, rows / cols))
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    return 1.0


def block_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The 2-D weights Muon trains: each block's attention (c_attn, c_proj) and MLP (c_fc,
    c_proj) projections, where they are trained (a LoRA base is frozen)."""
    out = []
    for block in model.transformer.h:  # type: ignore[union-attr]
        for linear in (block.attn.c_attn, block.attn.c_proj, block.mlp.c_fc, block.mlp.c_proj):
            if linear.weight.requires_grad:
                out.append(linear.weight)
    return out


def fast_bf16(device: torch.device) -> bool:
    """Whether the device multiplies bf16 matrices natively (torch's Muon iterates in bf16)."""
    return device.type != "cpu" or cpu_bf16_feature() is not None


def make_optimizers(model: nn.Module, cfg: TrainConfig, device: torch.device) -> Optimizers:
    """The run's optimizers, every trained parameter in exactly one of them."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizers: Optimizers = {}
    if cfg.optimizer == "muon":
        hidden = block_matrices(model)
        if not hidden:
            raise UsageError(
                "--optimizer muon trains the blocks' weight matrices, and this model trains none "
                "of them; use --optimizer adamw"
            )
        optimizers["muon"] = Muon(
            hidden,
            ns_dtype=None if fast_bf16(device) else torch.float32,
            lr=cfg.muon_lr,
            momentum=cfg.muon_momentum,
            nesterov=True,
            weight_decay=MUON_WEIGHT_DECAY,
            adjust_lr_fn=MUON_ADJUST_LR,
            ns_steps=cfg.muon_ns_steps,
        )
        taken = {id(p) for p in hidden}
        params = [p for p in params if id(p) not in taken]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cuda", "cpu")
    adamw = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)
    return {"adamw": adamw, **optimizers}


def describe(optimizers: Optimizers, cfg: TrainConfig) -> dict[str, dict[str, Any]]:
    """Each optimizer's share of the model and its peak learning rate, for the run header
    and checkpoint.json."""
    out: dict[str, dict[str, Any]] = {}
    for name, opt in optimizers.items():
        tensors = [p for g in opt.param_groups for p in g["params"]]
        info: dict[str, Any] = {"tensors": len(tensors), "params": sum(p.numel() for p in tensors)}
        if isinstance(opt, Muon):
            ns = str(opt.ns_dtype or torch.bfloat16).removeprefix("torch.")
            info |= {"lr": cfg.muon_lr, "momentum": cfg.muon_momentum, "weight_decay": MUON_WEIGHT_DECAY}
            info |= {"newton_schulz": {"bfloat16": "bf16", "float32": "fp32"}.get(ns, ns)}
        else:
            info |= {"lr": cfg.lr, "weight_decay": cfg.weight_decay}
        out[name] = info
    return out


def describe_schedule(cfg: TrainConfig) -> str:
    """The schedule in words, for the run header."""
    end = f"step {cfg.max_iters}" + (f" or at {cfg.max_time:g} s" if cfg.max_time else "")
    warmup = f"warmup {cfg.warmup_iters} steps, " if cfg.warmup_iters else ""
    own = cfg.muon_warmup_iters
    if cfg.optimizer == "muon" and own is not None and own != cfg.warmup_iters:
        muon = f"Muon's {own}" if own else "Muon starts at its peak"
        warmup = f"warmup {cfg.warmup_iters} steps (AdamW's; {muon}), "
    if cfg.schedule == "cosine":
        line = f"cosine schedule: {warmup}cosine to {cfg.min_lr:g} at {end}"
    else:
        line = (
            f"wsd schedule: {warmup}constant, then linear to {cfg.min_lr:g} over the last "
            f"{cfg.decay_fraction:.0%} of the run (ends at {end})"
        )
    if cfg.warmup_iters >= cfg.max_iters:  # lr_at never leaves the warmup
        line += (
            f"; the warmup is not shorter than the run, so the rate rises to the last step and "
            f"never decays: lower --warmup-iters (e.g. {cfg.max_iters // 10})"
        )
    return line


def rates_at(
    step: int, cfg: TrainConfig, elapsed: float = 0.0, decay_from: Sequence[float] | None = None
) -> dict[str, float]:
    """Each optimizer's learning rate at this step: AdamW's from lr_at; Muon's the same point
    of its own curve, scaled to --muon-lr, but at its peak while AdamW warms up, then over
    its own train.muon_warmup_iters (default none). Each Muon update is orthogonalized, its
    size set by the rate from the first step, while AdamW's warmup covers second-moment
    estimates that start from nothing. Measured (bench/RESULTS.md, "Muon without warmup"):
    the char case reached AdamW's final val loss 8 and 28 steps sooner on two seeds without
    Muon's warmup, and ended lower."""
    lr = lr_at(step, cfg, elapsed, decay_from)
    muon = lr * cfg.muon_lr / cfg.lr
    if cfg.muon_warmup_iters is not None:  # None: a run saved before the key, warmed up with AdamW
        if step < cfg.warmup_iters and decay_from is None:
            muon = cfg.muon_lr
        if step < cfg.muon_warmup_iters:
            muon *= (step + 1) / (cfg.muon_warmup_iters + 1)
    return {"adamw": lr, "muon": muon}


def set_lr(optimizers: Optimizers, rates: dict[str, float]) -> None:
    """Set each optimizer's rate (rates_at)."""
    for name, opt in optimizers.items():
        for group in opt.param_groups:
            group["lr"] = rates[name]


def decay_due(step: int, cfg: TrainConfig, elapsed: float = 0.0) -> bool:
    """Whether a WSD run's constant phase is over at this step: the last decay_fraction of
    max_iters, or of max_time if that budget runs out first (never during warmup)."""
    if cfg.schedule != "wsd" or step < cfg.warmup_iters:
        return False
    return step >= round((1.0 - cfg.decay_fraction) * cfg.max_iters) or decay_time(cfg, elapsed)


def decay_time(cfg: TrainConfig, elapsed: float) -> bool:
    """Whether max_time says a WSD run's decay is due (the part of decay_due that depends
    on the clock, which processes of a torchrun job agree on)."""
    if cfg.schedule != "wsd" or cfg.max_time is None:
        return False
    return elapsed >= (1.0 - cfg.decay_fraction) * cfg.max_time


def lr_at(
    step: int, cfg: TrainConfig, elapsed: float = 0.0, decay_from: Sequence[float] | None = None
) -> float:
    """AdamW's learning rate at this step: linear warmup over warmup_iters, then the decay to
    min_lr at max_iters, or at max_time if that budget runs out first: a cosine from the
    warmup's end, or (wsd) the peak until decay_from, then a straight line.

    decay_from (step, lr, elapsed): where the decay starts. A WSD run sets it when its
    constant phase ends (decay_due); a resumed run given a new max_iters or max_time decays
    from its current rate to min_lr at the new end, rather than jumping back up the old
    curve."""
    if step < cfg.warmup_iters and decay_from is None:
        return cfg.lr * (step + 1) / (cfg.warmup_iters + 1)
    if cfg.schedule == "wsd" and decay_from is None:
        return cfg.lr
    s0, lr0, e0 = decay_from if decay_from is not None else (cfg.warmup_iters, cfg.lr, 0.0)
    progress = (step - s0) / max(1, cfg.max_iters - s0)
    if cfg.max_time:
        progress = max(progress, (elapsed - e0) / max(1e-9, cfg.max_time - e0))
    progress = min(1.0, max(0.0, progress))
    coeff = 1.0 - progress if cfg.schedule == "wsd" else 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + coeff * (lr0 - cfg.min_lr)
