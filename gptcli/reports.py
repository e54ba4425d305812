"""What the core tells a person, as plain data: the training loop's reports, and the notes
that setting up a run makes. No torch, no Rich: the CLI renders these (gptcli/cli/render),
a notebook or a tracker may do something else with them.

Subclass Reporter or Notes and override what you need; every method of the base classes
does nothing, so the core can always call them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunInfo:
    """Where and how a run trains, said once before its first step."""

    run_dir: Path
    device: str
    device_reason: str
    precision: str
    precision_reason: str
    params: int  # every parameter, position embeddings included (the optimizers hold them all)
    tokens_per_step: int | None  # None when examples vary in length
    batch_size: int  # sequences per micro-step, in each process
    grad_accum: int  # micro-steps per optimizer step, of all processes together
    processes: int
    start_step: int
    max_iters: int
    max_time: float | None
    compile: bool
    optimizers: dict[str, dict] = field(default_factory=dict)  # gptcli.train.optim.describe
    schedule: str = ""  # the LR schedule in words


@dataclass
class StepReport:
    step: int  # optimizer steps done
    max_iters: int
    elapsed: float
    lr: float  # AdamW's, the schedule's
    muon_lr: float | None = None  # Muon's, in a Muon run
    loss: float | None = None  # mean training loss of this step (on log steps only)
    grad_norm: float | None = None  # the gradient's norm before clipping (on log steps only)
    tokens_per_s: float | None = None
    mfu: float | None = None  # model FLOPs utilisation, 0..1


@dataclass
class SampleReport:
    """A sample drawn while training (--sample-every)."""

    step: int
    prompt: str
    text: str  # the continuation


@dataclass
class EvalReport:
    step: int
    metrics: dict[str, dict[str, float]]  # split -> {"loss": ..., other task metrics}
    best_val_loss: float
    improved: bool
    elapsed: float
    files: dict[str, dict] = field(default_factory=dict)  # --eval-file label -> gptcli eval's metrics


@dataclass
class Summary:
    run_dir: Path
    steps: int
    start_step: int
    elapsed: float
    tokens: int
    stop_reason: str  # max_iters | max_time | interrupted | terminated
    best_val_loss: float | None
    last_eval: dict[str, dict[str, float]] = field(default_factory=dict)  # this session's latest
    tokens_per_s: float | None = None  # as the live view counts them: training steps only
    last_eval_step: int | None = None  # the step of last_eval
    last_files: dict[str, dict] = field(default_factory=dict)  # the --eval-file metrics of last_eval


class Reporter:
    """Hears what the training loop does (gptcli.train.trainer.Trainer.run); does nothing itself."""

    def on_start(self, info: RunInfo) -> None: ...

    def on_step(self, report: StepReport) -> None: ...

    def on_eval(self, report: EvalReport) -> None: ...

    def on_checkpoint(self, name: str, path: Path, step: int) -> None: ...

    def on_sample(self, report: SampleReport) -> None: ...

    def on_end(self, summary: Summary) -> None: ...

    def close(self) -> None:
        """Called last, also when training fails: release the screen."""


class Reporters(Reporter):
    """Several reporters heard as one, in order (the live view and a tracker, say); each
    closes even when one before it fails to."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def on_start(self, info: RunInfo) -> None:
        for r in self.reporters:
            r.on_start(info)

    def on_step(self, report: StepReport) -> None:
        for r in self.reporters:
            r.on_step(report)

    def on_eval(self, report: EvalReport) -> None:
        for r in self.reporters:
            r.on_eval(report)

    def on_checkpoint(self, name: str, path: Path, step: int) -> None:
        for r in self.reporters:
            r.on_checkpoint(name, path, step)

    def on_sample(self, report: SampleReport) -> None:
        for r in self.reporters:
            r.on_sample(report)

    def on_end(self, summary: Summary) -> None:
        for r in self.reporters:
            r.on_end(summary)

    def close(self) -> None:
        with contextlib.ExitStack() as stack:
            for r in reversed(self.reporters):
                stack.callback(r.close)


Progress = Callable[[int, int], None]  # (done, total)


class Notes:
    """Hears what setting up a run finds worth saying (gptcli.train.recipes); does nothing itself."""

    def info(self, text: str) -> None:
        """Something the user should know (which run was picked, what data was read)."""

    def note(self, text: str) -> None:
        """A side remark for a person at a terminal."""

    def warning(self, text: str) -> None:
        """Something that may not be what the user meant."""

    @contextlib.contextmanager
    def progress(self, description: str, total: int) -> Iterator[Progress]:
        """A long step's progress: yields update(done, total)."""
        yield lambda done, total: None
