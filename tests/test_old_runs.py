"""Runs made by an earlier release (tests/fixtures/v0.1.0: no data hash, grad_accum saved as
1, no optimizer saved (AdamW, before Muon became pretrain's default), a classifier whose
validation split was the plain random holdout) still load, sample, classify and resume
with their old behaviour."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from gptcli.tasks import holdout
from tests.helpers import StopAt, checkpoint_meta, make_corpus, run

FIXTURE = Path(__file__).parent / "fixtures" / "v0.1.0"


@pytest.fixture
def old(tmp_path, monkeypatch) -> Path:
    shutil.copytree(FIXTURE, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    return tmp_path / "old"


def meta(run: Path) -> dict:
    return json.loads((run / "last" / "checkpoint.json").read_text())


def test_an_old_run_samples_and_classifies(old):
    result = run("sample", "--ckpt", "lm-run", "-n", "5", "--seed", "1", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["samples"][0]["ids"]) == 5
    result = run("classify", "--ckpt", "cls-run", "The fox dug a hole.", "--json")
    assert result.exit_code == 0, result.output
    assert set(json.loads(result.stdout)["predictions"][0]["probs"]) == {"badger", "fox", "mole", "rabbit"}


def test_an_old_pretraining_run_resumes_and_then_records_its_data(old):
    assert "data_sha256" not in checkpoint_meta(old / "lm-run")
    for name in ("last", "best"):  # its tokens were in a cache of another machine
        path = old / "lm-run" / name / "checkpoint.json"
        path.write_text(json.dumps({**json.loads(path.read_text()), "data_dir": str(old / "gone")}))
    gone = run("pretrain", "--resume", "--out", "lm-run", "--max-iters", "9")
    assert gone.exit_code == 2 and "pass the corpus again" in gone.output
    result = run("pretrain", "corpus.txt", "--resume", "--out", "lm-run", "--max-iters", "9")
    assert result.exit_code == 0, result.output
    assert "resumed at 6" in result.output
    saved = checkpoint_meta(old / "lm-run")
    assert saved["step"] == 9 and saved["config"]["train"]["grad_accum"] == 1
    # it trained with AdamW before --optimizer existed, and goes on so under Muon's default
    assert (
        "optimizer"
        not in json.loads((FIXTURE / "lm-run" / "last" / "checkpoint.json").read_text())["config"]["train"]
    )
    assert saved["config"]["train"]["optimizer"] == "adamw" and "AdamW lr" in result.output
    assert len(saved["data_sha256"]) == 64  # recorded from now on


def test_an_old_classifier_resumes_with_its_plain_holdout(old, monkeypatch):
    import gptcli.tasks.split as tasks

    used = []
    monkeypatch.setattr(tasks, "holdout", lambda *a: used.append(a) or holdout(*a))
    assert "split" not in checkpoint_meta(old / "cls-run")
    result = run("finetune", "--resume", "--out", "cls-run", "--max-iters", "9")
    assert result.exit_code == 0, result.output
    assert "resumed at 6" in result.output
    assert used  # the random holdout it was made with, not the stratified one of new runs
    assert checkpoint_meta(old / "cls-run")["step"] == 9


def test_a_muon_run_saved_before_its_later_keys_resumes_as_it_trained(tmp_path):
    """Muon runs of the first release iterated Newton-Schulz torch's 5 times and warmed Muon's
    rate up with AdamW's, and saved neither train.muon_ns_steps nor train.muon_warmup_iters;
    resumed (here inside the warmup), such a run goes on with 5 and the warmup (new runs take
    4 and none), and its config says so: its weights equal a straight run's with those
    settings (torch's saved optimizer state carries the count as well)."""
    from gptcli.config import flag_overrides
    from gptcli.train.recipes import pretrain_trainer, resume_pretraining

    corpus = make_corpus(tmp_path / "c.txt", n_sentences=200)
    flags = flag_overrides(n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=8, max_iters=12,
                           eval_interval=6, eval_iters=2, log_interval=1, warmup_iters=10, device="cpu",
                           dtype="fp32", optimizer="muon")  # fmt: skip
    then = {**flags, "train": {**flags["train"], "muon_ns_steps": 5, "muon_warmup_iters": None}}
    straight = pretrain_trainer([corpus], out=tmp_path / "straight", flags=then)
    straight.run()
    first = pretrain_trainer([corpus], out=tmp_path / "old", flags=then)
    stopper = StopAt(8)  # between evaluations, in the warmup: the stop itself writes last/
    stopper.trainer = first
    first.run(reporter=stopper)
    assert checkpoint_meta(tmp_path / "old")["step"] == 8
    for name in ("last", "best"):  # as the first release saved it
        path = tmp_path / "old" / name / "checkpoint.json"
        saved = json.loads(path.read_text())
        del saved["config"]["train"]["muon_ns_steps"], saved["config"]["train"]["muon_warmup_iters"]
        path.write_text(json.dumps(saved))
    resumed = resume_pretraining(tmp_path / "old")
    resumed.run(resume=True)
    assert resumed.parts.optimizers["muon"].param_groups[0]["ns_steps"] == 5
    kept = checkpoint_meta(tmp_path / "old")["config"]["train"]  # from now on
    assert kept["muon_ns_steps"] == 5 and kept["muon_warmup_iters"] is None
    after = resumed.model.state_dict().values()
    for (name, p), q in zip(straight.model.state_dict().items(), after, strict=True):
        assert torch.equal(p, q), name
    new = pretrain_trainer([corpus], out=tmp_path / "new", flags=flags).config.train
    assert new.muon_ns_steps == 4 and new.muon_warmup_iters == 0


BEFORE_ARCHITECTURE = Path(__file__).parent / "fixtures" / "f9949f5"


def test_runs_made_before_the_architecture_step_load_and_resume(tmp_path, monkeypatch):
    """A Muon WSD run and a classifier made by the code before the packages and the declared
    verbs: they sample and classify, and both resume (the Muon state, the WSD schedule's
    stable/ and the classifier's AdamW state restored) and train on."""
    shutil.copytree(BEFORE_ARCHITECTURE, tmp_path / "old")
    monkeypatch.chdir(tmp_path / "old")
    sampled = run("sample", "--ckpt", "lm-run", "-n", "5", "--seed", "1", "--json")
    assert sampled.exit_code == 0, sampled.output
    assert len(json.loads(sampled.stdout)["samples"][0]["ids"]) == 5
    classified = run("classify", "--ckpt", "cls-run", "The fox dug a hole.", "--json")
    assert classified.exit_code == 0, classified.output
    assert set(json.loads(classified.stdout)["predictions"][0]["probs"]) == {
        "badger",
        "fox",
        "mole",
        "rabbit",
    }
    # a longer WSD run whose decay began at step 5 goes back to stable/ (step 5)
    for verb, name, at in (("pretrain", "lm-run", 5), ("finetune", "cls-run", 6)):
        extra = ["corpus.txt"] if verb == "pretrain" else []
        result = run(verb, *extra, "--resume", "--out", name, "--max-iters", "9")
        assert result.exit_code == 0, result.output
        assert f"resumed at {at}" in result.output
        assert checkpoint_meta(Path(name))["step"] == 9
    assert checkpoint_meta(Path("lm-run"))["config"]["train"]["optimizer"] == "muon"
