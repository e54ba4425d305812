"""One training loop for pretraining and finetuning.

Each step draws the global batch, runs its micro-steps and steps the optimizers
(step.py). Every eval_interval steps it evaluates (evaluation.py) and writes last/ (the
full training state, state.py) and best/ when val loss improved; every log_interval steps
(and at the last) it logs to metrics.jsonl and the Reporter (gptcli/reports.py). It never
prints. Set-up (device, precision, placement, optimizers) is setup.py's.

Under torchrun every process draws the same global batch and trains on its own slice of
it, with the model replicated or sharded (parallel.py); rank 0 alone reports and writes.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcli import files
from gptcli.config import Config
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import GptcliError
from gptcli.model import GPT
from gptcli.reports import EvalReport, Reporter, RunInfo, SampleReport, StepReport, Summary
from gptcli.runtime import dist_from_env, peak_flops, record_achieved
from gptcli.store.checkpoint import BEST, LAST, STABLE, RunLock, copy_checkpoint
from gptcli.tasks import Task
from gptcli.train.evaluation import Evaluator, Metrics
from gptcli.train.optim import decay_due, describe, describe_schedule, rates_at
from gptcli.train.parallel import Sharded, leave_job
from gptcli.train.setup import set_up
from gptcli.train.state import METRICS_FILE, MetricsLog, Parts, TrainState, refit_schedule, restore, save_last
from gptcli.train.step import StepResult, Stopping, StopSignals, optimizer_step

CONFIG_FILE = "config.yaml"
RUN_FILES = (LAST, BEST, STABLE, CONFIG_FILE, METRICS_FILE, "loss.png")  # what a run writes in its directory


class Diverged(GptcliError):
    """The loss became NaN or infinite."""


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

    @contextlib.contextmanager
    def paused_for(self) -> Any:
        """Leave the time of the block out of tokens/s (evaluating, checkpointing, sampling)."""
        since = time.perf_counter()
        yield
        now = time.perf_counter()
        self.paused += now - since
        self.window_t, self.window_tokens = now, 0

    def tokens_per_s(self) -> float:
        """Over the window since the last call (or pause), which starts a new one."""
        now = time.perf_counter()
        rate = self.window_tokens / max(now - self.window_t, 1e-9)
        self.window_t, self.window_tokens = now, 0
        return rate


def _seq_len(task: Task, model: GPT) -> int:
    """The tokens of one training sequence: the task's length, or the model's context."""
    return getattr(task, "block_size", model.config.block_size)


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
        self.model, self.tokenizer, self.task, self.config = model, tokenizer, task, config
        self.run_dir = Path(run_dir)
        self.meta = meta or {}
        self.resume_from = resume_from  # the checkpoint run(resume=True) continues from: last/, or stable/
        self.metrics = MetricsLog(self.run_dir / METRICS_FILE)
        self.dist = dist_from_env()
        # a new run's directory, empty or not there yet: removed again if the run fails before
        # its first checkpoint (a refusal at the start must not leave a run that cannot resume)
        self.new_dir = not (self.run_dir.is_dir() and any(self.run_dir.iterdir()))
        self.made_dir = not self.run_dir.exists()  # (an empty directory of the user's stays)
        self.reporter = Reporter()
        self.stopping = Stopping(config.train, self.dist)
        self.evaluator = Evaluator(model, tokenizer, task, config.train, self.meta)
        self.state = TrainState()
        self.parts: Parts | None = None  # once set up

    def request_stop(self, reason: str = "interrupted") -> None:
        """Stop at the next step boundary (under torchrun, the next one where the processes
        agree), after writing a last/ checkpoint."""
        self.stopping.request(reason)

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
        except BaseException:
            if self.dist.is_main and self.new_dir and not resume:
                self._remove_unstarted_run()
            raise
        finally:
            self.reporter.close()
            if self.dist.enabled:
                self._leave_job(finished)

    def _run(self, resume: bool) -> Summary:
        """The loop, as nanoGPT's: stop, evaluate and checkpoint, decay, step, log, sample."""
        cfg = self.config.train
        self.session = set_up(self.model, self.task, cfg, self.dist)
        self.parts = self.session.parts
        self.meta["optimizers"] = describe(self.parts.optimizers, cfg)  # in every checkpoint.json
        if resume:
            self.state = restore(self.run_dir, self.parts, self.resume_from)
        self._write_config()
        state = self.state
        start_step, start_tokens = state.step, state.tokens
        peak = peak_flops(self.session.device, self.session.precision)  # of one process's device
        self.reporter.on_start(self._run_info())
        session_start = time.perf_counter()
        clock = _Clock(t0=session_start - state.elapsed, window_t=session_start)
        last: tuple[Metrics, dict[str, dict]] = ({}, {})
        unlogged: tuple[StepReport, StepResult] | None = None  # the last step, when not a log step
        self.model.train()
        with StopSignals(self.stopping):
            while True:
                state.elapsed = elapsed = clock.elapsed()
                stopping, timed_decay = self.stopping.check(state, elapsed, self.session.device)
                if stopping and unlogged is not None:  # (out of time, or a signal: every process alike)
                    peak = self._log(*unlogged, clock, peak)
                    self.reporter.on_step(unlogged[0])
                unlogged = None
                if self.stopping.by_signal:
                    self._save_last(None)
                    break
                due = stopping or state.step % cfg.eval_interval == 0
                if due and state.last_eval_step != state.step:
                    with clock.paused_for():
                        last = self._evaluate_and_checkpoint(elapsed)
                if stopping:
                    break
                if state.decay_from is None and (timed_decay or decay_due(state.step, cfg)):
                    with clock.paused_for():
                        if state.last_eval_step != state.step:
                            last = self._evaluate_and_checkpoint(elapsed)
                        self._begin_decay(elapsed)
                rates = rates_at(state.step, cfg, elapsed, state.decay_from)
                # (and the last step, so that the log and the curve end where the run does; a
                # stop by time or by a signal logs its last step when it is noticed, above)
                logging = (state.step + 1) % cfg.log_interval == 0 or state.step in (0, cfg.max_iters - 1)
                result = optimizer_step(
                    self.model, self.task, cfg, self.parts, self.session.precision, rates, measure=logging
                )
                state.step, state.tokens = state.step + 1, state.tokens + result.tokens
                clock.window_tokens += result.tokens
                muon_lr = rates["muon"] if "muon" in self.parts.optimizers else None
                report = StepReport(state.step, cfg.max_iters, clock.elapsed(), rates["adamw"], muon_lr)
                if logging:
                    peak = self._log(report, result, clock, peak)
                else:
                    unlogged = (report, result)
                self.reporter.on_step(report)
                if cfg.sample_every and state.step % cfg.sample_every == 0:
                    with clock.paused_for():
                        self._sample()
        session = time.perf_counter() - session_start
        return self._finish(clock, session, start_step, start_tokens, *last)

    # -- around the loop

    def _remove_unstarted_run(self) -> None:
        """A new run that failed before its first checkpoint: what it wrote (the config, the
        log), and the directory it made if nothing else is left in it."""
        if any((self.run_dir / name).exists() for name in (LAST, BEST, STABLE)):
            return
        for name in (CONFIG_FILE, METRICS_FILE, "loss.png"):
            (self.run_dir / name).unlink(missing_ok=True)
        if self.made_dir:
            with contextlib.suppress(OSError):
                self.run_dir.rmdir()

    def _write_config(self) -> None:
        refit_schedule(self.state, self.config.train)
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            files.write_file(self.run_dir / CONFIG_FILE, self.config.to_yaml())

    def _run_info(self) -> RunInfo:
        cfg, session = self.config.train, self.session
        fixed = getattr(self.task, "fixed_length", False)
        return RunInfo(
            run_dir=self.run_dir,
            device=str(session.device),
            device_reason=session.device_reason,
            precision=session.precision.name,
            precision_reason=session.precision.reason,
            params=self.model.num_params(non_embedding=False),  # as the optimizer line counts them
            tokens_per_step=cfg.batch_size * cfg.grad_accum * _seq_len(self.task, self.model)
            if fixed
            else None,
            batch_size=cfg.batch_size,
            grad_accum=cfg.grad_accum,
            processes=self.dist.world,
            start_step=self.state.step,
            max_iters=cfg.max_iters,
            max_time=cfg.max_time,
            compile=cfg.compile,
            optimizers=self.meta.get("optimizers", {}),
            schedule=describe_schedule(cfg),
        )

    def _finish(
        self,
        clock: _Clock,
        session: float,
        start_step: int,
        start_tokens: int,
        metrics: Metrics,
        scored: dict,
    ) -> Summary:
        run_tokens = self.state.tokens - start_tokens
        summary = Summary(
            run_dir=self.run_dir,
            steps=self.state.step,
            start_step=start_step,
            elapsed=clock.elapsed(),
            tokens=self.state.tokens,
            stop_reason=self.stopping.reason or "max_iters",
            best_val_loss=self.state.best_val_loss,
            last_eval=metrics,
            tokens_per_s=run_tokens / max(session - clock.paused, 1e-9) if run_tokens else None,
            last_eval_step=self.state.last_eval_step if metrics else None,
            last_files=scored,
        )
        self.reporter.on_end(summary)
        return summary

    def _leave_job(self, finished: bool) -> None:
        """Free what holds the process group (the optimizers; under FSDP the model, whose
        weights are shards over it) while the interpreter is whole, then leave the job."""
        if self.parts is not None and isinstance(self.parts.placement, Sharded):
            self.model = None  # type: ignore[assignment]
        self.parts = None  # type: ignore[assignment]
        leave_job(finished)

    # -- what the loop does besides stepping

    def _log(self, report: StepReport, result: StepResult, clock: _Clock, peak: float | None) -> float | None:
        """Fill a log step's report (loss, gradient norm, tokens/s, MFU) and write it to
        metrics.jsonl; returns the peak FLOP/s to measure MFU against from now on."""
        loss = self.dist.reduce(result.loss).item()
        if result.grad_norm is not None:  # of the whole model, the same on every process
            full = getattr(result.grad_norm, "full_tensor", None)  # FSDP returns a DTensor
            report.grad_norm = float(full() if full is not None else result.grad_norm)
        if not math.isfinite(loss):
            self._diverged(f"training loss is {loss}")
        report.loss, report.tokens_per_s = loss, clock.tokens_per_s()
        if peak:  # tokens/s counts every process, each with its own device
            achieved = (
                self.model.flops_per_token(_seq_len(self.task, self.model))
                * report.tokens_per_s
                / self.dist.world
            )
            peak = record_achieved(self.session.device, self.session.precision, peak, achieved)
            report.mfu = achieved / peak
        if self.dist.is_main:
            self.metrics.log_step(report, self.state.tokens)
        return peak

    def _evaluate_and_checkpoint(self, elapsed: float) -> tuple[Metrics, dict[str, dict]]:
        state = self.state
        metrics, scored = self.evaluator.evaluate(self.parts, self.session.precision)
        val = metrics["val"]["loss"]
        if not math.isfinite(val):
            self._diverged(f"validation loss is {val}")
        improved = state.best_val_loss is None or val < state.best_val_loss
        if improved:
            state.best_val_loss = val
        state.last_eval_step = state.step
        if self.dist.is_main:
            self.metrics.log_eval(state.step, elapsed, metrics, scored)
        self.reporter.on_eval(EvalReport(state.step, metrics, state.best_val_loss, improved, elapsed, scored))
        self._save_last(metrics)
        if improved and self.dist.is_main:
            self.reporter.on_checkpoint("best", copy_checkpoint(self.run_dir, LAST, BEST), state.step)
        return metrics, scored

    def _save_last(self, metrics: Metrics | None) -> None:
        bad = self.parts.placement.nonfinite_weight()
        if bad:  # never overwrite the last good checkpoint with a broken model
            self._diverged(f"{bad} holds NaN or inf")
        path = save_last(
            self.run_dir, self.model, self.tokenizer, self.config, self.meta, self.state, self.parts, metrics
        )
        if path is not None:
            self.reporter.on_checkpoint(LAST, path, self.state.step)

    def _begin_decay(self, elapsed: float) -> None:
        """End a WSD run's constant phase: keep the checkpoint just taken here as stable/, from
        which a longer budget can continue, and decay from now on."""
        if self.dist.is_main:
            path = copy_checkpoint(self.run_dir, LAST, STABLE, train_state=True)
            self.reporter.on_checkpoint(STABLE, path, self.state.step)
        self.state.decay_from = [self.state.step, self.config.train.lr, elapsed]

    def _sample(self) -> None:
        prompt, text = self.evaluator.sample(self.parts, self.session.precision, self.state.step)
        if self.dist.is_main:
            self.metrics.log_sample(self.state.step, prompt, text)
        self.reporter.on_sample(SampleReport(self.state.step, prompt, text))

    def _diverged(self, what: str) -> None:
        best = self.state.best_val_loss
        raise Diverged(
            f"training diverged at step {self.state.step}: {what} (best val loss so far "
            f"{best if best is None else round(best, 4)}); the last good checkpoint is kept. "
            "Lower --lr, check the data, or train in --dtype fp32"
        )
