"""Setting a training session up: the device and precision, memory checked before anything
is allocated, the model placed (whole, replicated or sharded), the optimizers and the
data stream's generator. What it makes is a Session; the Trainer runs on it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gptcli import lora
from gptcli.config import TrainConfig
from gptcli.errors import UsageError
from gptcli.model import GPT
from gptcli.runtime import (
    Dist,
    Precision,
    check_fits,
    init_distributed,
    keep_freed_memory,
    pick_precision,
    rank_device,
    training_bytes,
)
from gptcli.tasks import Batch, Task
from gptcli.train.optim import make_optimizers
from gptcli.train.parallel import Sharded, Whole
from gptcli.train.state import Parts


class TaskLoss(nn.Module):
    """The model and the task's loss as one module, so that DistributedDataParallel and
    FSDP see every forward pass (tasks may call more of the model than its forward)."""

    def __init__(self, model: nn.Module, task: Task) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, batch: Batch | None = None, apply: Callable[[nn.Module], Any] | None = None) -> Any:
        """A batch's loss; or, given apply, its result on the model (FSDP evaluates this
        way, so that the root's weights are gathered for it). Which one is decided by
        whether apply is None, a constant to torch.compile: the step stays one graph."""
        if apply is not None:
            return apply(self.model)
        return self.task.loss(self.model, batch)


@dataclass
class Session:
    """Where and how a run trains, and the live objects it saves and restores."""

    device: torch.device
    device_reason: str  # why that device, and how the model is placed on it, in words
    precision: Precision
    parts: Parts


def set_up(model: GPT, task: Task, cfg: TrainConfig, dist: Dist) -> Session:
    """Pick the device and precision, check the batch fits, place the model and make its
    optimizers. cfg.grad_accum left unset becomes one micro-step per process."""
    if cfg.grad_accum is None:  # one micro-step per process: the batch the user asked for, each
        cfg.grad_accum = dist.world
    if cfg.grad_accum % dist.world:
        raise UsageError(
            f"--grad-accum {cfg.grad_accum} must be a multiple of the {dist.world} processes, "
            "which share the accumulation steps"
        )
    device, reason = rank_device(cfg.device, dist)
    init_distributed(device, cfg.dist_timeout)
    precision = pick_precision(device, cfg.dtype)
    sharding = dist.enabled and cfg.fsdp
    if device.type == "cpu":
        keep_freed_memory()  # no page faults on every step's fresh activations
        if precision.name == "bf16":
            model.set_attention("explicit")  # faster than the CPU's fused kernel in bf16
    if precision.name == "bf16" and not sharding:
        # frozen LoRA bases: half the memory (FSDP units all-gather one dtype, so sharded
        # bases stay as they are)
        lora.hold_base_in(model, torch.bfloat16)
    if not sharding:  # sharded, each block goes to the device as it is split: never whole
        check_memory(model, cfg, device, precision)
        model.to(device)
    scaler = torch.amp.GradScaler(device.type, enabled=precision.needs_grad_scaler)
    # the same data stream on every rank (each takes its slice of the global batch), but
    # its own dropout masks
    data_gen = torch.Generator().manual_seed(cfg.seed)
    torch.manual_seed(cfg.seed + dist.rank)
    # evaluation runs the model; training runs the task's loss, as one module since a task
    # may call more of the model than its forward (hidden_states, the classifier)
    loss_module = TaskLoss(model, task)
    placement: Whole | Sharded
    if sharding:
        if precision.needs_grad_scaler:
            raise UsageError("--fsdp trains in bf16 or fp32; pick one with --dtype (fp16 needs DDP)")
        param_dtype = torch.bfloat16 if precision.name == "bf16" else None
        placement = Sharded(loss_module, model, device, dist.world, cfg.compile, param_dtype)
        reason += f"; weights, gradients and AdamW state sharded {dist.world} ways (FSDP)"
        if param_dtype is not None:
            reason += ", weights gathered in bf16 and gradients reduced in fp32"
    else:
        placement = Whole(loss_module, model, device, dist.enabled, cfg.compile)
    optimizers = make_optimizers(model, cfg, device)  # after sharding, if any
    return Session(device, reason, precision, Parts(optimizers, placement, scaler, data_gen, dist, device))


def check_memory(model: GPT, cfg: TrainConfig, device: torch.device, precision: Precision) -> None:
    """Refuse a batch that cannot fit before allocating it (a lower bound on the need)."""
    params = sum(p.numel() for p in model.parameters())
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)  # less under LoRA
    fused = not model.transformer.h[0].attn.explicit  # SDPA keeps no attention matrix
    needed = training_bytes(model.config, trained, cfg.batch_size, precision, fused)
    if device.type != "cpu":
        needed += 4 * params  # the weights, still on the CPU
    check_fits(needed, device, f"training with --batch-size {cfg.batch_size}")
    # a step draws all its examples at once: a (grad_accum, batch_size) index on the CPU
    accum, batch = cfg.grad_accum or 1, cfg.batch_size
    check_fits(8 * accum * batch, torch.device("cpu"), f"--grad-accum {accum} with --batch-size {batch}")
