"""Shared fixtures: tiny models, tiny corpora, an isolated cache, Hugging Face references."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

from tests.helpers import TINY, make_conversations, make_corpus, run

# pytest-xdist's workers share the machine's cores: each runs torch, and the C kernel (which
# takes torch's thread count), on its share of them (OpenMP threads that outnumber the cores
# spin against each other); the child processes tests start inherit it. A test that needs
# several threads asks for them (test_kernels' two_threads).
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, _cores // _WORKERS))


@pytest.fixture(autouse=True)
def _isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """No test reads or writes the user's caches, and none may reach the network."""
    cache = tmp_path_factory.mktemp("gptcli-cache")
    monkeypatch.setenv("GPTCLI_CACHE_DIR", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "120")


@pytest.fixture(scope="session", autouse=True)
def _decoding_kernel(tmp_path_factory: pytest.TempPathFactory) -> None:
    """The CPU decoding kernel built once for the whole run (all workers share the directory)
    and ready before the first test, so no test's tokens depend on when a build ends."""
    from gptcli.infer import kernels

    shared = tmp_path_factory.getbasetemp().parent / "gptcli-kernels"
    os.environ["GPTCLI_KERNELS_DIR"] = str(shared)
    kernels.LIBRARY.start()
    kernels.LIBRARY.wait()


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return make_corpus(tmp_path / "corpus.txt")


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """A directory that build(tmp) fills, built once for the whole run: the first worker (of
    pytest-xdist's) to ask builds it while the others wait, then each gets a copy of its own,
    as if it had built it (the same files: the builds are deterministic)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's directory, above each worker's own
    home = shared / f"built-{name}"
    with FileLock(f"{home}.lock"):
        if not (home / ".done").is_file():
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir()
            build(home)
            (home / ".done").touch()
    mine = tmp_path_factory.mktemp(name)
    shutil.copytree(home, mine, dirs_exist_ok=True)
    return mine


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One small char-level run trained through the CLI, shared by the decoding tests."""
    return built_once(tmp_path_factory, "trained", _train) / "run"


def _train(tmp: Path) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTCLI_CACHE_DIR", str(tmp / "cache"))
    try:
        corpus = make_corpus(tmp / "animals.txt", n_sentences=300)
        # AdamW in fp32 trains the same model on every CPU; Muon's Newton-Schulz iteration runs
        # in bf16 where the CPU has it and in fp32 elsewhere, and the decoding tests expect
        # what this model says (e.g. that beams reach "because")
        args = ["pretrain", str(corpus), "--out", str(tmp / "run"), *TINY]
        args += ["--max-iters", "120", "--optimizer", "adamw"]
        result = run(*args)
        assert result.exit_code == 0, result.output
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def chat_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small char-level chat model: pretrained on make_corpus, then finetuned with --task
    chat on make_conversations until it answers them (greedy replies end at <|im_end|>)."""
    return built_once(tmp_path_factory, "chat", _train_chat) / "chat"


def _train_chat(tmp: Path) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTCLI_CACHE_DIR", str(tmp / "cache"))
    fast = [
        "--device",
        "cpu",
        "--dtype",
        "fp32",
        "--optimizer",
        "adamw",
        "--eval-iters",
        "2",
        "--log-interval",
        "50",
    ]
    try:
        corpus = make_corpus(tmp / "animals.txt", n_sentences=600)
        result = run(
            "pretrain", corpus, "--out", tmp / "pre", "--n-layer", "2", "--n-head", "2", "--n-embd", "48",
            "--block-size", "96", "--batch-size", "16", "--max-iters", "150", "--eval-interval", "150",
            "--lr", "3e-3", "--warmup-iters", "10", *fast,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
        talk = make_conversations(tmp / "talk.jsonl")
        result = run(
            "finetune", "--ckpt", tmp / "pre", talk, "--task", "chat", "--out", tmp / "chat",
            "--max-iters", "200", "--eval-interval", "200", "--batch-size", "16", "--lr", "3e-3",
            "--warmup-iters", "10", *fast,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def gpt2_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small model with GPT-2's tokenizer, trained on make_corpus until its next-token
    distributions are peaked (greedy decoding has no near-ties to flip)."""
    return built_once(tmp_path_factory, "gpt2-run", _train_gpt2) / "run"


def _train_gpt2(tmp: Path) -> None:
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTCLI_CACHE_DIR", str(tmp / "cache"))
    try:
        corpus = make_corpus(tmp / "animals.txt", n_sentences=600)
        result = run(
            "pretrain", corpus, "--tokenizer", "gpt2", "--out", tmp / "run", "--n-layer", "2",
            "--n-head", "2", "--n-embd", "64", "--block-size", "32", "--batch-size", "8",
            "--max-iters", "150", "--eval-interval", "150", "--eval-iters", "2", "--lr", "1e-2",
            "--warmup-iters", "10", "--device", "cpu", "--dtype", "fp32", "--optimizer", "adamw",
            "--log-interval", "50",
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def hf_gpt2():
    """A factory for small random Hugging Face GPT-2 models (skipped without transformers)."""
    transformers = pytest.importorskip("transformers")
    import torch

    def build(n_layer=2, n_head=4, n_embd=32, vocab_size=97, n_positions=64, seed=0):
        torch.manual_seed(seed)
        cfg = transformers.GPT2Config(
            n_layer=n_layer,
            n_head=n_head,
            n_embd=n_embd,
            vocab_size=vocab_size,
            n_positions=n_positions,
            bos_token_id=vocab_size - 1,
            eos_token_id=vocab_size - 1,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
        )
        model = transformers.GPT2LMHeadModel(cfg).eval()
        # HF's init (std 0.02, unit LayerNorms, zero biases) keeps activations so close to 0
        # that a wrong GELU or a missing bias would hide below 1e-5: use larger random
        # values everywhere so that every parameter and non-linearity shows in the logits
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".ln_" in name and name.endswith("weight"):
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                else:
                    p.copy_(0.15 * torch.randn_like(p))
        return model

    return build


def pytest_report_header(config: pytest.Config) -> str:
    return f"gptcli tests; cpu count {os.cpu_count()}"
