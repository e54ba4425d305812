"""torchrun: two CPU processes (gloo), replicated (DDP) or sharded (FSDP), train exactly like
one process with the same global batch, and only rank 0 writes."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import failure, gptcli, make_corpus

TINY = [
    "--n-layer", "1", "--n-head", "2", "--n-embd", "32", "--block-size", "16", "--batch-size", "8",
    "--eval-interval", "10", "--eval-iters", "2", "--log-interval", "1", "--device", "cpu",
    "--dtype", "fp32", "--warmup-iters", "3", "--lr", "3e-3", "--optimizer", "adamw", "--grad-accum", "2",
]  # fmt: skip
# AdamW, for runs that must follow one process to 1e-5 (as they do, the same update from the same
# all-reduced gradient); Muon's test below allows for its Newton-Schulz iteration's precision
MUON = ["muon" if a == "adamw" else a for a in TINY]


def launch(args: list[str], cwd: Path, procs: int = 1):
    """gptcli in a child process (procs > 1: under torchrun), one thread per process."""
    return gptcli(args, cwd, procs, OMP_NUM_THREADS="1")


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("ddp")
    make_corpus(tmp / "c.txt", n_sentences=400)
    make_corpus(tmp / "held.txt", n_sentences=30, seed=3)
    choice = {"context": "The fox dug a", "choices": [" den", " hole"], "label": 0}
    (tmp / "mc.jsonl").write_text((json.dumps(choice) + "\n") * 3)
    # every rank joins the forward passes of eval files and samples
    files = [
        "--eval-file",
        "held.txt",
        "--eval-file",
        "mc.jsonl",
        "--sample-every",
        "10",
        "--sample-tokens",
        "6",
    ]
    for name, procs, extra in (("single", 1, []), ("ddp", 2, []), ("fsdp", 2, ["--fsdp"])):
        args = ["pretrain", "c.txt", "--out", name, *TINY, "--max-iters", "20", *files, *extra]
        result = launch(args, tmp, procs)
        assert result.returncode == 0, failure(result)
    # torchrun with the defaults: no --grad-accum, so one micro-step per process
    assert TINY[-2:] == ["--grad-accum", "2"]
    defaults = TINY[:-2]
    result = launch(["pretrain", "c.txt", "--out", "defaults", *defaults, "--max-iters", "20"], tmp, 2)
    assert result.returncode == 0, failure(result)
    (tmp / "defaults.out").write_text(result.stdout)
    return tmp


def assert_same_trajectory(single: list[dict], other: list[dict]) -> None:
    single, other = ([r for r in rs if r["kind"] != "sample"] for rs in (single, other))
    assert [(r["kind"], r["step"]) for r in single] == [(r["kind"], r["step"]) for r in other]
    for a, b in zip(single, other, strict=True):
        key = "loss" if a["kind"] == "train" else "val_loss"
        assert a[key] == pytest.approx(b[key], abs=1e-5), a["step"]
        if a["kind"] == "train":
            assert a["tokens"] == b["tokens"]  # the global batch: 8 x 2 micro-steps x 16 tokens
            if "grad_norm" in b:  # of the whole model, also when each process holds a shard
                assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4), a["step"]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_two_processes_follow_the_single_process_trajectory(runs, mode):
    assert_same_trajectory(records(runs / "single"), records(runs / mode))


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_eval_files_score_alike_replicated_or_sharded(runs, mode):
    evals = {name: [r for r in records(runs / name) if r["kind"] == "eval"] for name in ("single", mode)}
    assert [r["step"] for r in evals["single"]] == [r["step"] for r in evals[mode]] == [0, 10, 20]
    for one, two in zip(evals["single"], evals[mode], strict=True):
        assert one["files"]["held.txt"]["tokens"] == two["files"]["held.txt"]["tokens"] > 0
        assert one["files"]["held.txt"]["bpb"] == pytest.approx(two["files"]["held.txt"]["bpb"], abs=1e-5)
        assert one["files"]["mc.jsonl"] == two["files"]["mc.jsonl"]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_samples_are_drawn_alike_replicated_or_sharded(runs, mode):
    samples = {n: [r for r in records(runs / n) if r["kind"] == "sample"] for n in ("single", mode)}
    assert [r["step"] for r in samples["single"]] == [10, 20]
    assert samples["single"] == samples[mode]


def test_muon_replicated_follows_one_process(runs, tmp_path):
    """--optimizer muon under DDP: every replica orthogonalizes the same all-reduced
    gradient, so two processes take one process's steps (to the Newton-Schulz iteration's
    precision, bf16 where the CPU multiplies bf16 natively)."""
    (tmp_path / "c.txt").write_bytes((runs / "c.txt").read_bytes())  # its own dir: runs holds four
    for name, procs in (("single", 1), ("ddp", 2)):
        args = ["pretrain", "c.txt", "--out", name, *MUON, "--max-iters", "10"]
        result = launch(args, tmp_path, procs)
        assert result.returncode == 0, failure(result)
    single, ddp = records(tmp_path / "single"), records(tmp_path / "ddp")
    assert [(r["kind"], r["step"]) for r in single] == [(r["kind"], r["step"]) for r in ddp]
    for a, b in zip(single, ddp, strict=True):
        key = "loss" if a["kind"] == "train" else "val_loss"
        assert a[key] == pytest.approx(b[key], abs=1e-3), a["step"]
    from gptcli.store.checkpoint import load_train_state

    saved = load_train_state(tmp_path / "ddp" / "last")
    assert sorted(saved["muon"]["state"]) == ["0", "1", "2", "3"]  # the block's four matrices


def test_torchrun_with_the_defaults_trains_one_micro_step_per_process(runs):
    """No --grad-accum under torchrun: the global batch is one micro-batch per process, and
    the run follows one process given that batch (--grad-accum 2)."""
    assert (
        "global batch = 8 x 2 = 256 tokens (2 processes x 1 micro-step each)"
        in (runs / "defaults.out").read_text()
    )
    assert_same_trajectory(records(runs / "single"), records(runs / "defaults"))
    saved = json.loads((runs / "defaults" / "last" / "checkpoint.json").read_text())
    assert saved["config"]["train"]["grad_accum"] == 2  # resolved, so a resume continues alike


def test_mfu_counts_every_process(runs):
    """tokens/s is the whole job's, so MFU divides by every process's peak, not one's."""

    def flops_per_peak(run: str) -> float:  # mfu / tokens_per_s = FLOPs per token / peak
        return statistics.median(
            r["mfu"] / r["tokens_per_s"] for r in records(runs / run) if r["kind"] == "train"
        )

    assert flops_per_peak("ddp") / flops_per_peak("single") == pytest.approx(0.5, rel=0.05)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_only_rank_zero_writes(runs, mode):
    dirs = sorted(p.name for p in runs.iterdir() if p.is_dir() and p.name != "cache")
    assert dirs == ["ddp", "defaults", "fsdp", "single"]  # one run dir for the two processes
    assert sorted(p.name for p in (runs / mode).iterdir()) == [
        "best",
        "config.yaml",
        "last",
        "loss.png",
        "metrics.jsonl",
    ]
    state = json.loads((runs / mode / "last" / "train_state.json").read_text())
    assert state["world"] == 2 and len(state["torch_rng"]) == 2  # each rank's RNG, for exact resume


