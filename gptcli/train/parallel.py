"""Where the model lives while it trains: whole on one process, whole on every torchrun
process (DDP replicas), or split across them (FSDP shards). The Trainer asks the same
questions of each: what to call for a training step and for evaluation, and how to save
and load the weights and optimizer state.

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

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, TypeVar

import torch
import torch.nn as nn

from gptcli.model import GPT
from gptcli.store.checkpoint import model_state

T = TypeVar("T")


class Whole:
    """The whole model on this process: alone, or one DDP replica per torchrun process.
    compile_ compiles the training step (model and task loss) as one graph."""

    skip_on_load: str | None = None  # every process reads the whole optimizer state

    def __init__(
        self, root: nn.Module, model: GPT, device: torch.device, replicated: bool, compile_: bool
    ) -> None:
        self.model = model
        self.eval_model: nn.Module = torch.compile(model) if compile_ else model
        self.train_module: nn.Module = torch.compile(root) if compile_ else root
        if replicated:
            from torch.nn.parallel import DistributedDataParallel

            ids = [device.index] if device.type == "cuda" else None
            self.train_module = DistributedDataParallel(self.train_module, device_ids=ids)
        self.replicated = replicated

    def micro_step(self, last: bool) -> AbstractContextManager[Any]:
        """Replicas all-reduce their gradients once per step, on the last micro-step."""
        return self.train_module.no_sync() if self.replicated and not last else contextlib.nullcontext()

    def evaluate(self, fn: Callable[[nn.Module], T]) -> T:
        return fn(self.eval_model)

    def nonfinite_weight(self) -> str | None:
        """The name of a weight holding NaN or inf, or None (replicas are identical)."""
        return next((n for n, p in self.model.named_parameters() if not torch.isfinite(p).all()), None)

    def weights(self) -> dict[str, torch.Tensor]:
        return model_state(self.model)

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
        optimizer.load_state_dict(state)


class Sharded:
    """FSDP over every process of the job, with root (the model and the task's loss) as
    the outer unit and each block a unit of its own (compiled on its own under compile_)."""

    skip_on_load: str | None = "optimizer.state."  # rank 0 alone reads these, and sends shards

    def __init__(
        self,
        root: nn.Module,
        model: GPT,
        device: torch.device,
        world: int,
        compile_: bool,
        param_dtype: torch.dtype | None = None,
    ) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(device.type, (world,))
        # param_dtype (bf16 training): weights are gathered in bf16, half the traffic and
        # memory of fp32, and gradients reduced in fp32 (as litgpt and torchtitan do); the
        # shards themselves, and AdamW's update of them, stay fp32
        self.policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
        for block in model.transformer.h:
            if compile_:
                block.compile()  # each block on its own: the gathers happen between them
            fully_shard(
                block, mesh=mesh, mp_policy=self.policy
            )  # moves the block to the device, then splits it
        fully_shard(root, mesh=mesh, mp_policy=self.policy)
        self.root: Any = root  # an FSDPModule now
        self.model = model
        self.train_module: nn.Module = root

    def micro_step(self, last: bool) -> AbstractContextManager[Any]:
        """Gradients are reduce-scattered after every micro-step, so they stay sharded."""
        return contextlib.nullcontext()

    def evaluate(self, fn: Callable[[nn.Module], T]) -> T:
        """fn(model) inside the root's forward, where its weights are whole (tasks call more
        of the model than its forward), sharded again after."""
        try:
            return self.root(apply=fn)
        finally:
            self.root.reshard()

    def nonfinite_weight(self) -> str | None:
        """The name of a weight holding NaN or inf on any process, or None (collective)."""
        from torch.distributed.tensor import DTensor

        def local(t: torch.Tensor) -> torch.Tensor:
            return t.to_local() if isinstance(t, DTensor) else t

        bad = [n for n, p in self.model.named_parameters() if not torch.isfinite(local(p)).all()]
        flag = torch.tensor(float(bool(bad)), device=next(self.model.parameters()).device)
        torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        return (bad[0] if bad else "a weight held by another process") if flag.item() else None

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's whole state as model_state gives it, on rank 0 (empty elsewhere;
        collective)."""
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        return model_state(self.model, get_model_state_dict(self.model, options=_gather()))

    def _names(self, optimizer: torch.optim.Optimizer) -> list[str]:
        """The optimizer's parameters by name, in the order its state_dict numbers them."""
        name = {p: n for n, p in self.model.named_parameters()}
        return [name[p] for group in optimizer.param_groups for p in group["params"]]

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """optimizer.state_dict() of the unsharded model, on rank 0 (collective)."""
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        if not optimizer.state:  # before the first step; the gather would take an empty step
            return optimizer.state_dict()
        full = get_optimizer_state_dict(self.model, optimizer, options=_gather())
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
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

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


def _gather() -> Any:
    """Whole tensors, on rank 0, in CPU memory."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, cpu_offload=True)


def leave_job(finished: bool) -> None:
    """Leave the torchrun job's process group, every process together when the run finished
    (a process leaving early aborted at exit). Call it once what holds the group and its
    last collectives' buffers (DDP's reducer, the optimizers, a sharded model) is released:
    it collects them now, not in the interpreter's finalization on the way out."""
    import gc

    import torch.distributed as td

    if not td.is_initialized():
        return
    if finished:
        td.barrier()
    gc.collect()
    td.destroy_process_group()
