"""The commands users actually type: resume with the same command, the newest run that
fits the verb, true numbers on screen, hints that paste, output that goes away."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.helpers import ROOT, TINY, make_corpus, run, start

SHORT = [*TINY, "--max-iters", "10", "--eval-interval", "5"]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory) -> Path:
    """A run trained for 10 steps with TINY flags, plus the corpus and a config beside it."""
    tmp = tmp_path_factory.mktemp("resume")
    make_corpus(tmp / "corpus.txt")
    (tmp / "same.yaml").write_text("model:\n  n_layer: 1\n  n_embd: 32\ntrain:\n  lr: 3.0e-3\n")
    result = run("pretrain", tmp / "corpus.txt", "--out", tmp / "R", *SHORT)
    assert result.exit_code == 0, result.output
    return tmp


@pytest.mark.parametrize(
    ("extra", "refusal"),
    [
        ([], None),  # the very same command, plus --resume
        (["--max-iters", "15", "--eval-interval", "3", "--log-interval", "2"], None),  # budgets, reporting
        (["-c", "{tmp}/same.yaml"], None),  # a config file that repeats the run's values
        (["-t", "char"], None),
        (["--lr", "1e-2"], "train.lr (--lr) is 0.01, the run's is 0.003"),
        (["--n-layer", "2"], "model.n_layer (--n-layer) is 2, the run's is 1"),
        (["--dtype", "bf16"], "train.dtype (--dtype) is 'bf16', the run's is 'fp32'"),
        (["-t", "gpt2"], "data.tokenizer (--tokenizer) is 'gpt2', the run's is 'char'"),
        (
            ["--batch-size", "4", "--seed", "7"],
            "--batch-size) is 4, the run's is 8; train.seed (--seed) is 7",
        ),
    ],
    ids=["same", "budgets", "same-config", "same-tokenizer", "lr", "n-layer", "dtype", "tokenizer", "two"],
)
def test_resume_takes_the_same_command(first_run, tmp_path, extra, refusal):
    shutil.copytree(first_run / "R", tmp_path / "R")
    extra = [a.replace("{tmp}", str(first_run)) for a in extra]
    args = ["pretrain", first_run / "corpus.txt", "--out", tmp_path / "R", *SHORT, *extra, "--resume"]
    if "--max-iters" not in extra:
        args += ["--max-iters", "12"]
    result = run(*args)
    if refusal is None:
        assert result.exit_code == 0, result.output
        assert "resumed at 10" in result.output
    else:
        assert result.exit_code == 2, result.output
        line = result.output.strip()
        assert line.startswith("error: ") and "\n" not in line
        assert refusal in line and "a resumed run continues exactly" in line


def test_a_config_that_differs_is_named_on_resume(first_run, tmp_path):
    shutil.copytree(first_run / "R", tmp_path / "R")
    (tmp_path / "other.yaml").write_text("train:\n  warmup_iters: 50\n")
    result = run("pretrain", "--resume", "--out", tmp_path / "R", "-c", tmp_path / "other.yaml")
    assert result.exit_code == 2
    assert (
        f"train.warmup_iters (--warmup-iters) in {tmp_path / 'other.yaml'} is 50, the run's is 3"
        in result.output
    )


def test_the_run_header_says_how_the_global_batch_is_formed(first_run):
    lines = run(
        "pretrain", first_run / "corpus.txt", "--out", first_run / "B", *SHORT, "--grad-accum", "3"
    ).output
    assert "global batch = 8 x 3 = 384 tokens" in lines


def test_a_compiled_run_says_its_first_step_waits_for_the_compile():
    """torch.compile keeps the first step silent for up to minutes: the header says why."""
    from gptcli.cli.render.training import header
    from gptcli.reports import RunInfo

    info = RunInfo(Path("r"), "cpu", "CPU", "fp32", "fp32", 1000, 128, 8, 1, 1, 0, 100, None, True)
    assert "torch.compile (the first step and the first eval wait for its compile)" in header(info, "; ")[0]
    assert "compile" not in header(replace(info, compile=False), "; ")[0]


# --- the newest run that fits the verb -----------------------------------------------------


def test_verbs_without_ckpt_take_the_newest_run_that_fits(trained, tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    shutil.copytree(trained, runs / "lm")
    shutil.copytree(trained, runs / "cls")
    for name in ("best", "last"):  # a classifier, trained after the language model
        path = runs / "cls" / name / "checkpoint.json"
        path.write_text(
            json.dumps({**json.loads(path.read_text()), "task": "classify", "labels": ["a", "b"]})
        )
    later = (runs / "lm" / "last" / "checkpoint.json").stat().st_mtime + 10
    for name in ("best", "last"):
        os.utime(runs / "cls" / name / "checkpoint.json", (later, later))
    monkeypatch.chdir(tmp_path)
    for verb in (["sample", "-n", "3"], ["beam", "The", "-n", "2"], ["inspect-attn", "The"]):
        result = run(*verb)
        assert result.exit_code == 0, result.output
        assert "using the newest run: runs/lm (the newer runs/cls is not one)" in result.output
    result = run("classify", "The fox.")
    assert "using the newest classifier: runs/cls" in result.output
    (tmp_path / "labels.jsonl").write_text('{"text": "The fox.", "label": "a"}\n')
    (tmp_path / "held.txt").write_text("The fox dug a hole.\n")
    labelled = run("eval", "labels.jsonl").output  # (runs/cls is no real classifier: test_eval scores one)
    assert "using the newest classifier of labelled texts: runs/cls" in labelled
    result = run("eval", "held.txt")
    assert (
        result.exit_code == 0
        and "using the newest run: runs/lm (the newer runs/cls is not one)" in result.output
    )


# --- numbers on screen -----------------------------------------------------------------------


def test_mfu_never_exceeds_100_percent_and_a_low_peak_is_raised(tmp_path, monkeypatch):
    """A peak measured on a busy machine (here: absurdly low) is raised to what the run
    achieves, and remembered."""
    from gptcli import runtime

    monkeypatch.setattr(runtime, "measured_peak_flops", lambda device, dtype, seconds=0.5: 1e3)
    make_corpus(tmp_path / "c.txt")
    result = run("pretrain", tmp_path / "c.txt", "--out", tmp_path / "R", *SHORT, "--log-interval", "1")
    assert result.exit_code == 0, result.output
    mfus = [json.loads(x).get("mfu") for x in (tmp_path / "R" / "metrics.jsonl").read_text().splitlines()]
    mfus = [m for m in mfus if m is not None]
    assert mfus and max(mfus) <= 1.0 and max(mfus) == 1.0  # the first log step set the peak
    peaks = json.loads((runtime.cache_dir() / "peak_flops.json").read_text())
    assert max(peaks.values()) > 1e3


@pytest.mark.parametrize("stop", ["max-iters", "max-time"])
def test_the_last_step_is_logged_whatever_the_log_interval(tmp_path, stop):
    """The loss curve and the log end at the run's last step, not at the last multiple of
    --log-interval before it: at --max-iters, and where --max-time stops the run."""
    make_corpus(tmp_path / "c.txt")
    args = [*TINY, "--max-iters", "7", "--eval-interval", "100", "--log-interval", "5"]
    if stop == "max-time":
        args += ["--max-iters", "1000000", "--log-interval", "1000000", "--max-time", "2s"]
    result = run("pretrain", tmp_path / "c.txt", "--out", tmp_path / "R", *args)
    assert result.exit_code == 0, result.output
    records = [json.loads(x) for x in (tmp_path / "R" / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if r["kind"] == "train"]
    if stop == "max-iters":
        assert steps == [1, 5, 7]
    else:  # (the last eval is the stopped run's, at its last step)
        last = records[-1]
        assert last["kind"] == "eval" and last["step"] > 1 and steps == [1, last["step"]]
        assert records[-2]["kind"] == "train"  # its step logged before the eval at that step


def test_a_cached_peak_measured_on_a_busy_machine_is_raised_by_the_next_measurement():
    """The CPU's peak is cached; a first measurement made while the machine was busy (here:
    absurdly low) is probed again at the next run and raised, not kept for good."""
    from gptcli import runtime

    cpu = torch.device("cpu")
    first = runtime.measured_peak_flops(cpu, torch.float32, seconds=0.05)
    path = runtime.cache_dir() / "peak_flops.json"
    key = runtime._peak_key(cpu, torch.float32)
    assert json.loads(path.read_text()) == {key: first}
    path.write_text(json.dumps({key: 1e3}))  # as if measured while the machine was busy
    again = runtime.measured_peak_flops(cpu, torch.float32, seconds=0.05)
    assert again > 1e6 and json.loads(path.read_text()) == {key: again}
    path.write_text(json.dumps({key: 1e18}))  # a higher figure is kept: a busy probe lowers nothing
    assert runtime.measured_peak_flops(cpu, torch.float32, seconds=0.05) == 1e18
    assert json.loads(path.read_text()) == {key: 1e18}


@pytest.mark.parametrize(
    ("name", "dtype", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bf16", 989e12),
        ("NVIDIA H100 PCIe", "bf16", 756e12),  # the same family, another part
        ("NVIDIA A100-SXM4-40GB", "fp16", 312e12),
        ("NVIDIA A100-SXM4-80GB", "bf16", 312e12),
        ("NVIDIA A100 80GB PCIe", "bf16", 312e12),
        ("NVIDIA H100 NVL", "bf16", 835e12),
        ("NVIDIA H200", "bf16", 989e12),
        ("NVIDIA L4", "bf16", 121e12),
        ("NVIDIA GeForce RTX 4090", "bf16", 165e12),
        ("NVIDIA H100 80GB HBM3", "fp32", None),  # TF32 or not: no honest figure
        ("NVIDIA GeForce GTX 1080", "fp16", None),  # not in the table
        ("Some H100 lookalike", "bf16", None),
    ],
)
def test_gpu_peaks_come_from_the_exact_device_name(monkeypatch, name, dtype, peak):
    from gptcli.runtime import Precision, peak_flops

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0), Precision(dtype, "cuda", "")) == peak


def test_the_progress_bar_and_the_numbers_show_the_same_step():
    from rich.console import Console

    from gptcli.cli import render
    from gptcli.reports import RunInfo, StepReport

    view = render.TrainView("gptcli pretrain →")
    view.live.start = lambda *a, **k: None  # draw by hand, not from the refresh thread
    info = RunInfo(Path("r"), "cpu", "CPU", "fp32", "fp32", 1000, 128, 8, 1, 1, 0, 100, None, False)
    view.on_start(info)
    for step in range(1, 8):  # a log line only every 5 steps
        view.on_step(StepReport(step, 100, 18.0 * step, 1e-3, loss=2.0 if step % 5 == 0 else None))
    console = Console(width=120, record=True, color_system=None)
    console.print(view._render())
    text = console.export_text()
    assert "7/100" in text and "step 7" in text and "global batch = 8 x 1 = 128 tokens" in text
    assert "2:06 left" in text  # the run's elapsed time (126 s, not the wall clock), as the summary counts it
    assert "lr 1.00e-03" in text and "Muon" not in text  # an AdamW run
    view.on_step(StepReport(8, 100, 144.0, 1e-3, muon_lr=3e-2, loss=2.0))
    console.print(view._render())
    assert "Muon lr 3.00e-02" in console.export_text()  # a Muon run: its rate under AdamW's


def test_the_live_view_runs_in_a_terminal(tmp_path):
    """Under a terminal the live view draws (and Rich's stdout redirection does not loop)."""
    import pty

    make_corpus(tmp_path / "c.txt")
    primary, secondary = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "TERM": "xterm"}
    args = [sys.executable, "-m", "gptcli", "pretrain", "c.txt", "--out", "R", *SHORT]
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdin=secondary, stdout=secondary, stderr=secondary)
    os.close(secondary)
    out = b""
    while True:
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # the terminal closed: the process is gone
            break
        if not chunk:
            break
        out += chunk
    assert proc.wait(timeout=120) == 0, out[-2000:]
    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", out.decode("utf-8", "replace"))
    assert "10/10" in text and "training finished" in text and "step 10" in text


