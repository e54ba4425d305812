"""Hugging Face GPT-2 in and out: directories, hub names from the cache, export round trips."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from gptcli.errors import UsageError
from gptcli.store.hf import export_hf
from gptcli.store.loading import load
from tests.helpers import assert_usage_error, run

transformers = pytest.importorskip("transformers")


def logits_equal(hf_model, ours, ids: list[int]) -> None:
    x = torch.tensor([ids])
    with torch.no_grad():
        torch.testing.assert_close(ours(x)[0], hf_model(x).logits, atol=1e-5, rtol=0)


def test_a_hugging_face_directory_loads_with_equal_logits(hf_gpt2, tmp_path):
    hf = hf_gpt2(vocab_size=50257, n_embd=16, n_head=2)
    hf.save_pretrained(tmp_path / "st")
    loaded = load(tmp_path / "st")
    assert loaded.tokenizer.name == "gpt2" and loaded.meta["source"] == "huggingface"
    ids = loaded.tokenizer.encode("The rabbit dug a hole")
    logits_equal(hf, loaded.model, ids)

    # the same weights as pytorch_model.bin, read with torch.load(weights_only=True)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text((tmp_path / "st" / "config.json").read_text())
    torch.save(hf.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    logits_equal(hf, load(tmp_path / "bin").model, ids)


def test_hub_names_come_from_the_local_cache(hf_gpt2, tmp_path, monkeypatch):
    hf = hf_gpt2(vocab_size=50257, n_embd=16, n_head=2)
    cache = tmp_path / "hub"
    snap = cache / "models--openai-community--gpt2" / "snapshots" / "0123abc"
    hf.save_pretrained(snap)
    (snap.parents[1] / "refs").mkdir()
    (snap.parents[1] / "refs" / "main").write_text("0123abc")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.chdir(tmp_path)
    loaded = load("gpt2")
    assert loaded.path == snap
    logits_equal(hf, loaded.model, [464, 22746, 18735, 257])
    result = run("sample", "--ckpt", "gpt2", "-p", "The rabbit", "-n", "3", "--temp", "0", "--json")
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["samples"][0]["ids"]) == 3

    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("HF_HUB_CACHE")
    with pytest.raises(
        UsageError, match=r"not in the Hugging Face cache \(looked in .*home/hub/models--openai"
    ):
        load("gpt2-medium")  # HF_HUB_OFFLINE is set for the tests: no download is tried


def test_export_round_trips_through_transformers(trained, tmp_path):
    out = tmp_path / "hf"
    result = run("export", trained, "--to", "hf", out, "--json")
    assert result.exit_code == 0, result.output
    assert {"config.json", "model.safetensors", "gptcli_tokenizer.json"} <= {p.name for p in out.iterdir()}
    report = json.loads(result.stdout)
    assert report["out"] == str(out) and sorted(report["files"]) == sorted(p.name for p in out.iterdir())
    ours = load(trained)
    theirs = transformers.GPT2LMHeadModel.from_pretrained(out).eval()
    ids = ours.tokenizer.encode("The fox dug a")
    logits_equal(theirs, ours.model, ids)
    # and back: the exported directory loads in gptcli, with its own tokenizer
    back = load(out)
    assert back.tokenizer.name == ours.tokenizer.name == "char"
    logits_equal(theirs, back.model, ids)
    assert_usage_error(run("export", trained, "--to", "hf", out), "exists and is not empty")
    assert_usage_error(run("export", trained, "--to", "onnx", tmp_path / "x"), "--to must be hf or gguf")


def test_export_of_a_gpt2_bpe_model_brings_its_tokenizer(hf_gpt2, trained, tmp_path):
    hf = hf_gpt2(vocab_size=50257, n_embd=16, n_head=2)
    hf.save_pretrained(tmp_path / "src")
    loaded = load(tmp_path / "src")
    written = export_hf(loaded.model, loaded.tokenizer, tmp_path / "out")
    assert {"vocab.json", "merges.txt", "tokenizer_config.json"} <= set(written)
    # the context length under both of GPT-2's names, as Hugging Face's own configs have it
    # (llama.cpp's convert_hf_to_gguf.py reads n_ctx)
    cfg = json.loads((tmp_path / "out" / "config.json").read_text())
    assert cfg["n_ctx"] == cfg["n_positions"] == hf.config.n_positions
    hf_tok = transformers.GPT2TokenizerFast.from_pretrained(tmp_path / "out")
    text = "The rabbit dug a hole, because it needed shelter. 🐇"
    assert hf_tok(text)["input_ids"] == loaded.tokenizer.encode(text)
    logits_equal(
        transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "out").eval(), loaded.model, [1, 2, 3]
    )
    # over an earlier export with --force, in either order, none of the other's tokenizer stays
    char = load(trained)
    export_hf(char.model, char.tokenizer, tmp_path / "over")
    export_hf(loaded.model, loaded.tokenizer, tmp_path / "over")
    assert "gptcli_tokenizer.json" not in {p.name for p in (tmp_path / "over").iterdir()}
    assert load(tmp_path / "over").tokenizer.encode(text) == loaded.tokenizer.encode(text)
    export_hf(char.model, char.tokenizer, tmp_path / "over")
    assert not {"vocab.json", "merges.txt"} & {p.name for p in (tmp_path / "over").iterdir()}
    assert load(tmp_path / "over").tokenizer.name == "char"


def test_sharded_weights_and_a_tokenizer_that_is_not_a_file_are_refused(hf_gpt2, trained, tmp_path):
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    assert_usage_error(run("sample", "--ckpt", tmp_path / "sharded", "-n", "2"), "its weights are in shards")
    assert run("export", trained, tmp_path / "hf").exit_code == 0
    (tmp_path / "hf" / "gptcli_tokenizer.json").unlink()
    (tmp_path / "hf" / "gptcli_tokenizer.json").mkdir()  # (GPT-2's tokenizer must not stand in for it)
    assert_usage_error(
        run("sample", "--ckpt", tmp_path / "hf", "-n", "2"),
        "gptcli_tokenizer.json is a directory, not a file",
    )


def test_unsupported_variants_and_broken_weights_are_refused(hf_gpt2, tmp_path):
    hf = hf_gpt2()
    hf.save_pretrained(tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["scale_attn_by_inverse_layer_idx"] = True
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="unsupported GPT-2 variant"):
        load(tmp_path / "m")
    cfg["scale_attn_by_inverse_layer_idx"] = False
    cfg["tie_word_embeddings"] = False  # a separate output matrix: ours is tied to the embedding
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match="tie_word_embeddings=False"):
        load(tmp_path / "m")
    cfg["tie_word_embeddings"] = True
    cfg["n_layer"] = 3  # the weights have 2
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UsageError, match=r"holds 2 blocks but the config says n_layer = 3"):
        load(tmp_path / "m")


class _Payload:
    """Unpickling this would run a shell command."""

    def __reduce__(self):
        return (os.system, ("touch pwned",))


def test_a_pickle_with_code_is_not_run(hf_gpt2, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    model_dir = tmp_path / "evil"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(hf_gpt2().config.to_dict()))
    torch.save({"transformer.wte.weight": _Payload()}, model_dir / "pytorch_model.bin")
    with pytest.raises(UsageError, match=r"refused, it is not plain tensors .*GLOBAL posix\.system"):
        load(model_dir)
    assert not Path("pwned").exists()