def test_sharded_checkpoints_hold_whole_weights(runs):
    """FSDP gathers every shard into last/: the same weights as one process trained, in the
    same layout, and AdamW state for the whole model."""
    from safetensors.torch import load_file

    from gptcli.store.checkpoint import load_checkpoint, load_train_state

    single, sharded = (load_file(runs / name / "last" / "model.safetensors") for name in ("single", "fsdp"))
    assert sorted(single) == sorted(sharded)
    for name, tensor in single.items():
        assert sharded[name].shape == tensor.shape
        torch.testing.assert_close(sharded[name], tensor, atol=1e-4, rtol=0)
    assert load_checkpoint(runs / "fsdp" / "last").model.config.n_layer == 1
    optim = (load_train_state(runs / name / "last")["optimizer"] for name in ("single", "fsdp"))
    a, b = optim
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        assert b["state"][k]["exp_avg"].shape == a["state"][k]["exp_avg"].shape
        torch.testing.assert_close(
            b["state"][k]["exp_avg_sq"], a["state"][k]["exp_avg_sq"], atol=1e-6, rtol=1e-3
        )


def test_sharded_run_resumes_exactly_sharded_or_not(runs, tmp_path):
    """--resume of an FSDP run continues its trajectory, with --fsdp or as plain DDP."""
    import shutil

    single = launch(["pretrain", "--resume", "--out", "single", "--max-iters", "25"], runs)
    assert single.returncode == 0, failure(single)
    expected = records(runs / "single")
    shutil.copytree(runs / "fsdp", tmp_path / "fsdp")
    shutil.copytree(runs / "fsdp", tmp_path / "as-ddp")
    for name, extra in (("fsdp", []), ("as-ddp", ["--no-fsdp"])):
        again = gptcli(
            ["pretrain", "--resume", "--out", name, "--max-iters", "25", *extra], tmp_path, procs=2
        )
        assert again.returncode == 0, failure(again)
        assert_same_trajectory(expected, records(tmp_path / name))


