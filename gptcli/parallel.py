"""How training spreads over torchrun processes: whole replicas (DDP) or shards (FSDP).

Data parallel (the default) keeps the whole model, its gradients and its AdamW state on
every process and all-reduces the gradients once per step. Sharded data parallel (--fsdp,
PyTorch's FSDP2) keeps 1/N of each on every process: each Block is one unit whose weights
are gathered just before it runs and freed just after, forward and backward, and whose
gradients are reduce-scattered back to their owners after every micro-step (so they are
never whole for long); the root unit (the model and the task's loss) holds the
embeddings, the final LayerNorm and any classifier head.

Either way checkpoints hold whole tensors in the single-process layout: a sharded run's
weights open like any other, and its optimizer state resumes a run of the same number of
processes, sharded or not.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from gptcli.model import GPT

_GATHER = StateDictOptions(full_state_dict=True, cpu_offload=True)  # whole tensors, on rank 0
T = TypeVar("T")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def replicate(module: nn.Module, device: torch.device) -> nn.Module:
    """DistributedDataParallel around module (the model and the task's loss)."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)


class Sharded:
    """FSDP over every process of the job, with root (holding model) as the outer unit."""

    def __init__(self, root: nn.Module, model: GPT, device: torch.device, world: int, compile_: bool) -> None:
        mesh = init_device_mesh(device.type, (world,))
        for block in model.transformer.h:
            if compile_:
                block.compile()  # each block on its own: the gathers happen between them
            fully_shard(block, mesh=mesh)
        fully_shard(root, mesh=mesh)
        self.root: FSDPModule = root  # type: ignore[assignment]
        self.model = model

    def call(self, fn: Callable[[nn.Module], T]) -> T:
        """fn(model) inside the root's forward, where its weights are whole (evaluation:
        tasks call more of the model than its forward), sharded again after."""
        try:
            return self.root(fn)  # type: ignore[operator]
        finally:
            self.root.reshard()

    def nonfinite_weight(self) -> str | None:
        """None when every weight on every process is finite, else the name of one that
        is not (collective)."""
        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(_local(p)).all()]
        flag = torch.tensor(float(bool(bad)), device=next(self.model.parameters()).device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return (bad[0] if bad else "a weight held by another process") if flag.item() else None

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's whole state dict on rank 0 (empty elsewhere; collective)."""
        state = get_model_state_dict(self.model, options=_GATHER)
        return {k: v.contiguous() for k, v in state.items() if k != "lm_head.weight"}

    def _names(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """The optimizer's parameters by name, in the order its state_dict numbers them."""
        name = {p: n for n, p in self.model.named_parameters()}
        return [name[p] for group in optimizer.param_groups for p in group["params"]]

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """optimizer.state_dict() of the unsharded model, on rank 0 (collective)."""
        if not optimizer.state:  # before the first step; the gather would take an empty step
            return optimizer.state_dict()
        full = get_optimizer_state_dict(self.model, optimizer, options=_GATHER)
        if not full:
            return {}
        index = {n: i for i, n in enumerate(self._names(optimizer))}
        return {
            "state": {index[n]: s for n, s in full["state"].items()},
            "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in full["param_groups"]],
        }

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        """Load a state in optimizer.state_dict()'s layout, whose tensors rank 0 alone has
        read (the others' are None): it sends each process its shard, one tensor at a time,
        so no process holds the whole state (collective)."""
        if not state["state"]:  # saved before the first step
            optimizer.load_state_dict(state)
            return
        full = {}
        if torch.distributed.get_rank() == 0:
            names = self._names(optimizer)
            full = {
                "state": {names[i]: s for i, s in state["state"].items()},
                "param_groups": [
                    {**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]
                ],
            }
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
        set_optimizer_state_dict(self.model, optimizer, optim_state_dict=full, options=options)
