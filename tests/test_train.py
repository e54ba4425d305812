"""The training loop: schedule, optimizer groups, learning, checkpoints, exact resume."""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
import torch

from gptcli.checkpoint import load_checkpoint, load_train_state
from gptcli.config import Config, TrainConfig, flag_overrides, load_config
from gptcli.data import load_data_tokenizer, load_split, tokenize_corpus
from gptcli.model import GPT
from gptcli.optim import lr_at, make_optimizer
from gptcli.reports import Reporter
from gptcli.runtime import seed_everything
from gptcli.tasks import LMTask
from gptcli.train import Trainer
from tests.helpers import make_corpus


def tiny_config(**train) -> Config:
    defaults = dict(
        n_layer=2, n_head=2, n_embd=32, block_size=16, dropout=0.1, batch_size=8, max_iters=40,
        eval_interval=20, eval_iters=2, log_interval=5, warmup_iters=5, lr=3e-3, min_lr=3e-4,
        device="cpu", dtype="fp32",
    )  # fmt: skip
    defaults.update(train)
    return load_config(None, flag_overrides(**defaults))


def build_trainer(data_dir: Path, run_dir: Path, config: Config) -> Trainer:
    tok = load_data_tokenizer(data_dir)
    config.model.vocab_size = tok.vocab_size
    task = LMTask(load_split(data_dir, "train"), load_split(data_dir, "val"), config.model.block_size)
    seed_everything(config.train.seed)
    model = GPT(config.model)
    return Trainer(model, tok, task, config, run_dir, {"task": "lm"})


@pytest.fixture
def data_dir(tmp_path) -> Path:
    out = tmp_path / "data"
    tokenize_corpus([make_corpus(tmp_path / "c.txt", n_sentences=300)], out, "char")
    return out


def train_records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def test_lr_schedule_at_known_steps():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=100, max_iters=1100)
    assert lr_at(0, cfg) == pytest.approx(1e-3 / 101)
    assert lr_at(49, cfg) == pytest.approx(1e-3 * 50 / 101)
    assert lr_at(100, cfg) == pytest.approx(1e-3)  # warmup done: the peak
    assert lr_at(600, cfg) == pytest.approx((1e-3 + 1e-4) / 2)  # half way down the cosine
    assert lr_at(1100, cfg) == pytest.approx(1e-4)
    assert lr_at(5000, cfg) == pytest.approx(1e-4)
    # a wall-clock budget pulls the schedule forward when it runs out first
    timed = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=0, max_iters=10_000, max_time=60.0)
    assert lr_at(10, timed, elapsed=30.0) == pytest.approx((1e-3 + 1e-4) / 2)
    assert lr_at(10, timed, elapsed=60.0) == pytest.approx(1e-4)


def test_lr_decays_on_from_where_a_changed_schedule_takes_over():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=60)
    now = lr_at(40, TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=40))
    assert now == pytest.approx(1e-4)  # the first plan ended here
    rates = [lr_at(step, cfg, decay_from=(40, now, 0.0)) for step in range(40, 61)]
    assert rates[0] == pytest.approx(now) and rates[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(rates))  # never back up the curve
    half = lr_at(35, cfg, decay_from=(10, 5e-4, 0.0))
    assert half == pytest.approx((5e-4 + 1e-4) / 2)  # half way from step 10 (at 5e-4) to step 60


def test_weight_decay_only_on_matrices():
    model = GPT(tiny_config().model.__class__(vocab_size=11, block_size=8, n_layer=1, n_head=1, n_embd=8))
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() == 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    n = sum(p.numel() for g in opt.param_groups for p in g["params"])
    assert n == sum(p.numel() for p in model.parameters())  # the tied embedding once
    assert opt.defaults["fused"]