def test_sharded_finetuning_with_a_classifier_head(runs):
    """The classifier head lives in FSDP's root unit, outside the sharded blocks; with 4
    micro-steps each process accumulates two, reduce-scattering after each."""
    lines = (runs / "c.txt").read_text().splitlines()[:200]
    data = runs / "animals.jsonl"
    data.write_text("".join(json.dumps({"text": t, "label": t.split()[1]}) + "\n" for t in lines))
    flags = [*TINY[8:], "--max-iters", "6", "--eval-interval", "3", "--grad-accum", "4", "--task", "classify"]
    for name, procs, extra in (("ft-single", 1, []), ("ft-fsdp", 2, ["--fsdp"])):
        result = gptcli(
            ["finetune", "--ckpt", "single", "animals.jsonl", "--out", name, *flags, *extra], runs, procs
        )
        assert result.returncode == 0, failure(result)
    single, sharded = records(runs / "ft-single"), records(runs / "ft-fsdp")
    assert_same_trajectory(single, sharded)
    assert single[-1]["val_accuracy"] == pytest.approx(sharded[-1]["val_accuracy"])
    meta = json.loads((runs / "ft-fsdp" / "last" / "checkpoint.json").read_text())
    assert meta["model"]["n_classes"] == 6  # the six animals


def test_resume_needs_the_same_number_of_processes(runs):
    again = launch(["pretrain", "--resume", "--out", "ddp", "--max-iters", "25"], runs, procs=2)
    assert again.returncode == 0, failure(again)
    assert [r["step"] for r in records(runs / "ddp") if r["kind"] == "train"] == list(range(1, 26))
    alone = launch(["pretrain", "--resume", "--out", "ddp", "--max-iters", "30"], runs)
    assert alone.returncode == 2
    assert "trained by 2 process(es); resume it with the same number (now 1)" in alone.stderr


