"""The training loop: schedule, optimizer groups, learning, checkpoints, exact resume."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from gptcli.config import Config, TrainConfig, flag_overrides, load_config
from gptcli.data.corpus import load_data_tokenizer, load_split, tokenize_corpus
from gptcli.model import GPT
from gptcli.reports import Reporter
from gptcli.runtime import seed_everything
from gptcli.store.checkpoint import load_checkpoint, load_train_state
from gptcli.tasks import LMTask
from gptcli.train.optim import Muon, block_matrices, describe_schedule, lr_at, make_optimizers, rates_at
from gptcli.train.trainer import Trainer
from tests.helpers import TINY, StopAt, assert_usage_error, digest, make_corpus, run


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


def test_muon_starts_at_its_peak_while_adamw_warms_up():
    """Muon's rate skips AdamW's warmup and otherwise sits at the same point of its own curve;
    train.muon_warmup_iters gives it a warmup of its own, and None (runs saved before the
    key) the old rate, AdamW's scaled, warmup included."""
    cfg = TrainConfig(optimizer="muon", lr=1e-3, min_lr=1e-4, warmup_iters=100, max_iters=1100, muon_lr=0.03)
    assert rates_at(0, cfg) == {"adamw": pytest.approx(1e-3 / 101), "muon": pytest.approx(0.03)}
    assert rates_at(99, cfg)["muon"] == pytest.approx(0.03)
    assert rates_at(100, cfg)["muon"] == pytest.approx(0.03)
    assert rates_at(600, cfg) == {"adamw": pytest.approx(5.5e-4), "muon": pytest.approx(0.03 * 0.55)}
    assert rates_at(1100, cfg)["muon"] == pytest.approx(3e-3)
    assert "warmup 100 steps (AdamW's; Muon starts at its peak), cosine" in describe_schedule(cfg)
    own = replace(cfg, muon_warmup_iters=20)
    assert rates_at(0, own)["muon"] == pytest.approx(0.03 / 21)
    assert rates_at(19, own)["muon"] == pytest.approx(0.03 * 20 / 21)
    assert rates_at(20, own) == rates_at(20, cfg)
    assert "warmup 100 steps (AdamW's; Muon's 20), cosine" in describe_schedule(own)
    old = replace(cfg, muon_warmup_iters=None)
    for step in (0, 49, 99, 100, 600, 1100):
        rates = rates_at(step, old)
        assert rates["muon"] == rates["adamw"] * 0.03 / 1e-3
        assert rates["adamw"] == lr_at(step, cfg)
    assert rates_at(600, old) == rates_at(600, cfg)
    assert "warmup 100 steps, cosine" in describe_schedule(old)
    assert "warmup 100 steps, cosine" in describe_schedule(replace(cfg, optimizer="adamw"))


def test_the_header_says_when_the_warmup_outlasts_the_run():
    """A run shorter than the default warmup never decays; the schedule line says so."""
    short = TrainConfig(warmup_iters=100, max_iters=60)
    assert lr_at(59, short) < short.lr  # still warming up at the last step
    for schedule in ("cosine", "wsd"):
        line = describe_schedule(replace(short, schedule=schedule))
        assert "rises to the last step and never decays: lower --warmup-iters (e.g. 6)" in line
    assert "never decays" not in describe_schedule(replace(short, warmup_iters=6))


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
    opts = make_optimizers(model, TrainConfig(weight_decay=0.1), torch.device("cpu"))
    assert list(opts) == ["adamw"]
    opt = opts["adamw"]
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


@pytest.mark.parametrize(
    ("dtype", "optimizer"), [("fp32", {}), ("bf16", {}), ("fp32", {"optimizer": "muon", "schedule": "wsd"})]
)
def test_resume_is_exact(data_dir, tmp_path, dtype, optimizer):
    """N steps straight == N/2 steps, stop, resume, N/2 steps: same losses, same weights
    (also with bf16 autocast, the default on CPUs with native bf16; and with Muon and the
    WSD schedule, whose decay begins after the resume)."""
    settings = dict(max_iters=40, eval_interval=10, log_interval=1, dropout=0.1, dtype=dtype, **optimizer)
    config = tiny_config(**settings)
    straight = build_trainer(data_dir, tmp_path / "straight", config)
    straight.run()

    stopper = StopAt(23)  # between evaluations, so the stop itself writes the checkpoint
    first = build_trainer(data_dir, tmp_path / "split", tiny_config(**settings))
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
    import gptcli.train.setup

    calls = []
    monkeypatch.setattr(gptcli.train.setup, "keep_freed_memory", lambda: calls.append(1) or True)
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


