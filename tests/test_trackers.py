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
    for key in ("loss", "lr", "muon_lr", "grad_norm"):  # a Muon run, pretrain's default
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
    from gptcli.reports import Reporter, Reporters
    from gptcli.trackers.mlflow import MLflow
    from gptcli.train.recipes import pretrain_trainer, resume_pretraining

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


def wandb_records(run_dir: Path) -> list:
    """Every record W&B wrote offline for this run, in order (each resume is a new
    offline-run directory). A .wandb file is a 7-byte header, then LevelDB's log format:
    32 KiB blocks of chunks (crc32, length, type: 1 whole, 2 first, 3 middle, 4 last)."""
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for path in sorted(run_dir.glob("wandb/offline-run-*/run-*.wandb")):
        data, pos, block, pending = path.read_bytes(), 7, 32768, b""
        assert data[:4] == b":W&B"
        while pos + 7 <= len(data):
            if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
                pos += block - pos % block
                continue
            length, kind = int.from_bytes(data[pos + 4 : pos + 6], "little"), data[pos + 6]
            chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
            if kind == 0 and length == 0:
                break  # zero-filled tail
            pending = chunk if kind in (1, 2) else pending + chunk
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(pending)
                out.append(record)
    return out


def wandb_history(run_dir: Path) -> list[dict]:
    return [
        {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item}
        for r in wandb_records(run_dir)
        if r.WhichOneof("record_type") == "history"
    ]


def test_wandb_offline_holds_metrics_and_config_and_a_resume_continues_the_same_run(tmp_path, monkeypatch):
    """Offline W&B, crash after step 13 was logged but before its checkpoint: the resumed run
    is the same W&B run, and the replayed steps 11 to 13 are not logged twice."""
    pytest.importorskip("wandb")
    monkeypatch.chdir(tmp_path)
    for key in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_PROJECT", "WANDB_DIR"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc login: offline by itself
    make_corpus(tmp_path / "c.txt", n_sentences=200)
    args = [*TINY, "--log-interval", "1", "--eval-interval", "5", "--tracker", "wandb"]
    sample = ["--sample-every", "5", "--sample-prompt", "The ", "--sample-tokens", "4"]
    assert run("pretrain", "c.txt", "--out", "r", *args, *sample, "--max-iters", "10").exit_code == 0
    shutil.copytree("r/last", "last-at-10")
    assert run("pretrain", "c.txt", "--out", "r", *args, "--max-iters", "13", "--resume").exit_code == 0
    shutil.rmtree("r/last")
    shutil.copytree("last-at-10", "r/last")  # as if the run died before saving step 13
    again = run("pretrain", "c.txt", "--out", "r", *args, "--max-iters", "20", "--resume")
    assert again.exit_code == 0, again.output

    runs = {r.run.run_id for r in wandb_records(Path("r")) if r.WhichOneof("record_type") == "run"}
    assert len(list(Path("r").glob("wandb/offline-run-*"))) == 3 and len(runs) == 1  # one W&B run
    history, train = wandb_history(Path("r")), records(Path("r"), "train")
    logged = [(h["step"], h["train/loss"]) for h in history if "train/loss" in h]
    assert [s for s, _ in logged] == list(range(1, 21)) == [r["step"] for r in train]
    assert [v for _, v in logged] == pytest.approx([r["loss"] for r in train], rel=1e-6)
    # the run that stopped at 13 evaluated there; W&B cannot drop it as TensorBoard's purge does
    assert [h["step"] for h in history if "eval/val_loss" in h] == [0, 5, 10, 13, 15, 20]
    samples = [(h["step"], h["sample"]) for h in history if "sample" in h]
    assert [s for s, _ in samples] == [5, 10, 15, 20] and all(t.startswith("The ") for _, t in samples)
    config = next(r.run.config for r in wandb_records(Path("r")) if r.WhichOneof("record_type") == "run")
    values = {u.key: json.loads(u.value_json) for u in config.update}
    assert values["model"]["n_layer"] == 1 and values["train"]["trackers"] == ["wandb"]
    assert not Path("wandb").exists()  # nothing written outside the run directory


def test_mlflow_s_store_set_up_prints_nothing_among_gptcli_s_lines(tmp_path):
    """Creating the store's tables logged MLflow's and alembic's INFO lines on stderr (a
    process of its own: their handlers hold the stderr of the process they start in)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("mlflow")
    from tests.helpers import ROOT

    make_corpus(tmp_path / "c.txt", n_sentences=100)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GPTCLI_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("MLFLOW_TRACKING_URI", None)
    args = [*TINY, "--max-iters", "2", "--tracker", "mlflow"]
    done = subprocess.run(
        [sys.executable, "-m", "gptcli", "pretrain", "c.txt", "--out", "r", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "r" / "mlflow.db").is_file()
    assert "INFO" not in done.stderr and "alembic" not in done.stderr, done.stderr