def test_a_tiny_model_learns_a_tiny_corpus(data_dir, tmp_path):
    trainer = build_trainer(
        data_dir, tmp_path / "run", tiny_config(max_iters=150, eval_interval=150, dropout=0.0)
    )
    summary = trainer.run()
    evals = [r for r in train_records(tmp_path / "run") if r["kind"] == "eval"]
    start, end = evals[0]["val_loss"], evals[-1]["val_loss"]
    assert start == pytest.approx(math.log(trainer.tokenizer.vocab_size), rel=0.1)  # uniform at init
    assert end < 0.5 * start
    assert summary.stop_reason == "max_iters" and summary.steps == 150
    assert summary.best_val_loss == pytest.approx(end)


def test_run_dir_layout_and_checkpoint_reload(data_dir, tmp_path):
    run = tmp_path / "run"
    trainer = build_trainer(data_dir, run, tiny_config())
    trainer.run()
    assert (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file()
    for name in ("best", "last"):
        files = {p.name for p in (run / name).iterdir()}
        assert {"model.safetensors", "checkpoint.json", "tokenizer.json"} <= files
    assert {"train_state.safetensors", "train_state.json"} <= {p.name for p in (run / "last").iterdir()}
    meta = json.loads((run / "last" / "checkpoint.json").read_text())
    assert meta["format"] == "gptcli-checkpoint" and meta["version"] == 1 and meta["step"] == 40
    assert meta["tokenizer"] == "char" and meta["model"]["n_layer"] == 2
    assert load_config(run / "config.yaml") == trainer.config

    loaded = load_checkpoint(run / "last")
    x = torch.randint(0, trainer.tokenizer.vocab_size, (2, 16))
    trainer.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded.model(x)[0], trainer.model(x)[0], rtol=0, atol=0)
    assert loaded.tokenizer.encode("The fox") == trainer.tokenizer.encode("The fox")


class StopAt(Reporter):
    """Asks the trainer to stop after a given step, as Ctrl-C would."""

    def __init__(self, step: int) -> None:
        self.step, self.trainer = step, None

    def on_step(self, report) -> None:
        if report.step == self.step:
            self.trainer.request_stop()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_resume_is_exact(data_dir, tmp_path, dtype):
    """N steps straight == N/2 steps, stop, resume, N/2 steps: same losses, same weights
    (also with bf16 autocast, the default on CPUs with native bf16)."""
    config = tiny_config(max_iters=40, eval_interval=10, log_interval=1, dropout=0.1, dtype=dtype)
    straight = build_trainer(data_dir, tmp_path / "straight", config)
    straight.run()

    stopper = StopAt(23)  # between evaluations, so the stop itself writes the checkpoint
    first = build_trainer(
        data_dir, tmp_path / "split", tiny_config(max_iters=40, eval_interval=10, log_interval=1, dtype=dtype)
    )
    stopper.trainer = first
    assert first.run(reporter=stopper).stop_reason == "interrupted"
    assert load_train_state(tmp_path / "split" / "last")["state"]["step"] == 23

    resumed_model = load_checkpoint(tmp_path / "split" / "last").model.train()
    second = Trainer(resumed_model, first.tokenizer, first.task, config, tmp_path / "split", {"task": "lm"})
    second.run(resume=True)

    a, b = train_records(tmp_path / "straight"), train_records(tmp_path / "split")
    strip = [{k: v for k, v in r.items() if k not in ("elapsed", "tokens_per_s", "mfu")} for r in a]
    assert strip == [{k: v for k, v in r.items() if k not in ("elapsed", "tokens_per_s", "mfu")} for r in b]
    for (name, p), q in zip(
        straight.model.state_dict().items(), second.model.state_dict().values(), strict=True
    ):
        assert torch.equal(p, q), name