# --- Muon and the WSD schedule ---------------------------------------------------------------


def test_every_parameter_is_in_exactly_one_optimizer():
    """--optimizer muon: the blocks' attention and MLP matrices in Muon's group, everything
    else (tied embedding and head, positions, LayerNorms, biases, a task's head) in AdamW's."""
    cfg = tiny_config().model.__class__(
        vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=8, n_classes=3
    )
    model = GPT(cfg)
    opts = make_optimizers(model, TrainConfig(optimizer="muon"), torch.device("cpu"))
    assert list(opts) == ["adamw", "muon"] and isinstance(opts["muon"], Muon)
    name = {id(p): n for n, p in model.named_parameters()}
    held = {k: [name[id(p)] for g in o.param_groups for p in g["params"]] for k, o in opts.items()}
    every = held["adamw"] + held["muon"]
    assert sorted(every) == sorted(name.values()) and len(set(every)) == len(every)  # once each
    matrices = {f"transformer.h.{i}.{m}.weight" for i in range(2)
                for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")}  # fmt: skip
    assert set(held["muon"]) == matrices
    assert "transformer.wte.weight" in held["adamw"] and "transformer.wpe.weight" in held["adamw"]
    assert any(n.startswith("classifier.") for n in held["adamw"])
    assert [name[id(p)] for p in block_matrices(model)] == sorted(matrices, key=held["muon"].index)


def test_muon_step_is_torchs():
    """gptcli's Muon with its Newton-Schulz iteration in bf16 is torch.optim.Muon bit for
    bit; in fp32 (CPUs without native bf16) it takes the same steps to bf16's precision."""
    torch.manual_seed(0)
    start = [torch.randn(48, 16), torch.randn(16, 64)]

    def steps(make) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(w.clone()) for w in start]
        opt, gen = make(params), torch.Generator().manual_seed(1)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        return [p.detach() - w for p, w in zip(params, start, strict=True)]

    settings = dict(lr=0.02, momentum=0.95, weight_decay=0.01, adjust_lr_fn="original")
    torchs = steps(lambda ps: torch.optim.Muon(ps, **settings))
    ours = steps(lambda ps: Muon(ps, ns_dtype=torch.bfloat16, **settings))
    assert all(torch.equal(a, b) for a, b in zip(torchs, ours, strict=True))
    fp32 = steps(lambda ps: Muon(ps, ns_dtype=torch.float32, **settings))
    for a, b in zip(torchs, fp32, strict=True):
        assert torch.nn.functional.cosine_similarity(a.flatten(), b.flatten(), dim=0) > 0.999
        assert not torch.equal(a, b)


def test_wsd_schedule_and_its_stable_checkpoint(data_dir, tmp_path):
    """--schedule wsd: warmup, the peak until the last decay_fraction of the run, then a
    straight line to min_lr; Muon's rate follows, scaled to its own peak, without the
    warmup. The run keeps the checkpoint taken as the decay begins, training state
    included, as stable/."""
    run_dir = tmp_path / "run"
    config = tiny_config(max_iters=40, warmup_iters=5, log_interval=1, eval_interval=100, optimizer="muon",
                         schedule="wsd", decay_fraction=0.25, muon_lr=0.03)  # fmt: skip
    trainer = build_trainer(data_dir, run_dir, config)

    class MuonRates(Reporter):
        def __init__(self) -> None:
            self.rates: dict[int, float] = {}

        def on_step(self, report) -> None:
            self.rates[report.step] = trainer.parts.optimizers["muon"].param_groups[0]["lr"]

    muon = MuonRates()
    trainer.run(reporter=muon)
    lrs = {
        r["step"]: r["lr"] for r in train_records(run_dir) if r["kind"] == "train"
    }  # step k used lr_at(k-1)
    peak, floor = 3e-3, 3e-4
    assert all(muon.rates[k] == pytest.approx(0.03) for k in range(1, 32))  # no warmup: the peak
    assert all(muon.rates[k] == pytest.approx(lrs[k] * 0.03 / peak) for k in range(6, 41))
    logged = {r["step"]: r["muon_lr"] for r in train_records(run_dir) if r["kind"] == "train"}
    assert logged == {k: muon.rates[k] for k in range(1, 41)}  # metrics.jsonl keeps Muon's rate too
    assert lrs[5] == pytest.approx(peak * 5 / 6)  # the last warmup step
    assert lrs[6] == lrs[30] == lrs[31] == pytest.approx(peak)  # warmup over; the decay starts at step 30
    assert lrs[32] == pytest.approx(peak - (peak - floor) / 10)
    assert lrs[40] == pytest.approx(floor + (peak - floor) / 10)  # the last step, one tenth above min_lr
    assert all(a >= b for a, b in itertools.pairwise(list(lrs.values())[5:]))
    evals = [r["step"] for r in train_records(run_dir) if r["kind"] == "eval"]
    assert evals == [0, 30, 40]  # the decay's start is evaluated, to be kept
    assert load_train_state(run_dir / "stable")["state"]["step"] == 30
    assert load_train_state(run_dir / "stable")["state"]["decay_from"] is None
    assert json.loads((run_dir / "last" / "checkpoint.json").read_text())["decay_started"] == 30


