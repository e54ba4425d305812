"""Precision choices: what `--dtype auto` picks on the CPU, and explicit choices checked;
the allocator setting CPU training runs under."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest
import torch

from gptcli import runtime
from gptcli.errors import UsageError

CPU = torch.device("cpu")


@pytest.mark.parametrize(("feature", "want"), [("avx512_bf16", "bf16"), (None, "fp32")])
def test_training_autocasts_to_bf16_only_on_cpus_with_native_bf16(monkeypatch, feature, want):
    monkeypatch.setattr(runtime, "cpu_bf16_feature", lambda: feature)
    precision = runtime.pick_precision(CPU, "auto")
    assert precision.name == want
    assert (feature or "no native bf16") in precision.reason


def test_inference_keeps_small_models_in_fp32(monkeypatch):
    monkeypatch.setattr(runtime, "cpu_bf16_feature", lambda: "avx512_bf16")
    big, small = runtime.BF16_DECODE_MIN_PARAMS, runtime.BF16_DECODE_MIN_PARAMS - 1
    assert runtime.pick_inference_dtype(CPU, "auto", big)[0] == torch.bfloat16
    assert runtime.pick_inference_dtype(CPU, "auto", small) == (
        torch.float32,
        "fp32 weights: a model under 50M parameters",
    )  # the reason is said (docs/sampling.md)
    monkeypatch.setattr(runtime, "cpu_bf16_feature", lambda: None)
    assert runtime.pick_inference_dtype(CPU, "auto", big) == (
        torch.float32,
        "fp32 weights: this CPU has no native bf16",
    )
    assert runtime.pick_inference_dtype(CPU, "bf16", small) == (torch.bfloat16, "bf16: as requested")
    assert runtime.pick_inference_dtype(CPU, "auto", small, "int8") == (
        torch.float32,
        "int8 weights (quantized at load), fp32 activations: this CPU has no native bf16",
    )  # (it read "fp32 weights, int8 weights")


def test_a_large_model_decodes_in_bf16_where_the_kernel_multiplies_bf16_without_native_bf16(monkeypatch):
    """On an AVX2 CPU (no native bf16) the CPU kernel's bf16 products read half the bytes of
    fp32 ones: the verbs that decode through it hold a large model in bf16; eval and
    inspection (torch's own products, slow in bf16 there) and small models keep fp32."""
    monkeypatch.setattr(runtime, "cpu_bf16_feature", lambda: None)
    big, small = runtime.BF16_DECODE_MIN_PARAMS, runtime.BF16_DECODE_MIN_PARAMS - 1
    assert runtime.pick_inference_dtype(CPU, "auto", big, bf16_kernel="AVX2") == (
        torch.bfloat16,
        "bf16 weights: a large model, decoded by the CPU kernel's bf16 products (AVX2)",
    )
    assert runtime.pick_inference_dtype(CPU, "auto", small, bf16_kernel="AVX2") == (
        torch.float32,
        "fp32 weights: a model under 50M parameters",
    )
    assert runtime.pick_inference_dtype(CPU, "auto", big)[0] == torch.float32
    assert runtime.pick_inference_dtype(CPU, "fp32", big, bf16_kernel="AVX2")[0] == torch.float32
    # int8 weights keep fp32 activations, as everywhere without native bf16
    assert runtime.pick_inference_dtype(CPU, "auto", big, "int8", bf16_kernel="AVX2")[0] == torch.float32


def test_the_kernels_bf16_products_are_named_only_where_they_apply(monkeypatch):
    from gptcli.infer import kernels

    monkeypatch.setattr(kernels, "cpu_bf16_feature", lambda: None)
    monkeypatch.setattr(kernels, "cpu_has_isa", lambda isa: isa == "avx2")
    monkeypatch.setattr(kernels, "_compiler", lambda: "cc")
    assert kernels.bf16_products() == "AVX2"
    monkeypatch.setattr(kernels, "_compiler", lambda: None)  # nothing to build the kernel with
    assert kernels.bf16_products() is None
    monkeypatch.setattr(kernels, "_compiler", lambda: "cc")
    monkeypatch.setattr(kernels, "cpu_has_isa", lambda isa: False)  # no AVX2 (or not x86)
    assert kernels.bf16_products() is None
    monkeypatch.setattr(kernels, "cpu_has_isa", lambda isa: True)
    monkeypatch.setattr(kernels, "cpu_bf16_feature", lambda: "avx512_bf16")  # torch's own are fast
    assert kernels.bf16_products() is None


def test_a_kernel_known_not_to_build_leaves_auto_in_fp32(tmp_path, monkeypatch):
    """Where the kernel cannot be had (a build of it refused before, nowhere to keep it),
    --dtype auto keeps fp32, whose products torch runs fast, instead of bf16, which only the
    kernel multiplies fast on AVX2; nothing is built or made to find it out."""
    from gptcli.infer import kernels

    monkeypatch.setattr(kernels, "cpu_bf16_feature", lambda: None)
    monkeypatch.setattr(kernels, "cpu_has_isa", lambda isa: isa == "avx2")
    in_the_way = tmp_path / "notes.txt"
    in_the_way.write_text("mine")
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(in_the_way / "kernels"))
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library())
    assert kernels.bf16_products() is None and "is a file, not a directory" in kernels.LIBRARY.failed
    monkeypatch.setenv("GPTCLI_KERNELS_DIR", str(tmp_path / "k"))
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library())
    assert (
        kernels.bf16_products() == "AVX2" and not (tmp_path / "k").exists()
    )  # (could be built: nothing made)
    path = kernels.library_path(kernels._compiler())
    path.parent.mkdir()
    kernels.kernel_build.failure_record(path).write_text("cc: error: no headers\n")
    monkeypatch.setattr(kernels, "LIBRARY", kernels._Library())
    assert (
        kernels.bf16_products() is None and "did not build (cc: error: no headers)" in kernels.LIBRARY.failed
    )
    assert kernels.LIBRARY.thread is None


