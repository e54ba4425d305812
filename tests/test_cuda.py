"""The CUDA paths, on a real GPU: they skip (cleanly, each with its reason) without one.

Written before a GPU was lent, so that a session with one spends its minutes measuring:
`make gpu-check` runs them first (bench/gpu_check.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import TINY, failure, make_corpus, run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

CUDA = [("cuda" if a == "cpu" else a) for a in TINY]  # the tiny shape, --device cuda


def train(tmp_path: Path, name: str, *extra: str) -> list[dict]:
    result = run("pretrain", tmp_path / "c.txt", "--out", tmp_path / name, *CUDA, *extra)
    assert result.exit_code == 0, result.output
    lines = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return make_corpus(tmp_path / "c.txt", n_sentences=300)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_a_training_step_in_each_precision(tmp_path, corpus, dtype):
    """bf16 autocast, fp16 autocast with the gradient scaler, fp32 (TF32 off): the loss falls."""
    if dtype == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16")
    records = train(tmp_path, dtype, "--dtype", dtype, "--max-iters", "30")
    assert records[-1]["loss"] < records[0]["loss"]


def test_compile_trains_as_eager_does(tmp_path, corpus):
    eager = train(tmp_path, "eager", "--max-iters", "10", "--log-interval", "1")
    compiled = train(tmp_path, "compiled", "--max-iters", "10", "--log-interval", "1", "--compile")
    assert [r["loss"] for r in compiled] == pytest.approx([r["loss"] for r in eager], rel=2e-3)


def test_resume_on_cuda_continues_the_run(tmp_path, corpus):
    straight = train(tmp_path, "straight", "--max-iters", "20", "--log-interval", "1")
    train(tmp_path, "split", "--max-iters", "10", "--log-interval", "1")
    again = run("pretrain", "--resume", "--out", tmp_path / "split", "--max-iters", "20")
    assert again.exit_code == 0, again.output
    lines = (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()
    split = [r for r in map(json.loads, lines) if r["kind"] == "train"]
    # cuBLAS may pick other kernels after a restart: equal within tolerance, not bit for bit
    assert [r["loss"] for r in split] == pytest.approx([r["loss"] for r in straight], rel=1e-3)


def test_kv_cache_decoding_matches_the_cpu(hf_gpt2):
    """Greedy decoding with the KV cache in fp32 gives the CPU's tokens on the GPU."""
    from gptcli.infer.generate import GREEDY, generate
    from tests.helpers import ours_from_hf

    model = ours_from_hf(hf_gpt2(n_layer=2, vocab_size=97))
    prompt = [5, 17, 42, 3]
    torch.set_float32_matmul_precision("highest")
    cpu = [int(s.tokens[0]) for s in generate(model, prompt, 30, sampling=GREEDY)]
    gpu = [int(s.tokens[0]) for s in generate(model.to("cuda"), prompt, 30, sampling=GREEDY)]
    assert gpu == cpu


def test_inspect_attn_weights_on_cuda_equal_the_cpu(trained):
    cpu = json.loads(run("inspect-attn", "The fox", "--ckpt", trained, "--device", "cpu", "--json").stdout)
    gpu = json.loads(
        run(
            "inspect-attn", "The fox", "--ckpt", trained, "--device", "cuda", "--dtype", "fp32", "--json"
        ).stdout
    )
    assert torch.allclose(torch.tensor(gpu["attention"]), torch.tensor(cpu["attention"]), atol=1e-5)
    assert [t["id"] for t in gpu["top_k"]] == [t["id"] for t in cpu["top_k"]]


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_torchrun_with_nccl(tmp_path, corpus, mode):
    """One process per GPU under torchrun (NCCL between two GPUs; with one GPU a single
    process, where --fsdp has nothing to shard over): it trains and writes whole checkpoints."""
    import os
    import subprocess
    import sys

    procs = min(2, torch.cuda.device_count())
    extra = ["--fsdp"] if mode == "fsdp" else []
    launcher = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={procs}", "--standalone"]
    cmd = [*launcher, "-m", "gptcli", "pretrain", "c.txt", "--out", mode, *CUDA, "--max-iters", "10", *extra]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    result = subprocess.run(
        cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert result.returncode == 0, failure(result)
    assert (tmp_path / mode / "last" / "model.safetensors").is_file()


def test_compiled_decoding_runs_as_cuda_graphs(hf_gpt2):
    """--compile on CUDA: the one-token step is replayed as CUDA graphs (none skipped, as
    they are when the step writes to a KV cache not marked static), greedy and beams, with
    the eager tokens in fp32."""
    from torch._dynamo.utils import counters

    from gptcli.infer.generate import GREEDY, beam_search, generate
    from tests.helpers import ours_from_hf

    model = ours_from_hf(hf_gpt2(n_layer=2, vocab_size=97)).to("cuda")
    prompt = [5, 17, 42, 3]
    torch.set_float32_matmul_precision("highest")
    counters.clear()

    def greedy(compile: bool) -> list[int]:
        return [int(s.tokens[0]) for s in generate(model, prompt, 40, sampling=GREEDY, compile=compile)]

    assert greedy(True) == greedy(False)
    assert [h.ids for h in beam_search(model, prompt, 3, 12, compile=True)] == [
        h.ids for h in beam_search(model, prompt, 3, 12)
    ]
    assert counters["inductor"]["cudagraph_skips"] == 0