def test_the_summary_names_its_figures_as_the_log_does(first_run):
    out = run("pretrain", first_run / "corpus.txt", "--out", first_run / "S", *SHORT).output
    assert "(mean over the training steps)" in out
    assert "final eval train / val" in out


# --- hints to paste, and errors that say what is wrong -------------------------------------------


def test_hints_are_shell_quoted(tmp_path):
    make_corpus(tmp_path / "c.txt")
    out = tmp_path / "my run"
    result = run("pretrain", tmp_path / "c.txt", "--out", out, *SHORT)
    assert result.exit_code == 0
    assert f"next: gptcli sample --ckpt '{out}'" in result.output
    gone = run("pretrain", "--resume", "--out", out)
    shutil.rmtree(json.loads((out / "last" / "checkpoint.json").read_text())["data_dir"])
    gone = run("pretrain", "--resume", "--out", out, "--max-iters", "12")
    assert f"gptcli pretrain CORPUS --resume --out '{out}'" in gone.output


def test_a_tokenizer_path_that_does_not_exist_says_so():
    result = run("tokenize", "hello", "-t", "nowhere/tokenizer.json")
    assert result.exit_code == 2
    assert "tokenizer 'nowhere/tokenizer.json': no such file or directory" in result.output


# --- output that goes away --------------------------------------------------------------------


