"""--tracker wandb: a Weights & Biases run per gptcli run, its files in RUN/wandb.

W&B's own settings apply (WANDB_PROJECT, default "gptcli"; WANDB_ENTITY; WANDB_MODE). Without
WANDB_MODE and without a W&B login (WANDB_API_KEY or ~/.netrc) it runs offline, never asks
for a key in the middle of a run: `wandb sync RUN/wandb/offline-run-*` uploads it later.

Metrics are named as in TensorBoard (train/loss, eval/val_loss, eval/files/NAME/ppl, ...),
plotted against gptcli's step ("step"); the config goes in as the run's config. The W&B run
id is kept in RUN/wandb/gptcli.json, so --resume continues the same W&B run. Offline, W&B
cannot tell which steps it already holds, so that file also keeps the last step logged of
each kind and the steps a crashed run replays are skipped.
"""

from __future__ import annotations

import json
import netrc
import os
import re
import uuid
from pathlib import Path
from typing import Any

import wandb  # ImportError without the wandb package

from gptcli.data.inputs import try_read_json
from gptcli.files import write_file
from gptcli.reports import EvalReport, Reporter, RunInfo, SampleReport, StepReport
from gptcli.trackers import eval_scalars, step_scalars

DIR = "wandb"
STATE = "gptcli.json"
FRESH = {"train": 0, "eval": -1, "sample": -1}  # the last step logged, per kind, of a new run


def _load_state(path: Path) -> dict[str, Any] | None:
    """The W&B run id and last steps this tracker saved; None for anything else (the id
    names W&B's directories, so only W&B's own alphabet is taken)."""
    try:
        saved = try_read_json(path)
        state = {"id": str(saved["id"]), "logged": {k: int(saved["logged"][k]) for k in FRESH}}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state if re.fullmatch(r"[a-z0-9]{1,64}", state["id"]) else None


def _logged_in() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        host = os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].rstrip("/")
        return netrc.netrc().authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandB(Reporter):
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.run_dir = Path(run_dir)
        self.dir = self.run_dir / DIR
        self.config = config
        self.run: Any = None
        self.state: dict[str, Any] = {}

    def on_start(self, info: RunInfo) -> None:
        self.dir.mkdir(exist_ok=True)
        saved = _load_state(self.dir / STATE) if info.start_step > 0 else None  # resumed: the same W&B run
        self.state = saved or {"id": uuid.uuid4().hex[:16], "logged": dict(FRESH)}
        mode = os.environ.get("WANDB_MODE") or ("online" if _logged_in() else "offline")
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "gptcli"),
            name=self.run_dir.name,
            id=self.state["id"],
            resume="allow",
            dir=str(self.run_dir),
            mode=mode,
            config=self.config,
            settings=wandb.Settings(silent=True, console="off"),  # the live view owns the terminal
        )
        self.run.define_metric("step")
        for prefix in ("train/*", "eval/*", "sample"):
            self.run.define_metric(prefix, step_metric="step")
        self._save()

    def _save(self) -> None:
        write_file(self.dir / STATE, json.dumps(self.state) + "\n")

    def _log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if self.run is None or step <= self.state["logged"][kind]:
            return  # logged before a crash, with these very values: resume replays them bit for bit
        self.run.log({"step": step, **values})
        self.state["logged"][kind] = step
        self._save()

    def on_step(self, r: StepReport) -> None:
        if r.loss is not None:
            self._log("train", r.step, step_scalars(r))

    def on_eval(self, r: EvalReport) -> None:
        self._log("eval", r.step, eval_scalars(r))

    def on_sample(self, r: SampleReport) -> None:
        self._log("sample", r.step, {"sample": r.prompt + r.text})

    def close(self) -> None:
        if self.run is not None:
            self.run.finish()
            self.run = None
