"""--tracker tensorboard: event files in RUN/tensorboard, for `tensorboard --logdir RUN`.

Scalars named as in metrics.jsonl: train/ for log steps (loss, lr, grad_norm,
tokens_per_s, mfu), eval/ for evaluations (val_loss, train_loss, val_bpb, ...) and
eval/files/NAME/ for each --eval-file; the config and each sample as text. A resumed run
purges what the crashed run logged after its last checkpoint (purge_step), so every step
is there once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from torch.utils.tensorboard import SummaryWriter  # ImportError without the tensorboard package

from gptcli.reports import EvalReport, Reporter, RunInfo, SampleReport, StepReport
from gptcli.trackers import eval_scalars, step_scalars

LOG_DIR = "tensorboard"


class TensorBoard(Reporter):
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.log_dir = Path(run_dir) / LOG_DIR
        self.config = config
        self.writer: SummaryWriter | None = None

    def on_start(self, info: RunInfo) -> None:
        resumed = info.start_step > 0  # steps after the checkpoint are replayed: drop their old events
        self.writer = SummaryWriter(str(self.log_dir), purge_step=info.start_step + 1 if resumed else None)
        if not resumed:
            text = yaml.safe_dump(self.config, sort_keys=False)
            self.writer.add_text("config", "```\n" + text + "```", 0)

    def on_step(self, r: StepReport) -> None:
        if self.writer is None or r.loss is None:
            return
        for name, value in step_scalars(r).items():
            self.writer.add_scalar(name, value, r.step)

    def on_eval(self, r: EvalReport) -> None:
        if self.writer is None:
            return
        for name, value in eval_scalars(r).items():
            self.writer.add_scalar(name, value, r.step)
        self.writer.flush()

    def on_sample(self, r: SampleReport) -> None:
        if self.writer is not None:
            self.writer.add_text("sample", r.prompt + r.text, r.step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