def test_other_ranks_leave_the_run_directory_alone(tmp_path, monkeypatch):
    """Ranks other than 0 finish training without writing loss.png (or anything else)."""
    from types import SimpleNamespace

    from gptcli.cli import figures, training

    (tmp_path / "metrics.jsonl").write_text('{"kind": "train", "step": 1, "loss": 1.0}\n')
    calls = []
    monkeypatch.setattr(figures, "save_loss_png", lambda *a: calls.append(a) or True)
    summary = SimpleNamespace(stop_reason="max_iters", steps=1)
    monkeypatch.setattr(training.render, "train_summary", lambda s, png: calls.append(("summary", png)))
    for rank in (1, 0):
        trainer = SimpleNamespace(
            dist=SimpleNamespace(is_main=rank == 0), run_dir=tmp_path, meta={},
            run=lambda resume, reporter: summary,
            config=SimpleNamespace(train=SimpleNamespace(trackers=[]), to_dict=dict),
        )  # fmt: skip
        training.run_trainer(trainer, resume=False, verb="pretrain")
    assert calls[0] == ("summary", None)  # rank 1: no figure
    assert calls[1][1] == tmp_path / "loss.png" and calls[2] == ("summary", str(tmp_path / "loss.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


@pytest.mark.parametrize(("rank", "printed"), [("0", '{"steps": 1}\n'), ("1", "")])
def test_only_rank_zero_prints_json(rank, printed):
    """--json under torchrun: one summary on stdout, not one per process."""
    code = "from gptcli.cli import render; render.print_json({'steps': 1})"
    env = {**os.environ, "RANK": rank}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert result.stdout == printed


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_lora_finetuning_replicated_or_sharded_follows_one_process(runs, mode):
    """Frozen base weights beside trained adapters and a head, in the same DDP replica or
    FSDP unit: the same trajectory as one process, and a checkpoint of adapters and head."""
    from safetensors import safe_open

    data = runs / "animals-lora.jsonl"
    lines = (runs / "c.txt").read_text().splitlines()[:120]
    data.write_text("".join(json.dumps({"text": t, "label": t.split()[1]}) + "\n" for t in lines))
    flags = [*TINY[8:], "--max-iters", "6", "--eval-interval", "3", "--task", "classify", "--lora-rank", "4"]
    for name, procs, extra in (
        ("lora-single", 1, []),
        (f"lora-{mode}", 2, ["--fsdp"] if mode == "fsdp" else []),
    ):
        if (runs / name).exists():
            continue  # the single-process run, made once for both modes
        result = gptcli(
            ["finetune", "--ckpt", "single", data.name, "--out", name, *flags, *extra], runs, procs
        )
        assert result.returncode == 0, failure(result)
    assert_same_trajectory(records(runs / "lora-single"), records(runs / f"lora-{mode}"))
    with safe_open(runs / f"lora-{mode}" / "last" / "model.safetensors", framework="pt") as f:
        saved = set(f.keys())
    assert saved and all(k.endswith((".lora_A", ".lora_B")) or k.startswith("classifier.") for k in saved)


SLOW_PREPARE = """
import os, sys, time
from gptcli.runtime import shared_setup

def prepare():
    if os.environ["LOCAL_RANK"] == "0" and not os.path.exists(sys.argv[2]):
        time.sleep(6)  # the first process tokenizes a large corpus...
        open(sys.argv[2], "w").close()  # ...into a cache the others then find
    return "ready"

try:
    print(shared_setup("cpu", prepare, timeout=float(sys.argv[1])))
except RuntimeError as e:
    print("timed out" if "imeout" in str(e) or "imed out" in str(e) else f"other: {e}")
"""


@pytest.mark.parametrize(("timeout", "expected"), [("2", "timed out")])
def test_the_group_waits_as_long_as_dist_timeout_says(tmp_path, timeout, expected):
    """While the first process prepares the data, the others wait in a collective: for
    --dist-timeout, not for the backend's default (gloo's 30 minutes, NCCL's 10): given 2 s,
    the waiting process gives up before the first is done (with the default, as every
    other torchrun test here shows, it waits)."""
    script = tmp_path / "slow.py"
    script.write_text(SLOW_PREPARE)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
           str(script), timeout, str(tmp_path / "cache")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run(
        cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path, check=False
    )
    printed = result.stdout.split()
    if expected == "ready":
        assert result.returncode == 0 and printed == ["ready", "ready"], failure(result)
    else:  # the waiting process gives up after 2 s, long before the first is done
        assert "timed out" in result.stdout or "imeout" in result.stderr, failure(result)


def test_fsdp_in_bf16_gathers_bf16_weights_and_follows_ddp(tmp_path):
    """--fsdp --dtype bf16: FSDP's mixed-precision policy gathers the weights in bf16 and
    reduces gradients in fp32 (the header says so); the losses stay with DDP's in bf16."""
    bf16 = [*("bf16" if a == "fp32" else a for a in TINY), "--max-iters", "8"]
    out = {}
    for name, extra in (("ddp", []), ("fsdp", ["--fsdp"])):
        corpus = tmp_path / "c.txt"
        if not corpus.exists():
            make_corpus(corpus, n_sentences=300)
        result = gptcli(["pretrain", str(corpus), "--out", name, *bf16, *extra], tmp_path, procs=2)
        assert result.returncode == 0, failure(result)
        out[name] = result.stdout + result.stderr
    assert "weights gathered in bf16 and gradients reduced in fp32" in out["fsdp"]
    assert "gathered in bf16" not in out["ddp"]
    ddp, fsdp = records(tmp_path / "ddp"), records(tmp_path / "fsdp")
    pairs = [(a["loss"], b["loss"]) for a, b in zip(ddp, fsdp, strict=True) if a["kind"] == "train"]
    assert len(pairs) == 8 and all(abs(a - b) < 2e-2 for a, b in pairs), pairs


COUNT_SYNCS = """
import os
import sys
from gptcli.config import flag_overrides
from gptcli.train.recipes import pretrain_trainer
from gptcli.runtime import Dist

calls = []
reduce = Dist.reduce
Dist.reduce = lambda self, t, op="avg": calls.append(op) or reduce(self, t, op)
flags = flag_overrides(
    n_layer=1, n_head=2, n_embd=32, block_size=16, batch_size=4, max_iters=int(sys.argv[2]),
    eval_interval=1000, eval_iters=1, log_interval=10, device="cpu", dtype="fp32",
    max_time=float(sys.argv[3]) if len(sys.argv) > 3 else None,
)
summary = pretrain_trainer([sys.argv[1]], flags=flags, out="r").run()
line = f"{summary.steps} {summary.stop_reason} {calls.count('max')} {calls.count('avg')}\\n"
os.write(1, line.encode())  # one write: the two processes' lines never interleave
"""


def test_processes_agree_on_stopping_once_per_log_interval(tmp_path):
    """The stop flags (a signal, --max-time) are all-reduced at log steps only, not every
    step; every process still stops at the same step."""
    script = tmp_path / "count.py"
    script.write_text(COUNT_SYNCS)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--standalone",
        str(script),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run(
        [*cmd, str(make_corpus(tmp_path / "c.txt", n_sentences=300)), "100000", "3"], capture_output=True,
        text=True, timeout=300, env=env,
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert result.returncode == 0, failure(result)
    lines = [line.split() for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0][:2] == lines[1][:2]  # the same step, the same reason
    steps, reason, agreements = int(lines[0][0]), lines[0][1], int(lines[0][2])
    # out of time after 3 s: noticed at a log step, by both; one agreement per 10 steps (the
    # old loop agreed at every step: steps + 1)
    assert reason == "max_time" and steps % 10 == 0 and steps >= 20 and agreements == steps // 10 + 1