def test_metrics_have_no_duplicates_after_resume(data_dir, tmp_path):
    run = tmp_path / "run"
    first = build_trainer(data_dir, run, tiny_config(max_iters=30, eval_interval=10, log_interval=1))
    stopper = StopAt(20)  # exactly at an evaluation step
    stopper.trainer = first
    first.run(reporter=stopper)
    second = Trainer(
        load_checkpoint(run / "last").model.train(), first.tokenizer, first.task,
        tiny_config(max_iters=30, eval_interval=10, log_interval=1), run, {"task": "lm"},
    )  # fmt: skip
    second.run(resume=True)
    records = train_records(run)
    steps = [r["step"] for r in records if r["kind"] == "train"]
    assert steps == list(range(1, 31))
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 10, 20, 30]


def test_resuming_with_more_steps_continues_the_decay(data_dir, tmp_path):
    run = tmp_path / "run"
    first = build_trainer(data_dir, run, tiny_config(max_iters=30, eval_interval=10, log_interval=1))
    first.run()
    for more in (50, 70):  # twice: the second resume decays on from the first one's plan
        longer = tiny_config(max_iters=more, eval_interval=10, log_interval=1)
        Trainer(
            load_checkpoint(run / "last").model.train(), first.tokenizer, first.task, longer, run,
            {"task": "lm"},
        ).run(resume=True)  # fmt: skip
    lrs = [r["lr"] for r in train_records(run) if r["kind"] == "train"]
    assert len(lrs) == 70
    after_warmup = lrs[5:]
    assert all(a >= b for a, b in itertools.pairwise(after_warmup))
    assert lrs[29] == pytest.approx(3e-4, rel=0.05) and lrs[-1] == pytest.approx(3e-4, rel=0.05)


def test_max_time_stops_the_run(data_dir, tmp_path):
    trainer = build_trainer(data_dir, tmp_path / "run", tiny_config(max_iters=100_000, max_time=1.0))
    summary = trainer.run()
    assert summary.stop_reason == "max_time"
    assert 0 < summary.steps < 100_000
    assert (tmp_path / "run" / "last" / "checkpoint.json").is_file()


def test_cpu_training_keeps_freed_memory(data_dir, tmp_path, monkeypatch):
    """The allocator setting that spares every CPU step its page faults is applied (what it
    does is checked in test_runtime)."""
    import gptcli.train

    calls = []
    monkeypatch.setattr(gptcli.train, "keep_freed_memory", lambda: calls.append(1) or True)
    build_trainer(data_dir, tmp_path / "run", tiny_config(max_iters=2, eval_interval=2)).run()
    assert calls == [1]


def test_corpus_shorter_than_a_block_is_refused():
    import numpy as np

    from gptcli.errors import UsageError

    with pytest.raises(UsageError, match="train split has 30 tokens, fewer than block_size"):
        LMTask(np.arange(30, dtype=np.uint16), np.arange(100, dtype=np.uint16), 64)


def test_checkpoint_files_get_the_usual_permissions(data_dir, tmp_path):
    """Weights are as readable as the other files (for runs on shared storage)."""
    build_trainer(data_dir, tmp_path / "run", tiny_config(max_iters=2, eval_interval=2)).run()
    probe = tmp_path / "probe"
    probe.write_text("")
    usual = probe.stat().st_mode & 0o777
    for name in ("last", "best"):
        modes = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "run" / name).iterdir()}
        assert modes and set(modes.values()) == {usual}, modes


class _Heard(Reporter):
    def __init__(self, log: list, name: str, fail_close: bool = False) -> None:
        self.log, self.name, self.fail_close = log, name, fail_close

    def on_start(self, info) -> None:
        self.log.append((self.name, "start", info.max_iters))

    def on_step(self, report) -> None:
        self.log.append((self.name, "step", report.step))

    def on_eval(self, report) -> None:
        self.log.append((self.name, "eval", report.step))

    def on_end(self, summary) -> None:
        self.log.append((self.name, "end", summary.steps))

    def close(self) -> None:
        self.log.append((self.name, "close", None))
        if self.fail_close:
            raise RuntimeError("screen gone")