def test_a_longer_wsd_run_continues_from_stable(tmp_path):
    """Resuming a WSD run whose decay has begun with a larger budget continues from
    stable/ at the constant rate and decays at the new end; best/ keeps the better model."""
    make_corpus(tmp_path / "c.txt")
    flags = list(TINY)  # warmup 3 steps, lr 3e-3
    flags[flags.index("--max-iters") + 1] = "20"
    flags[flags.index("--log-interval") + 1] = "1"
    first = run("pretrain", tmp_path / "c.txt", "--out", tmp_path / "run", *flags, "--schedule", "wsd")
    assert first.exit_code == 0, first.output
    best_before = json.loads((tmp_path / "run" / "best" / "checkpoint.json").read_text())["val_loss"]
    last_before = digest(tmp_path / "run" / "last" / "model.safetensors")
    more = run("pretrain", "--resume", "--out", tmp_path / "run", "--max-iters", "40", "--json")
    assert more.exit_code == 0, more.output
    assert "the run's decay began at step 16: the longer run continues from" in more.output
    assert f"{tmp_path / 'run' / 'last'} (step 20) stays until the run's next checkpoint" in more.output
    records = train_records(tmp_path / "run")
    lrs = [r["lr"] for r in records if r["kind"] == "train"]
    assert len(lrs) == 40  # steps 17..20 of the first decay were replaced
    assert lrs[3:33] == [pytest.approx(3e-3)] * 30 and lrs[-1] < lrs[33] < 3e-3  # decays from step 32 on
    assert load_train_state(tmp_path / "run" / "stable")["state"]["step"] == 32
    assert digest(tmp_path / "run" / "last" / "model.safetensors") != last_before
    vals = [r["val_loss"] for r in records if r["kind"] == "eval"] + [best_before]
    assert json.loads((tmp_path / "run" / "best" / "checkpoint.json").read_text())["val_loss"] == min(vals)


def test_a_wsd_run_fits_its_decay_to_max_time(tmp_path, monkeypatch):
    """--schedule wsd with --max-time: the decay starts as the last decay_fraction of the
    time begins (stable/ kept there) and is a straight line to the end of the time; a
    larger --max-time on resume continues from stable/ and decays at the new end. A clock
    that moves one second per step (and not while evaluating) makes the times exact."""
    import gptcli.train.trainer as train_module
    from gptcli.reports import StepReport

    clock = [1000.0]

    class TickingReport(StepReport):  # built once after every step
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            clock[0] += 1.0

    fake_time = type("FakeTime", (), {"perf_counter": staticmethod(lambda: clock[0])})
    monkeypatch.setattr(train_module, "time", fake_time)
    monkeypatch.setattr(train_module, "StepReport", TickingReport)
    make_corpus(tmp_path / "c.txt")
    flags = [*TINY, "--max-iters", "200", "--log-interval", "1", "--schedule", "wsd"]  # time ends first
    first = run("pretrain", tmp_path / "c.txt", "--out", tmp_path / "run", *flags,
                "--decay-fraction", "0.25", "--max-time", "40s", "--json")  # fmt: skip
    assert first.exit_code == 0, first.output
    assert json.loads(first.stdout)["steps"] == 40 and json.loads(first.stdout)["stop_reason"] == "max_time"

    def rates() -> dict[int, float]:  # step k trained at lr_at(k - 1)
        return {r["step"]: r["lr"] for r in train_records(tmp_path / "run") if r["kind"] == "train"}

    peak, floor, lrs = 3e-3, 1e-4, rates()
    assert lrs[3] == pytest.approx(peak * 3 / 4) and lrs[4] == lrs[31] == pytest.approx(peak)  # warmup 3
    assert lrs[36] == pytest.approx((peak + floor) / 2)  # half of the 10 s decay gone
    assert lrs[40] == pytest.approx(floor + (peak - floor) / 10)  # the last step
    assert load_train_state(tmp_path / "run" / "stable")["state"]["step"] == 30  # at 30 s of 40

    more = run("pretrain", "--resume", "--out", tmp_path / "run", "--max-time", "60s", "--json")
    assert more.exit_code == 0, more.output
    assert "the run's decay began at step 30: the longer run continues from" in more.output
    assert json.loads(more.stdout)["steps"] == 60
    lrs = rates()
    assert sorted(lrs) == list(range(1, 61))  # the first decay's steps were replaced
    assert all(lrs[k] == pytest.approx(peak) for k in range(4, 46))  # constant to 45 s of 60
    assert lrs[53] == pytest.approx(floor + (peak - floor) * 8 / 15)
    assert lrs[60] == pytest.approx(floor + (peak - floor) / 15)
    assert load_train_state(tmp_path / "run" / "stable")["state"]["step"] == 45


