"""What a run measures while it trains: the task's metrics on fixed batches of each split,
each --eval-file scored as `gptcli eval` scores it, and --sample-every samples.

Every process runs them (a sharded model takes every forward pass together), with the
model in eval mode under the run's autocast, back in training mode after.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import torch
import torch.nn as nn

from gptcli.config import TrainConfig
from gptcli.data.tokenizer import Tokenizer
from gptcli.evals import evaluate as evaluate_file
from gptcli.evals import plan_files
from gptcli.evals.text import encode_text
from gptcli.runtime import Precision
from gptcli.tasks import Batch, Task
from gptcli.train.state import Parts

T = TypeVar("T")
Metrics = dict[str, dict[str, float]]  # split -> {"loss": ..., the task's other metrics}


class Evaluator:
    """Scores a run's model; made before training, so that a bad --eval-file or
    --sample-prompt fails before the first step."""

    def __init__(
        self, model: nn.Module, tokenizer: Tokenizer, task: Task, cfg: TrainConfig, meta: dict
    ) -> None:
        self.model, self.tokenizer, self.task, self.cfg, self.meta = model, tokenizer, task, cfg, meta
        self.files = plan_files(cfg.eval_files, meta)  # checked before any training
        cfg.eval_files = [str(f.path.resolve()) for f in self.files]  # found again from anywhere
        for f in self.files:  # text the tokenizer cannot read (binary, not UTF-8, unknown characters)
            if f.task == "text" and f.how != "head":
                encode_text(f.path, tokenizer)
        self.prompt = None
        if cfg.sample_every:  # a prompt the tokenizer cannot encode fails now, not mid-run
            from gptcli.infer.completion import encode_prompt

            self.prompt = encode_prompt(tokenizer, cfg.sample_prompt or None, model.config.block_size)

    def _batches(self, split: str, device: torch.device) -> Iterator[Batch]:
        """eval_iters batches of examples spread evenly over the split (all of it when it is
        that small): the same ones at every evaluation, so the curve shows learning rather
        than sampling noise, and a steadier estimate than random batches."""
        n, want = self.task.num_examples(split), self.cfg.eval_iters * self.cfg.batch_size
        indices = torch.arange(n) if n <= want else torch.linspace(0, n - 1, want).round().long()
        for chunk in indices.split(self.cfg.batch_size):
            yield self.task.batch(split, chunk, device)

    @torch.no_grad()
    def _on(self, parts: Parts, precision: Precision, fn: Callable[[nn.Module], T]) -> T:
        """fn(model) with the model in eval mode, under autocast, where its weights are whole."""
        self.model.eval()
        try:
            with precision.autocast():
                return parts.placement.evaluate(fn)
        finally:
            self.model.train()

    def evaluate(self, parts: Parts, precision: Precision) -> tuple[Metrics, dict[str, dict]]:
        """The task's metrics per split, and each --eval-file's."""

        def run(model: nn.Module) -> tuple[Metrics, dict[str, dict]]:
            splits = {
                split: self.task.evaluate(model, split, self._batches(split, parts.device))
                for split in ("train", "val")
            }
            scored = {
                f.label: evaluate_file(model, self.tokenizer, self.meta, f.path, f.task, f.how).metrics
                for f in self.files
            }
            return splits, scored

        return self._on(parts, precision, run)

    def sample(self, parts: Parts, precision: Precision, step: int) -> tuple[str, str]:
        """One --sample-every sample (prompt, continuation) from the model as it is, with a
        generator of its own seeded by the step: training's random streams are left alone,
        so losses and weights stay the same with and without samples, and a resumed run
        draws the same ones."""
        from gptcli.infer.completion import complete

        assert self.prompt is not None
        prompt = self.prompt

        def run(model: nn.Module) -> Any:
            done = complete(model, self.tokenizer, prompt, max_new_tokens=self.cfg.sample_tokens,
                            seed=self.cfg.seed + step)  # fmt: skip
            return done[0].text

        return prompt.text, self._on(parts, precision, run)