@pytest.mark.parametrize(("verb", "want"), [("sample", "bf16"), ("beam", "bf16"), ("inspect-lens", "fp32")])
def test_decoding_verbs_ask_for_the_kernels_bf16_and_the_others_do_not(monkeypatch, trained, verb, want):
    from gptcli.cli import render
    from gptcli.infer import kernels
    from tests.helpers import run

    monkeypatch.setattr(runtime, "cpu_bf16_feature", lambda: None)
    monkeypatch.setattr(runtime, "BF16_DECODE_MIN_PARAMS", 1)  # the tiny run counts as large
    monkeypatch.setattr(kernels, "bf16_products", lambda: "AVX2")
    notes: list[str] = []  # (said at a terminal only)
    monkeypatch.setattr(render, "note", notes.append)
    prompt = ["--prompt", "the cat", "-n", "2"] if verb == "sample" else ["the cat"]
    result = run(verb, "--ckpt", trained, *prompt, *(["-n", "2"] if verb == "beam" else []))
    assert result.exit_code == 0, result.output
    assert any(f"{want} weights" in n for n in notes), notes


@pytest.mark.parametrize("pick", [runtime.pick_precision, lambda d, r: runtime.pick_inference_dtype(d, r, 1)])
def test_explicit_choices_are_checked(pick):
    with pytest.raises(UsageError, match="fp16 is for GPUs"):
        pick(CPU, "fp16")
    with pytest.raises(UsageError, match="unknown dtype 'half'"):
        pick(CPU, "half")


# a training step's worth of allocations: the same few large blocks (here 8 to 64 MiB)
# allocated, written and freed again every step; the page faults of the later steps
_FAULTS = """
import resource, sys, torch
from gptcli.runtime import keep_freed_memory
if sys.argv[1] == "keep":
    assert keep_freed_memory()
def step():
    kept = [torch.ones(n << 20) for n in (2, 16, 4, 8)]
for _ in range(20):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="tunes glibc's malloc")
def test_kept_memory_is_reused_without_page_faults():
    def faults(mode: str) -> int:
        run = subprocess.run(
            [sys.executable, "-c", _FAULTS, mode], capture_output=True, text=True, check=True
        )
        return int(run.stdout)

    pages = 5 * (30 << 22) // 4096  # what 5 steps of fresh blocks would fault in
    assert faults("default") > pages // 2  # glibc returns the large blocks, then faults them in again
    assert faults("keep") < pages // 50


def test_the_training_memory_estimate_is_a_lower_bound():
    """What training_bytes counts for activations and logits is at most what autograd really
    saves for backward (measured with saved-tensor hooks), so a refusal is never wrong."""
    from gptcli.config import ModelConfig
    from gptcli.model import GPT
    from gptcli.runtime import Precision, training_bytes

    config = ModelConfig(vocab_size=101, block_size=32, n_layer=2, n_head=4, n_embd=64)
    model = GPT(config).train()
    x = torch.randint(0, 101, (4, 32))
    params = sum(p.numel() for p in model.parameters())
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    for kind in ("sdpa", "explicit"):  # the explicit path keeps every attention matrix too
        model.set_attention(kind)
        saved: dict[int, int] = {}

        def pack(t: torch.Tensor, saved: dict[int, int] = saved) -> torch.Tensor:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(x, x)
        activations = sum(n for ptr, n in saved.items() if ptr not in weights)
        fused = kind == "sdpa"
        estimate = training_bytes(config, params, 4, Precision("fp32", "cpu", ""), fused) - 12 * params
        assert 0.5 * activations < estimate <= activations, kind


@pytest.mark.parametrize(
    ("device", "requested", "precision", "said"),
    [
        ("cuda", "auto", "high", "fp32 matmuls in TF32"),
        ("cuda", "bf16", "high", "fp32 matmuls in TF32"),
        ("cuda", "fp32", "highest", "fp32 matmuls exact (no TF32)"),
        ("cpu", "auto", "highest", ""),
    ],
)
def test_tf32_on_cuda_unless_exact_fp32_is_asked_for(device, requested, precision, said):
    from gptcli.runtime import fp32_matmuls

    before = torch.get_float32_matmul_precision()
    try:
        assert fp32_matmuls(torch.device(device), requested) == ("; " + said if said else "")
        assert torch.get_float32_matmul_precision() == precision
    finally:
        torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize(
    ("requested", "local_rank", "message"),
    [
        ("auto", 2, "local rank 2 of a torchrun job, but only 2 CUDA device(s) are visible"),
        ("cuda", 3, "--nproc-per-node"),
        ("cuda:5", 0, "--device cuda:5: only 2 CUDA device(s) present"),
    ],
)
def test_a_gpu_that_is_not_there_is_one_line(monkeypatch, requested, local_rank, message):
    """Under torchrun each process takes cuda:LOCAL_RANK; more processes than GPUs, or a
    --device cuda:N past the last, is a usage error before CUDA is touched."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    with pytest.raises(UsageError, match=message.replace("(", r"\(").replace(")", r"\)")):
        runtime.rank_device(requested, runtime.Dist(rank=local_rank, world=4, local_rank=local_rank))
    device, why = runtime.rank_device("cuda", runtime.Dist(rank=1, world=2, local_rank=1))
    assert device == torch.device("cuda", 1) and "rank 1 of 2" in why
