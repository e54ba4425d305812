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


def resumed_and_straight(tmp_path: Path, device: str) -> tuple[list[float], list[float]]:
    """The losses of 20 steps straight, and of 20 steps stopped after 13 (as Ctrl-C stops a
    run, between evaluations) and resumed: the same run, so the same learning-rate schedule
    (a run of 10 steps resumed to 20 would decay on another plan), and dropout's random
    state carried over."""
    from gptcli.data.corpus import tokenize_corpus
    from gptcli.store.checkpoint import load_checkpoint
    from gptcli.train.trainer import Trainer
    from tests.helpers import StopAt
    from tests.test_train import build_trainer, tiny_config, train_records

    data = tmp_path / "data"
    tokenize_corpus([make_corpus(tmp_path / "c.txt", n_sentences=300)], data, "char")
    settings = dict(max_iters=20, eval_interval=10, log_interval=1, dtype="bf16", device=device)
    build_trainer(data, tmp_path / "straight", tiny_config(**settings)).run()
    first = build_trainer(data, tmp_path / "split", tiny_config(**settings))
    stopper = StopAt(13)
    stopper.trainer = first
    assert first.run(reporter=stopper).stop_reason == "interrupted"
    model = load_checkpoint(tmp_path / "split" / "last", device=device).model.train()
    Trainer(
        model, first.tokenizer, first.task, tiny_config(**settings), tmp_path / "split", {"task": "lm"}
    ).run(resume=True)

    def losses(run: str) -> list[float]:
        return [r["loss"] for r in train_records(tmp_path / run) if r["kind"] == "train"]

    return losses("split"), losses("straight")


def test_resume_on_cuda_continues_the_run(tmp_path):
    split, straight = resumed_and_straight(tmp_path, "cuda")
    assert len(split) == len(straight) == 20
    # the embedding's backward adds with atomics on CUDA: equal within tolerance, not bit for bit
    assert split == pytest.approx(straight, rel=1e-3)


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
    they are when the step writes to a KV cache not marked static), greedy across window
    slides, two sampled rows and beams, with the eager tokens (and logits) in fp32."""
    from torch._dynamo.utils import counters

    from gptcli.infer.generate import GREEDY, Sampling, beam_search, generate, row_generators
    from tests.helpers import ours_from_hf

    model = ours_from_hf(hf_gpt2(n_layer=2, vocab_size=97)).to("cuda")
    assert model.config.block_size < 70
    prompt = [5, 17, 42, 3]
    torch.set_float32_matmul_precision("highest")
    counters.clear()

    def greedy(compile: bool) -> tuple[list[int], list[torch.Tensor]]:  # (70 tokens: the window slides)
        steps = list(generate(model, prompt, 70, sampling=GREEDY, compile=compile))  # (read after)
        return [int(s.tokens[0]) for s in steps], [s.logits for s in steps]

    (compiled, compiled_logits), (eager, eager_logits) = greedy(True), greedy(False)
    assert compiled == eager
    # each Step's logits its own (a step ahead, the next replay overwrites the graph's output)
    torch.testing.assert_close(torch.stack(compiled_logits), torch.stack(eager_logits), rtol=0, atol=1e-4)

    def sampled(compile: bool) -> list[list[int]]:  # two rows, each its own generator on the GPU
        gens = row_generators(7, 2, "cuda")
        drawn = Sampling(temperature=0.9, top_k=20)
        steps = generate(model, prompt, 40, num_samples=2, sampling=drawn, generator=gens, compile=compile)
        return [s.tokens.tolist() for s in steps]

    assert sampled(True) == sampled(False)
    assert [h.ids for h in beam_search(model, prompt, 3, 12, compile=True)] == [
        h.ids for h in beam_search(model, prompt, 3, 12)
    ]
    assert counters["inductor"]["cudagraph_skips"] == 0


@pytest.mark.parametrize("compile", [False, True], ids=["eager", "compiled"])
def test_steps_over_a_growing_cache_run_no_cudnn_attention(hf_gpt2, compile):
    """The server's batch (eager, or `serve --compile` with symbolic sizes), and sample and
    beam without --compile, attend over a cache one slot longer at every step: cuDNN's
    attention would build a graph for each new length (on an H200 one client's 128 tokens
    took 8 s where the same steps, their graphs built, took 0.7 s). With cuDNN put first
    (torch puts it first on an H100 or H200 by itself), a control call runs its kernels, and
    none of them runs in those steps."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.profiler import ProfilerActivity, profile

    from gptcli.infer.engine import Engine
    from gptcli.infer.generate import GREEDY, beam_search, generate
    from tests.helpers import ours_from_hf
    from tests.test_engine import seq

    if not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 (cuDNN's attention takes bf16 or fp16)")

    def cudnn_kernels(prof) -> list[str]:
        keys = {e.key for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0}
        assert keys, "the profiler saw no device time"
        return [k for k in keys if "cudnn" in k.lower()]

    model = ours_from_hf(hf_gpt2(n_layer=2, vocab_size=97)).to("cuda", torch.bfloat16)
    cfg = model.config
    first = [
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.MATH,
    ]
    with sdpa_kernel(first, set_priority=True):
        q = torch.randn(2, cfg.n_head, 1, cfg.n_embd // cfg.n_head, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(2, cfg.n_head, 9, cfg.n_embd // cfg.n_head, device="cuda", dtype=torch.bfloat16)
        mask = torch.ones(2, 1, 1, 9, dtype=torch.bool, device="cuda")
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as control:
            F.scaled_dot_product_attention(q, k, k, attn_mask=mask)
            torch.cuda.synchronize()
        if not cudnn_kernels(control):
            pytest.skip("cuDNN's attention does not run on this GPU (or the profiler does not name it)")
        engine = Engine(model, max_batch=4, compile=compile)
        try:
            if compile:
                engine.warm_up()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                pending = []
                for prompt in ([5, 17, 42, 3], [9] * 11, [1, 2]):
                    s, c = seq(prompt, 20)
                    engine.submit([s])
                    pending.append(c)
                for c in pending:
                    assert c.wait()[1] == "length"
                if not compile:
                    list(generate(model, [5, 17, 42, 3], 20, sampling=GREEDY))
                    beam_search(model, [5, 17, 42, 3], 3, 12)
                torch.cuda.synchronize()
        finally:
            engine.close()
    assert not cudnn_kernels(prof)