def test_training_survives_its_reader_going_away(tmp_path):
    """`gptcli pretrain ... | head -1`: the run carries on to its last step and saves it."""
    make_corpus(tmp_path / "c.txt")
    proc = start(
        ["pretrain", "c.txt", "--out", "R", *TINY, "--max-iters", "60", "--log-interval", "1"], tmp_path
    )
    proc.stdout.readline()
    proc.stdout.close()  # what head does after its line
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "training carries on without printing" in err
    saved = json.loads((tmp_path / "R" / "last" / "checkpoint.json").read_text())
    assert saved["step"] == 60


def test_other_verbs_stop_quietly_when_their_reader_goes_away(trained, tmp_path):
    proc = start(
        ["sample", "--ckpt", str(trained), "-n", "100", "--num-samples", "50", "--seed", "1"], tmp_path
    )
    proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=120) != 0
    assert err == ""


def test_the_live_chart_draws_a_long_run_at_the_width_of_the_screen():
    from gptcli.cli.render.training import Series, _step_ticks, loss_chart

    points = [(s, 3.0 * math.exp(-s / 10_000) + 1.0) for s in range(1, 50_001)]
    train = Series(points)
    steps, losses = train.downsample(200)
    assert len(steps) == len(losses) == 200
    assert steps[-1] == 50_000 and steps == sorted(steps)
    assert sum(losses) / 200 == pytest.approx(sum(v for _, v in points) / 50_000, rel=1e-3)
    assert Series(points[:50]).downsample(200) == ([s for s, _ in points[:50]], [v for _, v in points[:50]])
    ticks = _step_ticks(1, 50_000)
    assert all(isinstance(t, int) for t in ticks) and ticks == [10_000, 20_000, 30_000, 40_000, 50_000]
    assert _step_ticks(0, 7) == [0, 2, 4, 6]
    text = loss_chart(train, Series([(s, 1.5) for s in range(0, 50_001, 250)]), 100, 16).plain
    assert "loss: train (cyan), val (orange)" in text and "50000" in text and "5e+04" not in text
