"""`gptcli pretrain` and `gptcli sample` end to end through Typer's CliRunner."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import TINY, assert_usage_error, make_corpus, run


def test_pretrain_writes_a_run_and_reports(tmp_path):
    corpus = make_corpus(tmp_path / "animals.txt")
    result = run("pretrain", corpus, "--out", tmp_path / "run", *TINY)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "eval step 0:" in out and "eval step 30:" in out  # plain lines outside a terminal
    assert "step 30/30 | loss" in out and "tok/s" in out
    assert "training finished" in out and "best val loss" in out
    assert "fp32: as requested" in out
    run_dir = tmp_path / "run"
    for name in ("config.yaml", "metrics.jsonl", "best/model.safetensors", "last/train_state.json"):
        assert (run_dir / name).exists(), name
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "eval"] == [0, 15, 30]
    assert all(k in records[1] for k in ("loss", "lr", "tokens_per_s", "tokens"))
    last = [r for r in records if r["kind"] == "train"][-1]  # Muon, the default: both rates shown
    assert f"step 30/30 | loss {last['loss']:.4f} | lr {last['lr']:.2e} (Muon {last['muon_lr']:.2e}) |" in out
    meta = json.loads((run_dir / "last" / "checkpoint.json").read_text())
    assert meta["config"]["model"]["n_layer"] == 1 and meta["tokenizer"] == "char"

    # the same corpus again: the cached tokens are reused, not written again
    cache = Path(os.environ["GPTCLI_CACHE_DIR"]) / "tokens"
    entries = {p: p.stat().st_mtime_ns for p in cache.glob("*/train.bin")}
    adamw = ["--max-iters", "1", "--optimizer", "adamw", "--muon-lr", "0.02"]
    again = run("pretrain", corpus, "--out", tmp_path / "run2", *TINY, *adamw)
    assert again.exit_code == 0, again.output
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*/train.bin")} == entries
    assert "(Muon" not in again.output and "muon_lr" not in (tmp_path / "run2" / "metrics.jsonl").read_text()
    assert "--muon-lr is not used: it goes with --optimizer muon, and this run has --optimizer adamw" in (
        again.output
    )

    # --resume with a larger budget continues from step 30
    more = run("pretrain", "--resume", "--out", run_dir, "--max-iters", "40")
    assert more.exit_code == 0, more.output
    assert "resumed at 30" in more.output and "step 40/40" in more.output


def test_pretrain_on_a_tokenized_dir(tmp_path):
    corpus = make_corpus(tmp_path / "c.txt")
    assert run("tokenize", corpus, "--out", tmp_path / "tok", "-t", "gpt2").exit_code == 0
    result = run("pretrain", tmp_path / "tok", "--out", tmp_path / "run", *TINY, "--max-iters", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "run" / "last" / "checkpoint.json").read_text())["tokenizer"] == "gpt2"
    summary = json.loads(result.stdout)  # --json: only the summary on stdout, progress on stderr
    assert summary["steps"] == 2 and summary["stop_reason"] == "max_iters"
    assert summary["checkpoints"]["best"] == str(tmp_path / "run" / "best")
    assert summary["last_eval_step"] == 2 and summary["best_val_loss"] == summary["last_eval"]["val"]["loss"]
    assert "step 1/2 | loss" in result.stderr and "eval step 2:" in result.stderr
    assert_usage_error(
        run("pretrain", tmp_path / "tok", "--out", tmp_path / "r2", "-t", "char", *TINY),
        "tokenized with gpt2, not char",
    )


def test_pretrain_with_a_config_file_and_flags(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        "model:\n  n_layer: 1\n  n_head: 1\n  n_embd: 16\n  block_size: 8\ntrain:\n  max_iters: 3\n"
    )
    corpus = make_corpus(tmp_path / "c.txt")
    result = run(
        "pretrain", corpus, "-c", cfg, "--out", tmp_path / "run", "--n-embd", "24", "--eval-iters", "1"
    )
    assert result.exit_code == 0, result.output
    saved = (tmp_path / "run" / "config.yaml").read_text()
    assert "n_embd: 24" in saved and "n_layer: 1" in saved and "max_iters: 3" in saved


def test_pretrain_refuses_to_overwrite_a_run(tmp_path, trained):
    corpus = make_corpus(tmp_path / "c.txt")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "notes.txt").write_text("mine")
    assert_usage_error(
        run("pretrain", corpus, "--out", tmp_path / "run", *TINY), "already holds other files (not a run)"
    )
    assert (tmp_path / "run" / "notes.txt").read_text() == "mine"
    assert_usage_error(run("pretrain", corpus, "--out", tmp_path / "run" / "notes.txt", *TINY), "is a file")
    assert_usage_error(run("pretrain", corpus, "--out", trained, *TINY), "already holds a run", "--resume")
    assert_usage_error(run("pretrain"), "give the text to train on")
    (tmp_path / "cls.yaml").write_text("model:\n  n_classes: 3\n")
    refused = run("pretrain", corpus, "--out", tmp_path / "new", "-c", tmp_path / "cls.yaml", *TINY)
    assert_usage_error(refused, "model.n_classes 3: pretraining trains a language model")
    assert not (tmp_path / "new").exists()


def test_sample_json_and_greedy_is_deterministic(trained):
    a = json.loads(run("sample", "--ckpt", trained, "-p", "The ", "-n", "12", "--temp", "0", "--json").output)
    b = json.loads(run("sample", "--ckpt", trained, "-p", "The ", "-n", "12", "--temp", "0", "--json").output)
    assert a == b
    assert a["prompt"] == "The " and len(a["samples"]) == 1
    sample = a["samples"][0]
    assert len(sample["ids"]) == 12 and sample["finish"] == "length"
    assert set(sample) == {"text", "ids", "finish"}


def test_sample_several_with_seed_and_stop(trained):
    args = ["sample", "--ckpt", trained, "-p", "The", "-n", "40", "--num-samples", "3", "--seed", "7"]
    a = json.loads(run(*args, "--stop", ".", "--json").output)
    b = json.loads(run(*args, "--stop", ".", "--json").output)
    assert a == b and len(a["samples"]) == 3
    for s in a["samples"]:
        assert "." not in s["text"]
    plain = run(*args)
    assert plain.exit_code == 0 and "sample 3" in plain.output
    # sample i draws from its own generator seeded 7 + i - 1: what that seed gives alone
    for i in range(3):
        alone = ["sample", "--ckpt", trained, "-p", "The", "-n", "40", "--seed", str(7 + i), "--json"]
        with_stop = json.loads(run(*alone, "--stop", ".").output)["samples"][0]
        assert with_stop == a["samples"][i]


def test_ctrl_c_shows_the_samples_so_far_and_exits_130(trained, monkeypatch):
    """Ctrl-C during a sample that is not streamed (several samples, a pipe, --json): the text
    generated so far is printed, with a warning, and the exit status is 130."""
    from gptcli.infer import completion

    real = completion.generate

    def interrupted_after_5(*args, **kwargs):
        for i, step in enumerate(real(*args, **kwargs)):
            if i == 5:
                raise KeyboardInterrupt
            yield step

    monkeypatch.setattr(completion, "generate", interrupted_after_5)
    args = ["sample", "--ckpt", trained, "-p", "The", "-n", "1000", "--num-samples", "2", "--seed", "7"]
    result = run(*args, "--json")
    assert result.exit_code == 130 and "warning: interrupted after 5 tokens a sample" in result.stderr
    samples = json.loads(result.stdout)["samples"]
    assert [len(s["ids"]) for s in samples] == [5, 5] and {s["finish"] for s in samples} == {"interrupted"}
    plain = run(*args)
    assert plain.exit_code == 130 and "sample 2" in plain.stdout and samples[1]["text"] in plain.stdout
    assert "--stream shows one sample" in run(*args, "--stream").stderr  # (it would not stream 2)


def test_sample_show_probs_marks_the_chosen_token(trained):
    result = run(
        "sample", "--ckpt", trained, "-p", "The rabbit dug a", "-n", "2", "--show-probs", "3", "--temp", "0"
    )
    assert result.exit_code == 0, result.output
    assert "The rabbit dug a →" in result.output and "◀" in result.output and "prob" in result.output
    data = json.loads(
        run("sample", "--ckpt", trained, "-p", "The", "-n", "3", "--show-probs", "4", "--json").output
    )
    steps = data["samples"][0]["top_k"]
    assert len(steps) == 3 and len(steps[0]["candidates"]) == 4
    probs = [c["prob"] for c in steps[0]["candidates"]]
    assert probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001


def test_show_probs_gives_the_distribution_sampling_draws_from(trained):
    """With --temp and --top-k, q (what a token is drawn from) is shown beside the model's
    p: q ∝ p^(1/T) over the top-k, zero outside it."""
    args = ["sample", "--ckpt", trained, "-p", "The", "-n", "4", "--show-probs", "5", "--seed", "3"]
    data = json.loads(run(*args, "--temp", "0.5", "--top-k", "3", "--json").output)
    for step in data["samples"][0]["top_k"]:
        cands = step["candidates"]
        p = [c["prob"] for c in cands]
        want = [x ** (1 / 0.5) for x in p[:3]]
        assert [c["q"] for c in cands[:3]] == pytest.approx([w / sum(want) for w in want], abs=1e-4)
        assert [c["q"] for c in cands[3:]] == [0.0, 0.0]
        assert step["chosen"]["q"] > 0  # the drawn token was possible under q
    table = run(*args, "--temp", "0.5", "--top-k", "3").output
    assert "p: model, q: drawn from (T=0.5, top-k 3)" in table
    plain = json.loads(run(*args, "--json").output)  # temperature 1, no filter: q is p
    assert all("q" not in c for s in plain["samples"][0]["top_k"] for c in s["candidates"])


def test_sample_uses_the_newest_run(trained, tmp_path):
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert_usage_error(run("sample"), "no model that writes text found under ./runs", "gptcli pretrain")
        (tmp_path / "runs").mkdir()
        os.symlink(trained, tmp_path / "runs" / "mine")
        result = run("sample", "-n", "5", "--seed", "1")
        assert result.exit_code == 0, result.output
        assert "using the newest run: runs/mine" in result.output
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--temp", "-1"], "--temp must be >= 0, got -1.0"),
        (["--temp", "nan"], "--temp must be a finite number >= 0, got nan"),
        (["--seed", "99999999999999999999"], "--seed must be in [0, 9223372036854775807]"),
        (["--prompt-file", "/"], "--prompt-file /: a directory, not a file"),
        (["--top-p", "0"], "--top-p must be in (0, 1]"),
        (["--top-p", "1.5"], "--top-p must be in (0, 1]"),
        (["--top-k", "0"], "--top-k must be >= 1"),
        (["-p", "Zebra ~ 東京"], "not in this char tokenizer's vocabulary"),
        (["--prompt-file", "/nonexistent/prompt.txt"], "no such file"),
    ],
)
def test_sample_bad_input(trained, args, message):
    assert_usage_error(run("sample", "--ckpt", trained, *args), message)


def test_sample_warns_and_truncates_a_long_prompt(trained):
    result = run("sample", "--ckpt", trained, "-p", "The fox dug a den. " * 5, "-n", "2")
    assert result.exit_code == 0
    assert "more than the model's block_size 16; kept its last 16" in result.output


def test_sampling_on_the_cpu_never_imports_dynamo(trained):
    """A second of every start went to importing torch._dynamo, which the CPU never uses: the
    model was laid out on the meta device, whose random draws import it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from gptcli.cli.app import app\n"
        "try:\n"
        f"    app(['sample', '--ckpt', {str(trained)!r}, '-n', '2', '--temp', '0'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print('DYNAMO', 'torch._dynamo' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "DYNAMO False" in proc.stdout
