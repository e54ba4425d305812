"""One optimizer step, and when the loop stops.

A step draws the global batch, runs this process's micro-steps (gradient accumulation)
under autocast, clips and steps the optimizers. Stopping (the budget, a signal) must happen
at the same step on every torchrun process: what only one process knows is agreed on at
log steps alone, one small all-reduce per log interval rather than a host sync every step.
"""

from __future__ import annotations

import math
import signal
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from gptcli.config import TrainConfig
from gptcli.runtime import Dist, Precision
from gptcli.tasks import Task
from gptcli.train.optim import decay_time, set_lr
from gptcli.train.state import Parts, TrainState


@dataclass
class StepResult:
    loss: torch.Tensor  # this process's mean loss, on the device (not synced)
    tokens: int  # the tokens the whole job processed
    grad_norm: torch.Tensor | None  # before clipping (when clipping or measuring; else None)


def optimizer_step(
    model: nn.Module,
    task: Task,
    cfg: TrainConfig,
    parts: Parts,
    precision: Precision,
    rates: dict[str, float],
    measure: bool = False,
) -> StepResult:
    """One optimizer step over the global batch at these rates (optim.rates_at): this
    process's micro-steps, then clip and step; measure asks for the gradient norm."""
    dist, device = parts.dist, parts.device
    set_lr(parts.optimizers, rates)
    indices = torch.randint(
        task.num_examples("train"), (cfg.grad_accum, cfg.batch_size), generator=parts.data_gen
    )
    mine = range(dist.rank, cfg.grad_accum, dist.world)  # rank r takes micro-steps r, r + world, ...
    step_loss, tokens = torch.zeros((), device=device), 0
    for i, micro in enumerate(mine):
        batch = task.batch("train", indices[micro], device)
        tokens += task.tokens(batch) * dist.world
        with parts.placement.micro_step(last=i == len(mine) - 1):
            with precision.autocast():
                loss = parts.placement.train_module(batch) / len(mine)
            parts.scaler.scale(loss).backward()
        step_loss += loss.detach()
    norm = None
    optimizers = parts.optimizers.values()
    if cfg.grad_clip > 0 or measure:  # an infinite bound measures and leaves the gradients as they are
        for opt in optimizers:
            parts.scaler.unscale_(opt)
        norm = nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or math.inf)
    for opt in optimizers:
        parts.scaler.step(opt)
    parts.scaler.update()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    return StepResult(step_loss, tokens, norm)


class Stopping:
    """When the loop stops: at max_iters or max_time, or when asked (a signal, or
    request() from another thread); and when max_time says a WSD run's decay is due."""

    def __init__(self, cfg: TrainConfig, dist: Dist) -> None:
        self.cfg, self.dist = cfg, dist
        self.reason: str | None = None  # why the loop stops, once it does
        self.requested: str | None = None  # a stop asked for on this process, not yet acted on

    def request(self, reason: str = "interrupted") -> None:
        self.requested = reason

    def check(self, state: TrainState, elapsed: float, device: torch.device) -> tuple[bool, bool]:
        """Whether to stop before the next step, and whether a timed decay is due; every
        process answers alike at the same step (agreeing through device)."""
        cfg = self.cfg
        out_of_time = cfg.max_time is not None and elapsed >= cfg.max_time
        timed_decay = state.decay_from is None and decay_time(cfg, elapsed)
        request = self.requested
        if self.dist.enabled:
            if state.step % cfg.log_interval == 0:
                flags = torch.tensor([out_of_time, request is not None, timed_decay], dtype=torch.float32)
                flags = self.dist.reduce(flags.to(device), "max").cpu()
                out_of_time, timed_decay = bool(flags[0]), bool(flags[2])
                request = (request or "interrupted") if flags[1] else None
            else:  # acted on at the next log step, by every process together
                out_of_time, request, timed_decay = False, None, False
        if self.reason is None and request is not None:
            self.reason = request
        if self.reason is None and (state.step >= cfg.max_iters or out_of_time):
            self.reason = "max_time" if state.step < cfg.max_iters else "max_iters"
        return self.reason is not None, timed_decay and state.step >= cfg.warmup_iters

    @property
    def by_signal(self) -> bool:
        return self.reason in ("interrupted", "terminated")


class StopSignals:
    """SIGINT/SIGTERM ask the loop to stop at the next step boundary (a second one kills)."""

    def __init__(self, stopping: Stopping) -> None:
        self.stopping = stopping
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.stopping.requested is not None:
            signal.signal(signum, self.previous.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.stopping.request("interrupted" if signum == signal.SIGINT else "terminated")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
