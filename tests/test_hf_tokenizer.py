"""Exports that the rest of the ecosystem loads: Hugging Face's tokenizer.json for every
gptcli tokenizer, with the ids gptcli gives, and the same greedy text from transformers'
pipeline as from `gptcli sample --temp 0`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import TINY, assert_usage_error, make_corpus, run

transformers = pytest.importorskip("transformers")

HOSTILE = [
    "The fox dug a den.",
    "emoji 🦊🐇👍🏽 and 中文字符 and ｆｕｌｌｗｉｄｔｈ",
    "combining: e\u0301 a\u0308 n\u0303, precomposed: é ä ñ",
    "runs of spaces:     and newlines\n\n\n\tand tabs\t\t end  ",
    "<|endoftext|>The fox<|endoftext|>",
    "it's don't 1234567 3.14 ...!!! ???",
    "",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """A char run and a bpe run on a corpus that holds every hostile string's characters."""
    tmp = tmp_path_factory.mktemp("hftok")
    corpus = make_corpus(tmp / "c.txt", n_sentences=300)
    corpus.write_text(corpus.read_text() + "\n".join(HOSTILE) * 3 + "\n")
    for name, tok in (("char", "char"), ("bpe", "bpe:400")):
        result = run("pretrain", corpus, "--out", tmp / name, "-t", tok, *TINY)
        assert result.exit_code == 0, result.output
        assert run("export", tmp / name, "--to", "hf", tmp / f"{name}-hf").exit_code == 0
    return tmp


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_auto_tokenizer_gives_gptcli_ids(runs, name):
    from gptcli.store.loading import load

    ours = load(runs / name).tokenizer
    theirs = transformers.AutoTokenizer.from_pretrained(runs / f"{name}-hf")
    for text in HOSTILE:
        ids = theirs(text)["input_ids"]
        want = ours.encode(text) if name == "char" else ours.encode_prompt(text)  # char: no special token
        assert ids == want, text
        if "<|endoftext|>" not in text:
            assert theirs.decode(ids) == text
    assert (theirs.eos_token is None) == (name == "char")  # char tokenizers have no end-of-text


def test_the_export_of_gpt2_bpe_loads_in_auto_tokenizer(hf_gpt2, tmp_path):
    from gptcli.store.hf import export_hf
    from gptcli.store.loading import load

    hf_gpt2(vocab_size=50257, n_embd=16, n_head=2).save_pretrained(tmp_path / "src")
    loaded = load(tmp_path / "src")
    export_hf(loaded.model, loaded.tokenizer, tmp_path / "out")
    fast = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "out" / "tokenizer.json"))
    for text in HOSTILE:
        assert fast(text)["input_ids"] == loaded.tokenizer.encode_prompt(text), text


@pytest.mark.parametrize("name", ["char", "bpe"])
def test_the_pipeline_writes_what_gptcli_sample_writes(runs, name):
    prompt = "The fox dug"  # and 5 tokens: within the block of 16 that HF's positions allow
    ours = run(
        "sample", "--ckpt", runs / name, "--prompt", prompt, "--temp", "0", "--max-new-tokens", "5", "--json"
    )
    assert ours.exit_code == 0, ours.output
    text = json.loads(ours.stdout)["samples"][0]["text"]
    generate = transformers.pipeline("text-generation", model=str(runs / f"{name}-hf"), device="cpu")
    out = generate(prompt, max_new_tokens=5, do_sample=False, return_full_text=False)
    assert out[0]["generated_text"] == text


def test_gptcli_tells_the_two_tokenizer_json_apart(runs, tmp_path):
    """An export dir holds Hugging Face's tokenizer.json and gptcli's own beside it."""
    from gptcli.data.tokenizer import load_tokenizer

    assert load_tokenizer(runs / "bpe-hf").name.startswith("bpe")  # ours, from gptcli_tokenizer.json
    (tmp_path / "only").mkdir()
    (tmp_path / "only" / "tokenizer.json").write_bytes((runs / "bpe-hf" / "tokenizer.json").read_bytes())
    result = run("tokenize", "The fox", "--tokenizer", tmp_path / "only")
    assert_usage_error(result, "is a Hugging Face tokenizer.json")