def test_refit_of_a_wsd_schedule():
    """A budget change in the constant phase moves the decay's start; in the decay, a
    shorter budget decays on from the current rate."""
    from gptcli.train.state import TrainState, refit_schedule

    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_iters=10, max_iters=100, schedule="wsd")
    constant = TrainState(step=50, schedule=[80, None])
    refit_schedule(constant, cfg)
    assert constant.decay_from is None and constant.schedule == [100, None]
    decaying = TrainState(step=70, schedule=[80, None], decay_from=[64, 1e-3, 0.0])
    refit_schedule(decaying, TrainConfig(**{**cfg.__dict__, "max_iters": 75}))
    assert decaying.decay_from[:2] == [70, pytest.approx(1e-3 - 0.9e-3 * 6 / 16)]


def test_optimizer_choices_are_refused_in_one_line(tmp_path, trained):
    """Changing the optimizer on --resume, Muon with --fsdp (new or resumed), and Muon with
    LoRA: each one line, before anything is written."""
    make_corpus(tmp_path / "c.txt")
    made = run("pretrain", tmp_path / "c.txt", "--out", tmp_path / "run", *TINY)  # Muon: the default
    assert made.exit_code == 0, made.output
    assert "Muon lr 0.03, momentum 0.95" in made.output and "AdamW lr 0.003: " in made.output
    meta = json.loads((tmp_path / "run" / "last" / "checkpoint.json").read_text())
    groups = meta["optimizers"]
    assert groups["muon"]["tensors"] == 4 and groups["muon"]["lr"] == 0.03 and groups["adamw"]["lr"] == 3e-3
    total = sum(p.numel() for p in load_checkpoint(tmp_path / "run").model.parameters())  # tied: once
    assert groups["muon"]["params"] + groups["adamw"]["params"] == total
    assert f"{total / 1e6:.2f}M parameters" in made.output.splitlines()[1]  # the header's count agrees
    before = digest(tmp_path / "run" / "last" / "model.safetensors")
    changed = run("pretrain", "--resume", "--out", tmp_path / "run", "--optimizer", "adamw")
    assert_usage_error(changed, "train.optimizer (--optimizer) is 'adamw', the run's is 'muon'")
    assert digest(tmp_path / "run" / "last" / "model.safetensors") == before
    resharded = run("pretrain", "--resume", "--out", tmp_path / "run", "--fsdp")  # may change, not with Muon
    assert_usage_error(resharded, "this run trains with Muon, which does not run under --fsdp", "without")
    assert digest(tmp_path / "run" / "last" / "model.safetensors") == before
    sharded = run("pretrain", tmp_path / "c.txt", "--out", tmp_path / "fsdp", "--optimizer", "muon", "--fsdp")
    assert_usage_error(sharded, "--optimizer muon does not run under --fsdp")
    lora = run("finetune", "--ckpt", trained, tmp_path / "c.txt", "--out", tmp_path / "lora",
               "--lora-rank", "4", "--optimizer", "muon")  # fmt: skip
    assert_usage_error(lora, "which LoRA keeps frozen; use --optimizer adamw")
    assert not (tmp_path / "fsdp").exists() and not (tmp_path / "lora").exists()
