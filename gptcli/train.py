"""One training loop for pretraining and finetuning.

AdamW (weight decay on matrices only, fused where the device supports it), linear warmup
then cosine decay to min_lr, gradient accumulation and clipping, bf16/fp16 autocast,
optional torch.compile, periodic evaluation, checkpoints (last with full training state,
best by validation loss), metrics.jsonl, and exact resume. Under torchrun every process
draws the same global batch and trains on its own slice of it, with the model replicated
or sharded (gptcli/parallel.py), and rank 0 alone reports and writes. It reports through a
Reporter and never prints.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn as nn

from gptcli import files
from gptcli.checkpoint import (
    LAST,
    RunLock,
    checkpoint_in,
    copy_checkpoint,
    load_train_state,
    save_checkpoint,
)
from gptcli.config import Config, TrainConfig
from gptcli.errors import GptcliError, UsageError
from gptcli.model import GPT
from gptcli.parallel import Sharded, Whole
from gptcli.runtime import (
    Precision,
    check_fits,
    dist_from_env,
    init_distributed,
    keep_freed_memory,
    peak_flops,
    pick_precision,
    rank_device,
    record_achieved,
    training_bytes,
)
from gptcli.tasks import Batch, Task
from gptcli.tokenizer import Tokenizer
from gptcli.validate import check_types

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "config.yaml"
RUN_FILES = (LAST, "best", CONFIG_FILE, METRICS_FILE, "loss.png")  # what a run writes in its directory


class Diverged(GptcliError):
    """The loss became NaN or infinite."""


# --- what the loop reports -----------------------------------------------------------------


@dataclass
class RunInfo:
    run_dir: Path
    device: str
    device_reason: str
    precision: str
    precision_reason: str
    params: int
    tokens_per_step: int | None  # None when examples vary in length
    batch_size: int  # sequences per micro-step, in each process
    grad_accum: int  # micro-steps per optimizer step, of all processes together
    processes: int
    start_step: int
    max_iters: int
    max_time: float | None
    compile: bool


@dataclass
class StepReport:
    step: int  # optimizer steps done
    max_iters: int
    elapsed: float
    lr: float
    loss: float | None = None  # mean training loss of this step (on log steps only)
    tokens_per_s: float | None = None
    mfu: float | None = None  # model FLOPs utilisation, 0..1


@dataclass
class EvalReport:
    step: int
    metrics: dict[str, dict[str, float]]  # split -> {"loss": ..., other task metrics}
    best_val_loss: float
    improved: bool
    elapsed: float


@dataclass
class Summary:
    run_dir: Path
    steps: int
    start_step: int
    elapsed: float
    tokens: int
    stop_reason: str  # max_iters | max_time | interrupted
    best_val_loss: float | None
    last_eval: dict[str, dict[str, float]] = field(default_factory=dict)  # this session's latest
    tokens_per_s: float | None = None  # as the live view counts them: training steps only
    last_eval_step: int | None = None  # the step of last_eval


class Reporter(Protocol):
    def on_start(self, info: RunInfo) -> None: ...
    def on_step(self, report: StepReport) -> None: ...
    def on_eval(self, report: EvalReport) -> None: ...
    def on_checkpoint(self, name: str, path: Path, step: int) -> None: ...
    def on_end(self, summary: Summary) -> None: ...
    def close(self) -> None:
        """Called last, also when training fails: release the screen."""


class NullReporter:
    def on_start(self, info: RunInfo) -> None: ...
    def on_step(self, report: StepReport) -> None: ...
    def on_eval(self, report: EvalReport) -> None: ...
    def on_checkpoint(self, name: str, path: Path, step: int) -> None: ...
    def on_end(self, summary: Summary) -> None: ...
    def close(self) -> None: ...


# --- the pieces ----------------------------------------------------------------------------


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


def make_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices and embeddings, none on biases and LayerNorm gains."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    fused = device.type in ("cuda", "cpu")
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused)


class MetricsLog:
    """metrics.jsonl: one JSON object per log step and per evaluation."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        files.append_line(self.path, json.dumps(record))

    def truncate(self, step: int, keep_eval_at_step: bool) -> None:
        """Forget records written after the checkpoint at `step` (resume replays them)."""
        if not self.path.exists():
            return
        kept = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue  # a line cut short by a crash
            s = rec.get("step", 0) if isinstance(rec, dict) else None
            if not isinstance(s, int) or isinstance(s, bool):
                continue  # not a record of ours
            if s < step or (s == step and (rec.get("kind") != "eval" or keep_eval_at_step)):
                kept.append(line)
        files.write_file(self.path, "".join(k + "\n" for k in kept))


