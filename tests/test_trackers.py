"""Experiment trackers hold what metrics.jsonl holds, each step once, across --resume."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.helpers import TINY, assert_usage_error, make_corpus, run

pytest.importorskip("tensorboard")


def scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def records(run_dir: Path, kind: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


ARGS = [*TINY, "--log-interval", "1", "--eval-interval", "5", "--tracker", "tensorboard"]


def test_tensorboard_holds_what_metrics_jsonl_holds(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "c.txt", n_sentences=200)
    make_corpus(tmp_path / "held.txt", n_sentences=10, seed=2)
    result = run("pretrain", "c.txt", "--out", "r", *ARGS, "--max-iters", "10", "--eval-file", "held.txt")
    assert result.exit_code == 0, result.output
    tb = scalars(Path("r"))
    train, evals = records(Path("r"), "train"), records(Path("r"), "eval")
    for key in ("loss", "lr", "grad_norm"):
        assert [s for s, _ in tb[f"train/{key}"]] == [r["step"] for r in train]
        assert [v for _, v in tb[f"train/{key}"]] == pytest.approx([r[key] for r in train], rel=1e-6)
    for key in ("val_loss", "train_loss", "val_bpb"):
        assert [s for s, _ in tb[f"eval/{key}"]] == [r["step"] for r in evals]
        assert [v for _, v in tb[f"eval/{key}"]] == pytest.approx([r[key] for r in evals], rel=1e-6)
    ppl = [r["files"]["held.txt"]["ppl"] for r in evals]
    assert [v for _, v in tb["eval/files/held.txt/ppl"]] == pytest.approx(ppl, rel=1e-6)


def test_a_resumed_run_has_each_step_once(tmp_path, monkeypatch):
    """A crash after step 13 was logged but before its checkpoint: the resumed run replays
    steps 11 to 13, and TensorBoard keeps only the replayed ones."""
    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "c.txt", n_sentences=200)
    assert run("pretrain", "c.txt", "--out", "r", *ARGS, "--max-iters", "10").exit_code == 0
    shutil.copytree("r/last", "last-at-10")
    assert run("pretrain", "c.txt", "--out", "r", *ARGS, "--max-iters", "13", "--resume").exit_code == 0
    shutil.rmtree("r/last")
    shutil.copytree("last-at-10", "r/last")  # as if the run died before saving step 13
    again = run("pretrain", "c.txt", "--out", "r", *ARGS, "--max-iters", "20", "--resume")
    assert again.exit_code == 0, again.output
    tb, train = scalars(Path("r")), records(Path("r"), "train")
    assert [s for s, _ in tb["train/loss"]] == list(range(1, 21)) == [r["step"] for r in train]
    assert [v for _, v in tb["train/loss"]] == pytest.approx([r["loss"] for r in train], rel=1e-6)
    assert [s for s, _ in tb["eval/val_loss"]] == [0, 5, 10, 15, 20]


def test_unknown_and_missing_trackers_get_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "c.txt", n_sentences=100)
    assert_usage_error(
        run("pretrain", "c.txt", "--out", "r", *TINY, "--tracker", "nope"), "--tracker 'nope'", "tensorboard"
    )
    import builtins

    real_import = builtins.__import__

    def without_tensorboard(name, *args, **kwargs):
        if name.startswith(("tensorboard", "torch.utils.tensorboard")):
            raise ImportError(f"No module named {name!r}", name="tensorboard")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", without_tensorboard)
    monkeypatch.delitem(__import__("sys").modules, "gptcli.trackers.tensorboard", raising=False)
    result = run("pretrain", "c.txt", "--out", "r", *TINY, "--tracker", "tensorboard")
    assert_usage_error(result, "pip install 'gptcli[tensorboard]'")
    assert not Path("r").exists()


def mlflow_history(run_dir: Path, key: str) -> list[tuple[int, float]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{run_dir.resolve() / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("gptcli").experiment_id])
    return sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, key))


def test_mlflow_holds_metrics_and_config_and_a_resume_adds_each_step_once(tmp_path, monkeypatch):
    """A crash after step 18 was logged but before its checkpoint: the resumed run replays
    steps 16 to 20 bit for bit, and MLflow skips those it already holds."""
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    from gptcli.config import flag_overrides
    from gptcli.recipes import pretrain_trainer, resume_pretraining
    from gptcli.reports import Reporter, Reporters
    from gptcli.trackers.mlflow import MLflow

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    make_corpus(tmp_path / "c.txt", n_sentences=200)
    flags = flag_overrides(
        n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=8, max_iters=20, eval_interval=5,
        eval_iters=2, log_interval=1, device="cpu", dtype="fp32", warmup_iters=3, lr=3e-3,
    )  # fmt: skip

    class KeepLast(Reporter):  # what a crash would leave: the checkpoint of step 15
        def on_checkpoint(self, name: str, path: Path, step: int) -> None:
            if name == "last" and step == 15:
                shutil.copytree(path, tmp_path / "last-at-15")

    trainer = pretrain_trainer(["c.txt"], flags=flags, out="r")
    trainer.run(reporter=Reporters(KeepLast(), MLflow(trainer.run_dir, trainer.config.to_dict())))
    first = records(Path("r"), "train")
    shutil.rmtree("r/last")
    shutil.copytree(tmp_path / "last-at-15", "r/last")
    again = resume_pretraining("r", flags=flags)
    again.run(resume=True, reporter=MLflow(again.run_dir, again.config.to_dict()))
    train = records(Path("r"), "train")
    assert [(r["step"], r["loss"]) for r in train] == [(r["step"], r["loss"]) for r in first]  # bit for bit
    logged = mlflow_history(Path("r"), "train/loss")
    assert [s for s, _ in logged] == list(range(1, 21))
    assert [v for _, v in logged] == pytest.approx([r["loss"] for r in train], rel=1e-6)
    assert [s for s, _ in mlflow_history(Path("r"), "eval/val_loss")] == [0, 5, 10, 15, 20]
    client = MlflowClient(tracking_uri=f"sqlite:///{(tmp_path / 'r' / 'mlflow.db').resolve()}")
    (run,) = client.search_runs([client.get_experiment_by_name("gptcli").experiment_id])
    assert run.data.params["model.n_layer"] == "1" and run.data.params["train.lr"] == "0.003"
    assert not Path("mlruns").exists()  # nothing written outside the run directory
