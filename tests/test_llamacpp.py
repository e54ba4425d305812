"""GGUF files written by gptcli, run by llama.cpp itself (llama-cpp-python): the same token
ids for hostile strings, the same greedy continuations, the same log-probabilities.
Marker llamacpp: make test-llamacpp (llama-cpp-python compiles llama.cpp; the target
installs it from a local wheel cache when there is one).

The model is trained (a random one has near-ties that any rounding flips) with GPT-2's
tokenizer on make_corpus's grammar, whose uniform choices (which animal) are ties the data
made: greedy agreement is measured over several prompts. llama.cpp's KV cache is f16 by
default; these tests ask for f32 (type_k, type_v) so that only the weights' type differs.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptcli.config import ModelConfig
from gptcli.data.tokenizer import gpt2_tokenizer
from gptcli.infer.completion import Prompt, complete
from gptcli.infer.generate import Sampling
from gptcli.model import GPT
from gptcli.store.gguf import export_gguf
from gptcli.store.loading import load
from tests.helpers import make_corpus, run

llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (make test-llamacpp)")
pytestmark = pytest.mark.llamacpp

F32 = 0  # GGML_TYPE_F32, for llama.cpp's KV cache
PROMPTS = ["The fox", "The otter left", "The rabbit", "The mole dug", "The badger"]
HOSTILE = [
    "", " ", "  ", "\n", "\n\n", "\r\n", "\t", " \t\n ", "a", "A", "The rabbit dug a hole.",
    " hello  world", "hello\n\nworld", "it's", "IT'S", "we'll've", "don't", "'s", "'", "''",
    "2024", "1234567", "3.14159", "1,000,000", "x=1+2", "a.b.c", "...", "!!!", "?!", "--",
    "<|endoftext|>", "<|endoftext|> after", "<|im_start|>user", "<|im_end|>", "<|", "|>",
    "日本語", "中文字符", "한국어", "Ünïcödé", "naïve café", "🙂", "🙂🙂 🙂", "👨‍👩‍👧", "\u200b",
    "\u00a0nbsp", "tab\tand\tmore", "ends with space ", "   leading", "mixed 123abc ABC123 a1b2",
]  # fmt: skip


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("llamacpp")
    corpus = make_corpus(tmp / "animals.txt", n_sentences=600)
    result = run(
        "pretrain", corpus, "--tokenizer", "gpt2", "--out", tmp / "run", "--n-layer", "2", "--n-head", "2",
        "--n-embd", "64", "--block-size", "128", "--batch-size", "8", "--max-iters", "150",
        "--eval-interval", "150", "--eval-iters", "2", "--lr", "1e-2", "--warmup-iters", "10",
        "--device", "cpu", "--dtype", "fp32", "--optimizer", "adamw",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return tmp / "run"


def exported(run_dir, outtype):
    out = run_dir.parent / f"m-{outtype}.gguf"
    if not out.exists():
        result = run("export", run_dir, out, "--outtype", outtype)
        assert result.exit_code == 0, result.output
    return out


def llama(path, **kw):
    return llama_cpp.Llama(
        model_path=str(path),
        n_ctx=128,
        n_threads=2,
        logits_all=True,
        verbose=False,
        type_k=F32,
        type_v=F32,
        **kw,
    )


def llama_greedy(llm, ids: list[int], n: int) -> list[int]:
    """llama.cpp's argmax, token by token (no sampler in between)."""
    llm.reset()
    llm.eval(ids)
    out = []
    for _ in range(n):
        token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(token)
        llm.eval([token])
    return out


def gptcli_greedy(model, ids: list[int], n: int) -> list[int]:
    """gptcli's greedy continuation (sample --temp 0), padded after its end with end-of-text,
    which llama.cpp's argmax would go on past."""
    (r,) = complete(model, gpt2_tokenizer(), Prompt(ids, ""), max_new_tokens=n, sampling=Sampling(0.0))
    return r.ids


def agreement(a: list[int], b: list[int]) -> float:
    n = min(len(a), len(b))
    return sum(x == y for x, y in zip(a[:n], b[:n], strict=True)) / n


def test_llama_cpp_tokenizes_as_gptcli_does(trained, tmp_path):
    tok = gpt2_tokenizer()
    big = GPT(
        ModelConfig(n_layer=12, n_head=12, n_embd=768, block_size=1024, vocab_size=50257)
    )  # 124M's shape
    export_gguf(big, tok, tmp_path / "124m.gguf", "f16", "124m", "test", replace=False)
    for path in (exported(trained, "f32"), tmp_path / "124m.gguf"):
        llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
        for text in HOSTILE:
            assert llm.tokenize(text.encode(), add_bos=False, special=False) == tok.encode(text), (path, text)


def agreements(path) -> tuple[list[float], object]:
    """Per prompt, how much of gptcli's 64-token greedy continuation llama.cpp's matches, on
    the same file; and llama.cpp's model."""
    ours, llm = load(path).model, llama(path)
    scores = []
    for p in PROMPTS:
        ids = gpt2_tokenizer().encode(p)
        mine = gptcli_greedy(ours, ids, 64)
        scores.append(agreement(llama_greedy(llm, ids, len(mine)), mine))
    return scores, llm


@pytest.mark.parametrize("outtype", ["f32", "f16"])
def test_greedy_continuations_are_gptcli_s(trained, outtype):
    path = exported(trained, outtype)
    scores, llm = agreements(path)
    tok = gpt2_tokenizer()
    if outtype == "f32":
        assert scores == [1.0] * len(PROMPTS)
    else:
        assert np.mean(scores) >= 0.99
    # and through the CLI: `gptcli sample --temp 0` on the exported file is the same text
    result = run("sample", "--ckpt", path, "--prompt", PROMPTS[0], "--temp", "0", "-n", "64", "--json")
    ids = tok.encode(PROMPTS[0])
    mine = json.loads(result.stdout)["samples"][0]["ids"]
    assert agreement(llama_greedy(llm, ids, len(mine)), mine) >= (1.0 if outtype == "f32" else 0.99)


def test_q8_0_greedy_text_agrees(trained):
    scores, _ = agreements(exported(trained, "q8_0"))
    # q8_0's rounding flips near-ties, and where they fall depends on the run trained here:
    # measured on a Zen 5 (the run trained in bf16) 1.0, 1.0, 0.81 (a tie of the grammar's
    # flips), 0.98, 0.98; on an AVX2 Zen 3 (trained in fp32) 0.98, 0.83, 0.92, 0.98, 0.98. An
    # export that garbles the weights agrees on a few tokens at most.
    assert min(scores) >= 0.75 and np.mean(scores) >= 0.9


def test_log_probabilities_of_a_text_are_gptcli_s(trained):
    """f32: within 1e-3 (measured: 2.4e-4 on the text's tokens; over the whole vocabulary the
    far tail differs up to 1.1e-3, llama.cpp's GELU being a float16 table)."""
    path = exported(trained, "f32")
    tok = gpt2_tokenizer()
    ids = tok.encode(
        " The badger built a nest because the rain began. The mole found a den because it was tired."
    )
    with torch.no_grad():
        ours = torch.log_softmax(load(path).model(torch.tensor([ids]))[0][0].double(), -1).numpy()
    llm = llama(path)
    llm.reset()
    llm.eval(ids)
    scores = np.array(llm.scores[: len(ids)], dtype=np.float64)
    theirs = scores - np.logaddexp.reduce(scores, axis=-1, keepdims=True)
    at = np.arange(len(ids) - 1)
    assert np.abs(theirs[at, ids[1:]] - ours[at, ids[1:]]).max() < 1e-3