@dataclass
class TrainState:
    """Where training is; saved with every last/ checkpoint."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    best_val_loss: float | None = None
    last_eval_step: int = -1
    schedule: list | None = None  # [max_iters, max_time] the LR schedule was planned for
    decay_from: list[float] | None = None  # see lr_at; set when a resume changed the schedule


_STATE_SCHEMA: dict[str, tuple[type, ...]] = {
    "step": (int,), "tokens": (int,), "elapsed": (float,), "best_val_loss": (float, type(None)),
    "last_eval_step": (int,), "schedule": (list, type(None)), "decay_from": (list, type(None)),
}  # fmt: skip


def check_train_state(
    saved: Any, optimizer: torch.optim.Optimizer, source: str = "the training state"
) -> None:
    """Raise ValueError unless a saved training state has the parts resume reads, with an
    optimizer state for exactly this model's parameters (every moment the shape of its
    parameter)."""
    if not isinstance(saved, dict) or not all(k in saved for k in ("state", "optimizer", "data_rng")):
        raise ValueError("it lacks the state, optimizer or data_rng part")
    if not isinstance(saved["state"], dict) or set(saved["state"]) - set(TrainState.__dataclass_fields__):
        raise ValueError("its state part holds unknown fields")
    check_types(saved["state"], _STATE_SCHEMA, source)
    state = saved["state"]
    if not all(state.get(k, 0) >= 0 for k in ("step", "tokens", "elapsed")) or not math.isfinite(
        state.get("elapsed", 0.0)
    ):
        raise ValueError("its step, tokens or elapsed time is negative or not finite")
    best = state.get("best_val_loss")
    if best is not None and not math.isfinite(best):
        raise ValueError(f"its best_val_loss is {best}")
    schedule, decay = state.get("schedule"), state.get("decay_from")
    if schedule is not None and not (
        len(schedule) == 2
        and _is_int(schedule[0])
        and schedule[0] >= 1
        and (schedule[1] is None or (_is_number(schedule[1]) and 0 < schedule[1] < math.inf))
    ):
        raise ValueError(f"its schedule {schedule} is not [max_iters, max_time or null]")
    if decay is not None and not (len(decay) == 3 and all(_is_number(x) and math.isfinite(x) for x in decay)):
        raise ValueError(f"its decay_from {decay} is not three numbers")
    optim = saved["optimizer"]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = optim.get("param_groups") if isinstance(optim, dict) else None
    if not isinstance(groups, list) or [len(g.get("params", [])) for g in groups] != [
        len(g["params"]) for g in optimizer.param_groups
    ]:
        raise ValueError("its optimizer has other parameter groups than this model")
    for index, moments in (optim.get("state") or {}).items():
        i = int(index)
        if not 0 <= i < len(params) or not isinstance(moments, dict):
            raise ValueError(f"its optimizer state names parameter {index}, which this model lacks")
        for name, value in moments.items():
            if name != "step" and isinstance(value, torch.Tensor) and value.shape != params[i].shape:
                raise ValueError(
                    f"optimizer {name} of parameter {i} has shape {tuple(value.shape)}, "
                    f"the parameter {tuple(params[i].shape)}"
                )


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _per_rank(rng: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    """RNG states by rank (early single-process checkpoints saved one state, not a list)."""
    return [rng] if isinstance(rng, torch.Tensor) else rng


class _StopSignals:
    """SIGINT/SIGTERM ask the loop to stop at the next step boundary (a second one kills)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.trainer.stop_reason is not None:
            signal.signal(signum, self.previous.get(signum, signal.SIG_DFL))
            raise KeyboardInterrupt
        self.trainer.request_stop("interrupted" if signum == signal.SIGINT else "terminated")

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class _TaskLoss(nn.Module):
    """The model and the task's loss as one module, so that DistributedDataParallel and
    FSDP see every forward pass (tasks may call more of the model than its forward)."""

    def __init__(self, model: nn.Module, task: Task) -> None:
        super().__init__()
        self.model = model
        self.task = task

    def forward(self, batch: Batch | Callable[[nn.Module], Any]) -> Any:
        """A batch's loss; or, given a function, its result on the model (FSDP evaluates
        this way, so that the root's weights are gathered for it)."""
        return batch(self.model) if callable(batch) else self.task.loss(self.model, batch)


