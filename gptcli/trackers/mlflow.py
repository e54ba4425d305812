"""--tracker mlflow: an MLflow run per gptcli run, in a SQLite store in the run directory
(RUN/mlflow.db) unless MLFLOW_TRACKING_URI names another; experiment "gptcli" unless
MLFLOW_EXPERIMENT_NAME names one. Offline by default.

Metrics are named as in TensorBoard (train/loss, eval/val_loss, eval/files/NAME/ppl, ...),
the config goes in as parameters. The MLflow run is tagged with the run directory, so
--resume continues the same MLflow run; the steps a crashed run had logged after its last
checkpoint are replayed bit for bit, so those already in the store are skipped.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Any

from mlflow.entities import Metric, Param  # ImportError without the mlflow package
from mlflow.tracking import MlflowClient

from gptcli.errors import UsageError
from gptcli.reports import EvalReport, Reporter, RunInfo, StepReport
from gptcli.trackers import eval_scalars, step_scalars

# creating the store's tables logs INFO lines (MLflow's and alembic's) among gptcli's own
for _name in ("mlflow", "alembic"):
    logging.getLogger(_name).setLevel(logging.WARNING)

STORE = "mlflow.db"
TAG = "gptcli.run_dir"


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = str(value)[:500]  # MLflow's limit on a parameter's value
    return out


# a server that does not answer is said in seconds, not after minutes of silent retries
# (MLflow's defaults: 7 retries with backoff, 120 s each); the user's own settings win
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "2")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "20")
REACH_TIMEOUT = 5.0  # seconds to wait for a tracking server at start


def check_reachable(uri: str, timeout: float = REACH_TIMEOUT) -> None:
    """Refuse, at once, a tracking server (an http(s) URI) that cannot be reached. Any
    answer will do: only a refused connection, a timeout or an unknown host fail."""
    import urllib.error
    import urllib.request

    if not uri.lower().startswith(("http://", "https://")):
        return
    try:
        urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout).close()
    except urllib.error.HTTPError:
        return  # it answered
    except (urllib.error.URLError, OSError, ValueError) as e:
        reason = getattr(e, "reason", e)
        why = getattr(reason, "strerror", None) or str(reason) or "no answer"
        raise UsageError(
            f"--tracker mlflow: the MLflow server at {uri} cannot be reached ({why}); start it, or unset "
            f"MLFLOW_TRACKING_URI to log into the run directory ({STORE})"
        ) from None


class MLflow(Reporter):
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        self.run_dir = Path(run_dir).resolve()
        self.config = config
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{self.run_dir / STORE}"
        check_reachable(uri)
        self.client = MlflowClient(tracking_uri=uri)
        self.run_id: str | None = None
        self.logged = {"train": 0, "eval": -1}  # the last step already in the store, per kind

    def on_start(self, info: RunInfo) -> None:
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "gptcli")
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        found = self.client.search_runs([experiment_id], filter_string=f"tags.`{TAG}` = '{self.run_dir}'")
        if found:  # the same gptcli run, resumed
            self.run_id = found[0].info.run_id
            for kind, key in (("train", "train/loss"), ("eval", "eval/val_loss")):
                steps = [m.step for m in self.client.get_metric_history(self.run_id, key)]
                self.logged[kind] = max(steps, default=self.logged[kind])
            return
        run = self.client.create_run(experiment_id, run_name=self.run_dir.name, tags={TAG: str(self.run_dir)})
        self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in _flat(self.config).items()]
        for start in range(0, len(params), 100):  # MLflow takes at most 100 parameters per call
            self.client.log_batch(self.run_id, params=params[start : start + 100])

    def _log(self, kind: str, step: int, values: dict[str, Any]) -> None:
        if self.run_id is None or step <= self.logged[kind]:
            return  # already in the store from before a crash, with these very values
        now = int(time.time() * 1000)
        metrics = [
            Metric(key, float(v), now, step)
            for key, v in values.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool)
        ]
        self.client.log_batch(self.run_id, metrics=metrics)

    def on_step(self, r: StepReport) -> None:
        if r.loss is not None:
            self._log("train", r.step, step_scalars(r))

    def on_eval(self, r: EvalReport) -> None:
        self._log("eval", r.step, eval_scalars(r))

    def close(self) -> None:
        if self.run_id is not None:
            self.client.set_terminated(self.run_id)
