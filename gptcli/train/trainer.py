"""One training loop for pretraining and finetuning.

Each step draws the global batch, runs its micro-steps (gradient accumulation) under
bf16/fp16 autocast where chosen, clips, and steps the optimizer (gptcli/optim.py). Every
eval_interval steps it evaluates and writes last/ (the full training state,
gptcli/runstate.py) and best/ when val loss improved; every log_interval it logs to
metrics.jsonl and the Reporter (gptcli/reports.py). It never prints.

Under torchrun every process draws the same global batch and trains on its own slice of
it, with the model replicated or sharded (gptcli/parallel.py); rank 0 alone reports and
writes.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from gptcli import lora
from gptcli.config import Config
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import GptcliError, UsageError
from gptcli.evals import evaluate as evaluate_file
from gptcli.evals import plan_files
from gptcli.model import GPT
from gptcli.reports import EvalReport, Reporter, RunInfo, SampleReport, StepReport, Summary
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
from gptcli.store import files
from gptcli.store.checkpoint import BEST, LAST, STABLE, RunLock, checkpoint_in, copy_checkpoint, read_meta
from gptcli.tasks import Batch, Task
from gptcli.train.optim import (
    decay_due,
    decay_time,
    describe,
    describe_schedule,
    make_optimizers,
    rates_at,
    set_lr,
)
from gptcli.train.parallel import Sharded, Whole
from gptcli.train.state import METRICS_FILE, MetricsLog, Parts, TrainState, refit_schedule, restore, save_last

CONFIG_FILE = "config.yaml"
RUN_FILES = (LAST, BEST, STABLE, CONFIG_FILE, METRICS_FILE, "loss.png")  # what a run writes in its directory


class Diverged(GptcliError):
    """The loss became NaN or infinite."""


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
        if self.trainer.stop_request is not None:
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

    def forward(self, batch: Batch | None = None, apply: Callable[[nn.Module], Any] | None = None) -> Any:
        """A batch's loss; or, given apply, its result on the model (FSDP evaluates this
        way, so that the root's weights are gathered for it). Which one is decided by
        whether apply is None, a constant to torch.compile: the step stays one graph."""
        if apply is not None:
            return apply(self.model)
        return self.task.loss(self.model, batch)


@dataclass
class _Clock:
    """The run's time (earlier sessions of a resumed run included) and the throughput
    window: tokens/s counts training steps only, never evaluation or checkpoints."""

    t0: float  # when the run would have started, had it never stopped
    window_t: float
    window_tokens: int = 0
    paused: float = 0.0  # this session's time spent evaluating and checkpointing

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def pause(self, since: float) -> None:
        """Leave the time since `since` out of tokens/s."""
        now = time.perf_counter()
        self.paused += now - since
        self.window_t, self.window_tokens = now, 0

    def tokens_per_s(self) -> float:
        """Over the window since the last call (or pause), which starts a new one."""
        now = time.perf_counter()
        rate = self.window_tokens / max(now - self.window_t, 1e-9)
        self.window_t, self.window_tokens = now, 0
        return rate


class Trainer:
    """Trains `model` on `task` and keeps `run_dir` up to date."""

    def __init__(
        self,
        model: GPT,
        tokenizer: Tokenizer,
        task: Task,
        config: Config,
        run_dir: Path,
        meta: dict[str, Any] | None = None,
        resume_from: str = LAST,
    ) -> None:
        self.model = model
        self.resume_from = resume_from  # the checkpoint run(resume=True) continues from: last/, or stable/
        self.tokenizer = tokenizer
        self.task = task
        self.config = config
        self.cfg = config.train
        self.run_dir = Path(run_dir)
        self.meta = meta or {}
        self.stop_reason: str | None = None  # why the loop stopped, once it does
        self.stop_request: str | None = None  # a stop asked for on this process, not yet acted on
        self.metrics = MetricsLog(self.run_dir / METRICS_FILE)
        self.dist = dist_from_env()
        self.reporter = Reporter()
        self.eval_files = plan_files(self.cfg.eval_files, self.meta)  # checked before any training
        self.cfg.eval_files = [str(f.path.resolve()) for f in self.eval_files]  # found again from anywhere
        if self.cfg.sample_every:  # a prompt the tokenizer cannot encode fails now, not mid-run
            from gptcli.infer.completion import encode_prompt

            encode_prompt(tokenizer, self.cfg.sample_prompt or None, model.config.block_size)

    def request_stop(self, reason: str = "interrupted") -> None:
        """Stop at the next step boundary (under torchrun, the next one where the processes
        agree), after writing a last/ checkpoint."""
        self.stop_request = reason

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
        init_distributed(self.device, cfg.dist_timeout)
        self.precision: Precision = pick_precision(self.device, cfg.dtype)
        sharding = dist.enabled and cfg.fsdp
        if self.device.type == "cpu":
            keep_freed_memory()  # no page faults on every step's fresh activations
            if self.precision.name == "bf16":
                self.model.set_attention("explicit")  # faster than the CPU's fused kernel in bf16
        if self.precision.name == "bf16" and not sharding:
            lora.hold_base_in(self.model, torch.bfloat16)  # frozen LoRA bases: half the memory (FSDP
            # units all-gather one dtype, so sharded bases stay as they are)
        if not sharding:  # sharded, each block goes to the device as it is split: never whole
            self._check_memory()
            self.model.to(self.device)
        scaler = torch.amp.GradScaler(self.device.type, enabled=self.precision.needs_grad_scaler)
        # the same data stream on every rank (each takes its slice of the global batch), but
        # its own dropout masks
        data_gen = torch.Generator().manual_seed(cfg.seed)
        torch.manual_seed(cfg.seed + dist.rank)
        # evaluation runs the model; training runs the task's loss, as one module since a task
        # may call more of the model than its forward (hidden_states, the classifier)
        loss_module = _TaskLoss(self.model, self.task)
        placement: Whole | Sharded
        if sharding:
            if self.precision.needs_grad_scaler:
                raise UsageError("--fsdp trains in bf16 or fp32; pick one with --dtype (fp16 needs DDP)")
            param_dtype = torch.bfloat16 if self.precision.name == "bf16" else None
            placement = Sharded(loss_module, self.model, self.device, dist.world, cfg.compile, param_dtype)
            self.device_reason += f"; weights, gradients and AdamW state sharded {dist.world} ways (FSDP)"
            if param_dtype is not None:
                self.device_reason += ", weights gathered in bf16 and gradients reduced in fp32"
        else:
            placement = Whole(loss_module, self.model, self.device, dist.enabled, cfg.compile)
        optimizers = make_optimizers(self.model, cfg, self.device)  # after sharding, if any
        self.meta["optimizers"] = describe(optimizers, cfg)  # in every checkpoint.json
        self.parts = Parts(optimizers, placement, scaler, data_gen, dist, self.device)
        self.state = TrainState()

    def _check_memory(self) -> None:
        """Refuse a batch that cannot fit before allocating it (a lower bound on the need)."""
        params = sum(p.numel() for p in self.model.parameters())
        trained = sum(p.numel() for p in self.model.parameters() if p.requires_grad)  # less under LoRA
        fused = not self.model.transformer.h[0].attn.explicit  # SDPA keeps no attention matrix
        needed = training_bytes(self.model.config, trained, self.cfg.batch_size, self.precision, fused)
        if self.device.type != "cpu":
            needed += 4 * params  # the weights, still on the CPU
        check_fits(needed, self.device, f"training with --batch-size {self.cfg.batch_size}")
        # a step draws all its examples at once: a (grad_accum, batch_size) index on the CPU
        accum, batch = self.cfg.grad_accum or 1, self.cfg.batch_size
        check_fits(8 * accum * batch, torch.device("cpu"), f"--grad-accum {accum} with --batch-size {batch}")

    def _run_info(self) -> RunInfo:
        cfg, model = self.cfg, self.model
        tokens_per_step = cfg.batch_size * cfg.grad_accum * self._seq_len() if self._fixed_length() else None
        params = model.num_params(non_embedding=False)  # as the optimizer line counts them
        return RunInfo(
            self.run_dir, str(self.device), self.device_reason, self.precision.name, self.precision.reason,
            params, tokens_per_step, cfg.batch_size, cfg.grad_accum, self.dist.world,
            self.state.step, cfg.max_iters, cfg.max_time, cfg.compile, self.meta.get("optimizers", {}),
            describe_schedule(cfg),
        )  # fmt: skip

    def _seq_len(self) -> int:
        return getattr(self.task, "block_size", self.model.config.block_size)

    def _fixed_length(self) -> bool:
        return getattr(self.task, "fixed_length", False)

    # -- checkpoints and evaluation

    def _save_last(self, metrics: dict[str, dict[str, float]] | None) -> None:
        bad = self.parts.placement.nonfinite_weight()
        if bad:  # never overwrite the last good checkpoint with a broken model
            self._diverged(f"{bad} holds NaN or inf")
        path = save_last(
            self.run_dir, self.model, self.tokenizer, self.config, self.meta, self.state, self.parts, metrics
        )
        if path is not None:
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
    def evaluate(self) -> tuple[dict[str, dict[str, float]], dict[str, dict]]:
        """The task's metrics per split, and each --eval-file's (every process scores them,
        so that sharded models take every forward pass together)."""

        def run(model: nn.Module) -> tuple[dict[str, dict[str, float]], dict[str, dict]]:
            splits = {
                split: self.task.evaluate(model, split, self._eval_batches(split))
                for split in ("train", "val")
            }
            scored = {
                f.label: evaluate_file(model, self.tokenizer, self.meta, f.path, f.task, f.how).metrics
                for f in self.eval_files
            }
            return splits, scored

        self.model.eval()
        try:
            with self.precision.autocast():
                return self.parts.placement.evaluate(run)
        finally:
            self.model.train()

    def _evaluate_and_checkpoint(self, elapsed: float) -> tuple[dict[str, dict[str, float]], dict[str, dict]]:
        metrics, scored = self.evaluate()
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
            self.metrics.append(record | ({"files": scored} if scored else {}))
        self.reporter.on_eval(
            EvalReport(self.state.step, metrics, self.state.best_val_loss, improved, elapsed, scored)
        )
        self._save_last(metrics)
        if improved and self.dist.is_main:
            path = copy_checkpoint(self.run_dir, LAST, BEST)
            self.reporter.on_checkpoint("best", path, self.state.step)
        return metrics, scored

    @torch.no_grad()
    def _sample(self) -> None:
        """Draw one --sample-every sample from the model as it is, with a generator of its
        own seeded by the step: training's random streams are left alone, so losses and
        weights stay the same with and without samples, and a resumed run draws the same
        ones. Every process draws it (sharded models take the forward passes together)."""
        from gptcli.infer.completion import complete, encode_prompt

        prompt = encode_prompt(self.tokenizer, self.cfg.sample_prompt or None, self.model.config.block_size)

        def run(model: nn.Module) -> str:
            done = complete(
                model,
                self.tokenizer,
                prompt,
                max_new_tokens=self.cfg.sample_tokens,
                seed=self.cfg.seed + self.state.step,
            )
            return done[0].text

        self.model.eval()
        try:
            with self.precision.autocast():
                text = self.parts.placement.evaluate(run)
        finally:
            self.model.train()
        if self.dist.is_main:
            self.metrics.append(
                {"kind": "sample", "step": self.state.step, "prompt": prompt.text, "text": text}
            )
        self.reporter.on_sample(SampleReport(self.state.step, prompt.text, text))

    def _diverged(self, what: str) -> None:
        best = self.state.best_val_loss
        raise Diverged(
            f"training diverged at step {self.state.step}: {what} (best val loss so far "
            f"{best if best is None else round(best, 4)}); the last good checkpoint is kept. "
            "Lower --lr, check the data, or train in --dtype fp32"
        )

    # -- one optimizer step

    def _step(
        self, rates: dict[str, float], measure: bool = False
    ) -> tuple[torch.Tensor, int, torch.Tensor | None]:
        """One optimizer step over the global batch, at these rates (rates_at): this
        process's micro-steps, then clip and step. Returns this process's mean loss (on the
        device, not synced), the tokens the whole job processed, and the gradient norm
        before clipping (when clipping, or when measure asks for it; None otherwise)."""
        cfg, dist, parts = self.cfg, self.dist, self.parts
        set_lr(parts.optimizers, rates)
        indices = torch.randint(
            self.task.num_examples("train"), (cfg.grad_accum, cfg.batch_size), generator=parts.data_gen
        )
        mine = range(dist.rank, cfg.grad_accum, dist.world)  # rank r takes micro-steps r, r + world, ...
        step_loss, tokens = torch.zeros((), device=self.device), 0
        for i, micro in enumerate(mine):
            batch = self.task.batch("train", indices[micro], self.device)
            tokens += self.task.tokens(batch) * dist.world
            with parts.placement.micro_step(last=i == len(mine) - 1):
                with self.precision.autocast():
                    loss = parts.placement.train_module(batch) / len(mine)
                parts.scaler.scale(loss).backward()
            step_loss += loss.detach()
        norm = None
        optimizers = parts.optimizers.values()
        if cfg.grad_clip > 0 or measure:  # an infinite bound measures and leaves the gradients as they are
            for opt in optimizers:
                parts.scaler.unscale_(opt)
            norm = nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip or math.inf)
        for opt in optimizers:
            parts.scaler.step(opt)
        parts.scaler.update()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        return step_loss, tokens, norm

    def _log(
        self,
        report: StepReport,
        step_loss: torch.Tensor,
        grad_norm: torch.Tensor | None,
        clock: _Clock,
        peak: float | None,
    ) -> float | None:
        """Fill a log step's report (loss, gradient norm, tokens/s, MFU) and write it to
        metrics.jsonl; returns the peak FLOP/s to measure MFU against from now on."""
        loss = self.dist.reduce(step_loss).item()
        if grad_norm is not None:  # of the whole model, the same on every process
            full = getattr(grad_norm, "full_tensor", None)  # FSDP returns a DTensor
            report.grad_norm = float(full() if full is not None else grad_norm)
        if not math.isfinite(loss):
            self._diverged(f"training loss is {loss}")
        report.loss, report.tokens_per_s = loss, clock.tokens_per_s()
        if peak:  # tokens/s counts every process, each with its own device
            achieved = self.model.flops_per_token(self._seq_len()) * report.tokens_per_s / self.dist.world
            peak = record_achieved(self.device, self.precision, peak, achieved)
            report.mfu = achieved / peak
        if self.dist.is_main:
            self.metrics.append(
                {
                    "kind": "train",
                    "step": report.step,
                    "loss": loss,
                    "lr": report.lr,
                    **({} if report.muon_lr is None else {"muon_lr": report.muon_lr}),
                    "grad_norm": report.grad_norm,
                    "tokens": self.state.tokens,
                    "tokens_per_s": round(report.tokens_per_s, 1),
                    "mfu": None if report.mfu is None else round(report.mfu, 4),
                    "elapsed": round(report.elapsed, 3),
                }
            )
        return peak

    def _should_stop(self, elapsed: float) -> tuple[bool, bool]:
        """Whether to stop before the next step (max_iters, max_time or a signal), and whether
        max_time says a WSD run's decay is due. Under torchrun every process must act at the
        same step: what only one process knows (its clock, a signal) is agreed on at log
        steps alone, one small all-reduce per log interval rather than a host sync every
        step; max_iters needs no agreement."""
        cfg = self.cfg
        out_of_time = cfg.max_time is not None and elapsed >= cfg.max_time
        timed_decay = self.state.decay_from is None and decay_time(cfg, elapsed)
        request = self.stop_request
        if self.dist.enabled:
            if self.state.step % cfg.log_interval == 0:
                flags = torch.tensor([out_of_time, request is not None, timed_decay], dtype=torch.float32)
                flags = self.dist.reduce(flags.to(self.device), "max").cpu()
                out_of_time, timed_decay = bool(flags[0]), bool(flags[2])
                request = (request or "interrupted") if flags[1] else None
            else:  # acted on at the next log step, by every process together
                out_of_time, request, timed_decay = False, None, False
        if self.stop_reason is None and request is not None:
            self.stop_reason = request
        if self.stop_reason is None and (self.state.step >= cfg.max_iters or out_of_time):
            self.stop_reason = "max_time" if self.state.step < cfg.max_iters else "max_iters"
        return self.stop_reason is not None, timed_decay and self.state.step >= cfg.warmup_iters

    def _begin_decay(self, elapsed: float) -> None:
        """End a WSD run's constant phase: keep the checkpoint just taken here as stable/, from
        which a longer budget can continue, and decay from now on."""
        if self.dist.is_main:
            path = copy_checkpoint(self.run_dir, LAST, STABLE, train_state=True)
            self.reporter.on_checkpoint(STABLE, path, self.state.step)
        self.state.decay_from = [self.state.step, self.cfg.lr, elapsed]

    # -- the loop

    def run(self, resume: bool = False, reporter: Reporter | None = None) -> Summary:
        """Train to the end of the budget (or a signal) and return the summary; with
        resume, continue exactly from run_dir's last/ checkpoint. The reporter hears
        everything (on rank 0 only under torchrun). Under torchrun the run ends the job's
        process group and releases the optimizers (and a sharded model): read the results
        from run_dir's checkpoints."""
        self.reporter = reporter if reporter is not None and self.dist.is_main else Reporter()
        lock = RunLock(self.run_dir) if self.dist.is_main else contextlib.nullcontext()
        finished = False
        try:
            with lock:
                if self.dist.is_main:  # what a killed run left half-written (we hold the lock)
                    files.clean_stale(self.run_dir, RUN_FILES)
                summary = self._run(resume)
                finished = True
                return summary
        finally:
            self.reporter.close()
            if self.dist.enabled:
                self._leave_job(finished)

    def _leave_job(self, finished: bool) -> None:
        """Leave the torchrun job's process group, every process together when the run
        finished (a process leaving early aborted at exit). What holds the group and its last
        collectives' buffers (DDP's reducer, the optimizers; under FSDP the model, whose
        weights are shards over the group) is freed first, while the interpreter is whole,
        not in its finalization on the way out."""
        import gc

        import torch.distributed as td

        if not td.is_initialized():
            return
        if finished:
            td.barrier()
        if isinstance(getattr(self, "parts", None), Parts) and isinstance(self.parts.placement, Sharded):
            self.model = None  # type: ignore[assignment]
        self.parts = None  # type: ignore[assignment]
        gc.collect()
        td.destroy_process_group()

    def _run(self, resume: bool) -> Summary:
        self._setup()
        if resume:
            self.state = restore(self.run_dir, self.parts, self.resume_from)
            if self.resume_from == STABLE:  # best/ may hold a better model, from the decay since
                best = checkpoint_in(self.run_dir, BEST)
                kept = read_meta(best).get("best_val_loss") if best is not None else None
                if kept is not None and (self.state.best_val_loss is None or kept < self.state.best_val_loss):
                    self.state.best_val_loss = kept
            if self.dist.is_main:
                self.metrics.truncate(
                    self.state.step, keep_eval_at_step=self.state.last_eval_step == self.state.step
                )
        refit_schedule(self.state, self.cfg)
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            files.write_file(self.run_dir / CONFIG_FILE, self.config.to_yaml())
        start_step, start_tokens = self.state.step, self.state.tokens
        peak = peak_flops(self.device, self.precision)  # of one process's device
        self.reporter.on_start(self._run_info())
        session_start = time.perf_counter()
        clock = _Clock(t0=session_start - self.state.elapsed, window_t=session_start)
        last_metrics: dict[str, dict[str, float]] = {}
        last_files: dict[str, dict] = {}
        self.model.train()
        with _StopSignals(self):
            while True:
                self.state.elapsed = elapsed = clock.elapsed()
                stopping, timed_decay = self._should_stop(elapsed)
                if self.stop_reason in ("interrupted", "terminated"):
                    self._save_last(None)
                    break
                if (stopping or self.state.step % self.cfg.eval_interval == 0) and (
                    self.state.last_eval_step != self.state.step
                ):
                    since = time.perf_counter()
                    last_metrics, last_files = self._evaluate_and_checkpoint(elapsed)
                    clock.pause(since)
                if stopping:
                    break
                if self.state.decay_from is None and (timed_decay or decay_due(self.state.step, self.cfg)):
                    since = time.perf_counter()
                    if self.state.last_eval_step != self.state.step:
                        last_metrics, last_files = self._evaluate_and_checkpoint(elapsed)
                    self._begin_decay(elapsed)
                    clock.pause(since)
                rates = rates_at(self.state.step, self.cfg, elapsed, self.state.decay_from)
                logging = (self.state.step + 1) % self.cfg.log_interval == 0 or self.state.step == 0
                step_loss, tokens, grad_norm = self._step(rates, measure=logging)
                self.state.step += 1
                self.state.tokens += tokens
                clock.window_tokens += tokens
                muon_lr = rates["muon"] if "muon" in self.parts.optimizers else None
                report = StepReport(
                    self.state.step, self.cfg.max_iters, clock.elapsed(), rates["adamw"], muon_lr
                )
                if logging:
                    peak = self._log(report, step_loss, grad_norm, clock, peak)
                self.reporter.on_step(report)
                if self.cfg.sample_every and self.state.step % self.cfg.sample_every == 0:
                    since = time.perf_counter()
                    self._sample()
                    clock.pause(since)
        session = time.perf_counter() - session_start
        run_tokens = self.state.tokens - start_tokens
        summary = Summary(
            run_dir=self.run_dir,
            steps=self.state.step,
            start_step=start_step,
            elapsed=clock.elapsed(),
            tokens=self.state.tokens,
            stop_reason=self.stop_reason or "max_iters",
            best_val_loss=self.state.best_val_loss,
            last_eval=last_metrics,
            tokens_per_s=run_tokens / max(session - clock.paused, 1e-9) if run_tokens else None,
            last_eval_step=self.state.last_eval_step if last_metrics else None,
            last_files=last_files,
        )
        self.reporter.on_end(summary)
        return summary


def _flatten(metrics: dict[str, dict[str, float]]) -> dict[str, float]:
    """{"train": {"loss": 1.2}} -> {"train_loss": 1.2}."""
    return {f"{split}_{k}": v for split, m in metrics.items() for k, v in m.items()}