# --- the loop ------------------------------------------------------------------------------


class Trainer:
    """Trains `model` on `task` and keeps `run_dir` up to date."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        task: Task,
        config: Config,
        run_dir: Path,
        reporter: Reporter | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.task = task
        self.config = config
        self.cfg = config.train
        self.run_dir = Path(run_dir)
        self.reporter = reporter or NullReporter()
        self.meta = meta or {}
        self.stop_reason: str | None = None
        self.metrics = MetricsLog(self.run_dir / METRICS_FILE)
        self.dist = dist_from_env()

    def request_stop(self, reason: str = "interrupted") -> None:
        """Stop at the next step boundary, after writing a last/ checkpoint."""
        self.stop_reason = reason

    # -- set-up

    def _setup(self) -> None:
        cfg, dist = self.cfg, self.dist
        if cfg.grad_accum is None:  # one micro-step per process: the batch the user asked for, each
            cfg.grad_accum = dist.world
        if cfg.grad_accum % dist.world:
            raise UsageError(
                f"--grad-accum {cfg.grad_accum} must be a multiple of the {dist.world} processes, "
                "which share the accumulation steps"
            )
        self.device, self.device_reason = rank_device(cfg.device, dist)
        init_distributed(self.device)
        self.precision: Precision = pick_precision(self.device, cfg.dtype)
        sharding = dist.enabled and cfg.fsdp
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults on every step's fresh activations
            if self.precision.name == "bf16":
                self.model.set_attention("explicit")  # faster than the CPU's fused kernel in bf16
        if not sharding:  # sharded, each block goes to the device as it is split: never whole
            params = sum(p.numel() for p in self.model.parameters())
            fused = not self.model.transformer.h[0].attn.explicit  # SDPA keeps no attention matrix
            needed = training_bytes(self.model.config, params, cfg.batch_size, self.precision, fused)
            if self.device.type != "cpu":
                needed += 4 * params  # the weights, still on the CPU
            check_fits(needed, self.device, f"training with --batch-size {cfg.batch_size}")
            self.model.to(self.device)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.needs_grad_scaler)
        # the same data stream on every rank (each takes its slice of the global batch), but
        # its own dropout masks
        self.data_gen = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed + dist.rank)
        self.state = TrainState()
        # evaluation runs the model; training runs the task's loss, as one module since a task
        # may call more of the model than its forward (hidden_states, the classifier)
        loss_module = _TaskLoss(self.model, self.task)
        self.placement: Whole | Sharded
        if sharding:
            if self.precision.needs_grad_scaler:
                raise UsageError("--fsdp trains in bf16 or fp32; pick one with --dtype (fp16 needs DDP)")
            self.placement = Sharded(loss_module, self.model, self.device, dist.world, cfg.compile)
            self.device_reason += f"; weights, gradients and AdamW state sharded {dist.world} ways (FSDP)"
        else:
            self.placement = Whole(loss_module, self.model, self.device, dist.enabled, cfg.compile)
        self.optimizer = make_optimizer(self.model, cfg, self.device)  # after sharding, if any

    def _all_ranks(self, value: Any) -> list[Any]:
        """value from every rank, in rank order (a list of one when alone)."""
        if not self.dist.enabled:
            return [value]
        import torch.distributed as td

        out: list[Any] = [None] * self.dist.world
        td.all_gather_object(out, value)
        return out

    def _reduce(self, t: torch.Tensor, op: str = "avg") -> torch.Tensor:
        if self.dist.enabled:
            import torch.distributed as td

            if op == "avg":
                td.all_reduce(t, op=td.ReduceOp.SUM)
                t /= self.dist.world
            else:
                td.all_reduce(t, op=td.ReduceOp.MAX)
        return t

    def _restore(self) -> None:
        """Continue exactly where the last/ checkpoint left off. The saved state is data
        from disk: anything in it that does not fit this run is a one-line error."""
        skip = None if self.dist.is_main else self.placement.skip_on_load
        ckpt = checkpoint_in(self.run_dir, LAST) or self.run_dir / LAST
        saved = load_train_state(ckpt, skip)
        try:
            if self.dist.is_main:
                check_train_state(saved, self.optimizer, f"{ckpt}/train_state.json")
            self._load_state(saved)
        except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
            raise UsageError(
                f"{ckpt}/train_state.json and its tensors do not fit this run ({type(e).__name__}: {e}); "
                "the training state is damaged, so the run cannot continue exactly"
            ) from None
        self.metrics.truncate(self.state.step, keep_eval_at_step=self.state.last_eval_step == self.state.step)

    def _load_state(self, saved: dict[str, Any]) -> None:
        optim = saved["optimizer"]
        optim["state"] = {int(k): v for k, v in optim["state"].items()}
        self.placement.load_optimizer_state(self.optimizer, optim)
        if saved.get("scaler"):
            self.scaler.load_state_dict(saved["scaler"])
        self.data_gen.set_state(saved["data_rng"])
        ranks = saved.get("world", 1)
        if ranks != self.dist.world:
            raise UsageError(
                f"the run was trained by {ranks} process(es); resume it with the same number "
                f"(now {self.dist.world}) to continue exactly"
            )
        torch.set_rng_state(_per_rank(saved["torch_rng"])[self.dist.rank])
        if self.device.type == "cuda" and saved.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(_per_rank(saved["cuda_rng"])[self.dist.rank], self.device)
        self.state = TrainState(**saved["state"])

    def _refit_schedule(self) -> None:
        """Record the schedule's end; a resume that moves it decays on from the current LR."""
        cfg, state = self.cfg, self.state
        planned = [cfg.max_iters, cfg.max_time]
        if state.schedule is not None and state.schedule != planned and state.step >= cfg.warmup_iters:
            before = replace(cfg, max_iters=state.schedule[0], max_time=state.schedule[1])
            lr = lr_at(state.step, before, state.elapsed, state.decay_from)
            state.decay_from = [state.step, lr, state.elapsed]
        state.schedule = planned

    def _train_state(self) -> dict[str, Any]:
        """Everything resume needs (collective under torchrun: every rank gives its RNG)."""
        torch_rng = self._all_ranks(torch.get_rng_state())
        cuda_rng = (
            self._all_ranks(torch.cuda.get_rng_state(self.device).cpu())
            if self.device.type == "cuda"
            else None
        )
        return {
            "state": asdict(self.state),
            "optimizer": self.placement.optimizer_state(self.optimizer),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
            "data_rng": self.data_gen.get_state(),
            "world": self.dist.world,
            "torch_rng": torch_rng,
            "cuda_rng": cuda_rng,
        }

    # -- checkpoints and evaluation

    def _checkpoint_meta(self, metrics: dict[str, dict[str, float]] | None) -> dict[str, Any]:
        return {
            "step": self.state.step,
            "tokens": self.state.tokens,
            "best_val_loss": self.state.best_val_loss,
            "train_loss": metrics["train"]["loss"] if metrics else None,
            "val_loss": metrics["val"]["loss"] if metrics else None,
            "config": self.config.to_dict(),
            **self.meta,
        }

    def _save_last(self, metrics: dict[str, dict[str, float]] | None) -> None:
        bad = self.placement.nonfinite_weight()
        if bad:  # never overwrite the last good checkpoint with a broken model
            self._diverged(f"{bad} holds NaN or inf")
        state = self._train_state()  # on every rank
        weights = self.placement.weights()  # whole tensors (sharded: gathered, on rank 0)
        if self.dist.is_main:
            path = save_checkpoint(
                self.run_dir, LAST, self.model, self.tokenizer, self._checkpoint_meta(metrics), state, weights
            )
            self.reporter.on_checkpoint(LAST, path, self.state.step)

    def _eval_batches(self, split: str) -> Iterator[Batch]:
        """eval_iters batches of examples spread evenly over the split (all of it when it is
        that small): the same ones at every evaluation, so the curve shows learning rather
        than sampling noise, and a steadier estimate than random batches."""
        n, want = self.task.num_examples(split), self.cfg.eval_iters * self.cfg.batch_size
        indices = torch.arange(n) if n <= want else torch.linspace(0, n - 1, want).round().long()
        for chunk in indices.split(self.cfg.batch_size):
            yield self.task.batch(split, chunk, self.device)

    @torch.no_grad()
    def evaluate(self) -> dict[str, dict[str, float]]:
        def run(model: nn.Module) -> dict[str, dict[str, float]]:
            return {
                split: self.task.evaluate(model, split, self._eval_batches(split))
                for split in ("train", "val")
            }

        self.model.eval()
        try:
            with self.precision.autocast():
                return self.placement.evaluate(run)
        finally:
            self.model.train()

    def _evaluate_and_checkpoint(self, elapsed: float) -> dict[str, dict[str, float]]:
        metrics = self.evaluate()
        val = metrics["val"]["loss"]
        if not math.isfinite(val):
            self._diverged(f"validation loss is {val}")
        improved = self.state.best_val_loss is None or val < self.state.best_val_loss
        if improved:
            self.state.best_val_loss = val
        self.state.last_eval_step = self.state.step
        if self.dist.is_main:
            record = {
                "kind": "eval",
                "step": self.state.step,
                "elapsed": round(elapsed, 3),
                **_flatten(metrics),
            }
            self.metrics.append(record)
        self.reporter.on_eval(
            EvalReport(self.state.step, metrics, self.state.best_val_loss, improved, elapsed)
        )
        self._save_last(metrics)
        if improved and self.dist.is_main:
            path = copy_checkpoint(self.run_dir, LAST, "best")
            self.reporter.on_checkpoint("best", path, self.state.step)
        return metrics

    def _diverged(self, what: str) -> None:
        best = self.state.best_val_loss
        raise Diverged(
            f"training diverged at step {self.state.step}: {what} (best val loss so far "
            f"{best if best is None else round(best, 4)}); the last good checkpoint is kept. "
            "Lower --lr, check the data, or train in --dtype fp32"
        )

    # -- the loop

    def run(self, resume: bool = False) -> Summary:
        if not self.dist.is_main:
            self.reporter = NullReporter()  # rank 0 alone reports (and writes), whoever set it
        lock = RunLock(self.run_dir) if self.dist.is_main else contextlib.nullcontext()
        try:
            with lock:
                if self.dist.is_main:  # what a killed run left half-written (we hold the lock)
                    files.clean_stale(self.run_dir, RUN_FILES)
                return self._run(resume)
        finally:
            self.reporter.close()
            if self.dist.enabled:
                import torch.distributed as td

                if td.is_initialized():
                    td.destroy_process_group()

    def _run(self, resume: bool) -> Summary:
        self._setup()
        if resume:
            self._restore()
        self._refit_schedule()
        cfg, task, model, dist = self.cfg, self.task, self.model, self.dist
        if dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            files.write_file(self.run_dir / CONFIG_FILE, self.config.to_yaml())
        local_accum = cfg.grad_accum // dist.world  # each rank takes micro-steps rank, rank + world, ...

        T = getattr(task, "block_size", model.config.block_size)
        fixed_length = getattr(task, "fixed_length", False)
        tokens_per_step = cfg.batch_size * cfg.grad_accum * T if fixed_length else None
        peak = peak_flops(self.device, self.precision)  # of one process's device
        flops_per_token = model.flops_per_token(T)
        start_step, start_tokens = self.state.step, self.state.tokens
        self.reporter.on_start(
            RunInfo(
                self.run_dir, str(self.device), self.device_reason, self.precision.name,
                self.precision.reason, model.num_params(), tokens_per_step, cfg.batch_size,
                cfg.grad_accum, dist.world, start_step, cfg.max_iters, cfg.max_time, cfg.compile,
            )
        )  # fmt: skip

        n_train = task.num_examples("train")
        session_start = time.perf_counter()
        t0 = session_start - self.state.elapsed  # elapsed counts earlier sessions of a resumed run
        last_metrics: dict[str, dict[str, float]] = {}
        window_t, window_tokens = time.perf_counter(), 0
        paused = 0.0  # time spent evaluating and checkpointing, which tokens/s leaves out
        model.train()
        with _StopSignals(self):
            while True:
                elapsed = time.perf_counter() - t0
                self.state.elapsed = elapsed
                out_of_time = cfg.max_time is not None and elapsed >= cfg.max_time
                if dist.enabled:  # every rank must stop at the same step
                    flags = torch.tensor([out_of_time, self.stop_reason is not None], dtype=torch.float32)
                    flags = self._reduce(flags.to(self.device), "max").cpu()
                    out_of_time = bool(flags[0])
                    if flags[1] and self.stop_reason is None:
                        self.stop_reason = "interrupted"
                done = self.state.step >= cfg.max_iters or out_of_time
                if self.stop_reason is not None:
                    self._save_last(None)
                    break
                if (
                    done or self.state.step % cfg.eval_interval == 0
                ) and self.state.last_eval_step != self.state.step:
                    t_eval = time.perf_counter()
                    last_metrics = self._evaluate_and_checkpoint(elapsed)
                    window_t, window_tokens = time.perf_counter(), 0  # keep evaluation out of tokens/s
                    paused += window_t - t_eval
                if done:
                    self.stop_reason = (
                        "max_time" if out_of_time and self.state.step < cfg.max_iters else "max_iters"
                    )
                    break

                lr = lr_at(self.state.step, cfg, elapsed, self.state.decay_from)
                for group in self.optimizer.param_groups:
                    group["lr"] = lr
                indices = torch.randint(n_train, (cfg.grad_accum, cfg.batch_size), generator=self.data_gen)
                step_loss = torch.zeros((), device=self.device)
                step_tokens = 0
                mine = range(dist.rank, cfg.grad_accum, dist.world)
                for i, micro in enumerate(mine):
                    batch = task.batch("train", indices[micro], self.device)
                    step_tokens += task.tokens(batch) * dist.world
                    last_micro = i == len(mine) - 1
                    with self.placement.micro_step(last_micro):
                        with self.precision.autocast():
                            loss = self.placement.train_module(batch) / local_accum
                        self.scaler.scale(loss).backward()
                    step_loss += loss.detach()
                if cfg.grad_clip > 0:
                    self.scaler.unscale_(self.optimizer)
                    nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.optimizer.zero_grad(set_to_none=True)
                self.state.step += 1
                self.state.tokens += step_tokens
                window_tokens += step_tokens

                report = StepReport(self.state.step, cfg.max_iters, time.perf_counter() - t0, lr)
                if self.state.step % cfg.log_interval == 0 or self.state.step == 1:
                    loss_value = self._reduce(step_loss).item()
                    if not math.isfinite(loss_value):
                        self._diverged(f"training loss is {loss_value}")
                    now = time.perf_counter()
                    report.loss = loss_value
                    report.tokens_per_s = window_tokens / max(now - window_t, 1e-9)
                    if peak:
                        # tokens/s counts every process, each with its own device
                        achieved = flops_per_token * report.tokens_per_s / dist.world
                        peak = record_achieved(self.device, self.precision, peak, achieved)
                        report.mfu = achieved / peak
                    window_t, window_tokens = now, 0
                    if dist.is_main:
                        self.metrics.append(
                            {
                                "kind": "train",
                                "step": self.state.step,
                                "loss": loss_value,
                                "lr": lr,
                                "tokens": self.state.tokens,
                                "tokens_per_s": round(report.tokens_per_s, 1),
                                "mfu": None if report.mfu is None else round(report.mfu, 4),
                                "elapsed": round(report.elapsed, 3),
                            }
                        )
                self.reporter.on_step(report)

        elapsed = time.perf_counter() - t0
        session = time.perf_counter() - session_start
        run_tokens = self.state.tokens - start_tokens
        summary = Summary(
            run_dir=self.run_dir,
            steps=self.state.step,
            start_step=start_step,
            elapsed=elapsed,
            tokens=self.state.tokens,
            stop_reason=self.stop_reason or "max_iters",
            best_val_loss=self.state.best_val_loss,
            last_eval=last_metrics,
            tokens_per_s=run_tokens / max(session - paused, 1e-9) if run_tokens else None,
            last_eval_step=self.state.last_eval_step if last_metrics else None,
        )
        self.reporter.on_end(summary)
        return summary


def _flatten(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    """{"train": {"loss": 1.2}} -> {"train_loss": 1.2}."""
    return {f"{split}_{k}": v for split, m in metrics.items() for k, v in m.items()}