def test_several_reporters_hear_the_same_run(data_dir, tmp_path):
    from gptcli.reports import Reporters

    log: list = []
    trainer = build_trainer(data_dir, tmp_path / "run", tiny_config(max_iters=10, eval_interval=5))
    with pytest.raises(RuntimeError, match="screen gone"):  # a failing close does not skip the next
        trainer.run(reporter=Reporters(_Heard(log, "view", fail_close=True), _Heard(log, "tracker")))
    view = [e[1:] for e in log if e[0] == "view"]
    assert view == [e[1:] for e in log if e[0] == "tracker"]
    assert view[0] == ("start", 10) and view[-2:] == [("end", 10), ("close", None)]
    assert ("step", 5) in view and ("eval", 10) in view


def test_gradient_norm_is_logged_without_changing_training(data_dir, tmp_path):
    """Every log step records the gradient norm before clipping; measuring it when nothing
    is clipped (--grad-clip 0) leaves the weights bit-identical."""
    runs = {}
    for name, log_interval in (("every", 1), ("rare", 7)):
        trainer = build_trainer(
            data_dir, tmp_path / name, tiny_config(max_iters=14, grad_clip=0.0, log_interval=log_interval)
        )
        trainer.run()
        runs[name] = trainer
    a, b = (dict(t.model.state_dict()) for t in runs.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    logged = [r for r in train_records(tmp_path / "every") if r["kind"] == "train"]
    assert len(logged) == 14 and all(r["grad_norm"] > 0 and math.isfinite(r["grad_norm"]) for r in logged)
    rare = [r["grad_norm"] for r in train_records(tmp_path / "rare") if r["kind"] == "train"]
    assert rare == [logged[0]["grad_norm"], logged[6]["grad_norm"], logged[13]["grad_norm"]]
    clipped = build_trainer(
        data_dir, tmp_path / "clipped", tiny_config(max_iters=3, grad_clip=0.1, log_interval=1)
    )
    clipped.run()
    norms = [r["grad_norm"] for r in train_records(tmp_path / "clipped") if r["kind"] == "train"]
    assert norms[0] == pytest.approx(logged[0]["grad_norm"])  # before clipping: the same first step
    assert norms[0] > 0.1


def test_samples_while_training_leave_training_alone(data_dir, tmp_path):
    """--sample-every draws with a generator of its own: losses and weights are the same
    with and without samples, and a resumed run draws the samples a straight run does."""
    plain = build_trainer(data_dir, tmp_path / "plain", tiny_config(max_iters=20))
    plain.run()
    sampled = build_trainer(
        data_dir, tmp_path / "sampled", tiny_config(max_iters=20, sample_every=5, sample_tokens=8)
    )
    sampled.run()
    a, b = plain.model.state_dict(), sampled.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    strip = [
        {k: v for k, v in r.items() if k not in ("elapsed", "tokens_per_s", "mfu")}
        for r in train_records(tmp_path / "plain")
    ]
    records = train_records(tmp_path / "sampled")
    assert [
        {k: v for k, v in r.items() if k not in ("elapsed", "tokens_per_s", "mfu")}
        for r in records
        if r["kind"] != "sample"
    ] == strip
    samples = [r for r in records if r["kind"] == "sample"]
    assert [r["step"] for r in samples] == [5, 10, 15, 20] and all(len(r["text"]) > 0 for r in samples)

    config = tiny_config(max_iters=20, sample_every=5, sample_tokens=8)
    first, stopper = build_trainer(data_dir, tmp_path / "resumed", config), StopAt(12)
    stopper.trainer = first
    assert first.run(reporter=stopper).stop_reason == "interrupted"
    model = load_checkpoint(tmp_path / "resumed" / "last").model.train()
    Trainer(model, first.tokenizer, first.task, config, tmp_path / "resumed", {"task": "lm"}).run(resume=True)
    resumed = [r for r in train_records(tmp_path / "resumed") if r["kind"] == "sample"]
    assert [(r["step"], r["text"]) for r in resumed] == [(r["step"], r["text"]) for r in samples]
