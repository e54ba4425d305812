"""Hostile and careless input, verb by verb: one line on stderr, exit 2, no traceback, and
nothing that was on disk is changed or added."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import CLASS_NAME, make_corpus, run


@pytest.fixture(scope="module")
def ws(tmp_path_factory, trained) -> Path:
    """A workspace of inputs, good and bad, built once."""
    w = tmp_path_factory.mktemp("ws")
    make_corpus(w / "corpus.txt")
    (w / "empty.txt").write_text("")
    (w / "tiny.txt").write_text("The fox.\n" * 3)
    (w / "blob.bin").write_bytes(b"text\x00\x01\x02binary")
    (w / "latin1.txt").write_bytes("naïve text".encode("latin-1"))
    (w / "chat.jsonl").write_text(
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n'
    )
    assert run("tokenize", str(w / "corpus.txt"), "--out", str(w / "tok-char")).exit_code == 0
    (w / "unknown-key.yaml").write_text("model:\n  n_layers: 4\n")
    (w / "wrong-type.yaml").write_text("train:\n  batch_size: twelve\n")
    (w / "heads.yaml").write_text("model:\n  n_embd: 100\n  n_head: 6\n")
    (w / "notes.txt").write_text("not a checkpoint")
    (w / "emptydir").mkdir()
    (w / "hf-no-weights").mkdir()
    (w / "hf-no-weights" / "config.json").write_text('{"model_type": "gpt2"}')
    (w / "to-emptydir").symlink_to("emptydir")
    (w / "dangling").symlink_to("nowhere")

    def variant(name: str, change: Callable[[Path], None]) -> None:
        shutil.copytree(trained, w / name)
        change(w / name / "best")

    def truncate(d: Path) -> None:
        f = d / "model.safetensors"
        f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])

    def garbage_header(d: Path) -> None:
        f = d / "model.safetensors"
        f.write_bytes(b"\xff" * 8 + f.read_bytes()[8:])

    def edit_meta(**changes) -> Callable[[Path], None]:
        def change(d: Path) -> None:
            meta = json.loads((d / "checkpoint.json").read_text())
            for key, value in changes.items():
                if key.startswith("model."):
                    meta["model"][key[6:]] = value
                else:
                    meta[key] = value
            (d / "checkpoint.json").write_text(json.dumps(meta))

        return change

    def bigger_vocab(d: Path) -> None:
        tok = json.loads((d / "tokenizer.json").read_text())
        tok["chars"] += [chr(0x4E00 + i) for i in range(40)]
        (d / "tokenizer.json").write_text(json.dumps(tok))

    variant("ckpt-truncated", truncate)
    variant("ckpt-header", garbage_header)
    variant("ckpt-shape", edit_meta(**{"model.n_embd": 64}))
    variant("ckpt-newer", edit_meta(version=99))
    variant("ckpt-vocab", bigger_vocab)

    def replaced(name: str, by: Callable[[Path], None]) -> Callable[[Path], None]:
        def change(d: Path) -> None:
            (d / name).unlink()
            by(d / name)

        return change

    variant("ckpt-weights-dir", replaced("model.safetensors", Path.mkdir))
    variant("ckpt-tokenizer-pipe", replaced("tokenizer.json", os.mkfifo))
    return w


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


CASES = [
    # (id, arguments, what the one line must say)
    ("corpus missing", ["pretrain", "missing.txt"], "missing.txt: no such file"),
    ("corpus empty", ["pretrain", "empty.txt"], "the corpus is empty"),
    ("corpus binary", ["pretrain", "blob.bin"], "NUL byte (binary data) at byte offset 4"),
    ("corpus not UTF-8", ["tokenize", "latin1.txt", "--out", "o"], "invalid UTF-8 at byte offset 2"),
    ("corpus too short", ["pretrain", "tiny.txt", "--block-size", "64"], "fewer than block_size + 1 = 65"),
    ("tokenizer differs", ["pretrain", "tok-char", "-t", "gpt2"], "tokenized with char, not gpt2"),
    ("yaml unknown key", ["pretrain", "corpus.txt", "-c", "unknown-key.yaml"], "did you mean 'n_layer'"),
    ("yaml wrong type", ["pretrain", "corpus.txt", "-c", "wrong-type.yaml"], "train.batch_size must be an integer"),
    ("yaml n_embd/n_head", ["pretrain", "corpus.txt", "-c", "heads.yaml"], "must be divisible by model.n_head (6)"),
    ("negative lr", ["pretrain", "corpus.txt", "--lr", "-0.1"], "train.lr (--lr) must be > 0"),
    ("block larger than ckpt", ["finetune", "--ckpt", "{trained}", "corpus.txt", "--block-size", "32"],
     "larger than the checkpoint's 16"),
    ("prompt outside vocab", ["sample", "--ckpt", "{trained}", "-p", "Zebra ~ 東"], "'Z' '~' '東'"),
    ("top-p zero", ["sample", "--ckpt", "{trained}", "--top-p", "0"], "--top-p must be in (0, 1]"),
    ("top-p above one", ["sample", "--ckpt", "{trained}", "--top-p", "1.5"], "--top-p must be in (0, 1]"),
    ("temp negative", ["sample", "--ckpt", "{trained}", "--temp", "-0.5"], "--temp must be >= 0, got -0.5"),
    ("seeds past the largest", ["sample", "--ckpt", "{trained}", "--seed", str(2**63 - 1), "--num-samples", "2"],
     f"seeds its rows up to {2**63}, past {2**63 - 1}; give --seed {2**63 - 2} or less"),
    ("beams zero", ["beam", "The", "--ckpt", "{trained}", "--beams", "0"], "--beams must be >= 1"),
    ("ckpt missing", ["sample", "--ckpt", "nowhere"], "--ckpt nowhere: no such file or directory"),
    ("ckpt not a run", ["sample", "--ckpt", "emptydir"], "is not a gptcli run or checkpoint"),
    ("ckpt HF without weights", ["sample", "--ckpt", "hf-no-weights"],
     "has a Hugging Face config.json but no weights beside it (model.safetensors or pytorch_model.bin)"),
    ("ckpt is a file", ["beam", "x", "--ckpt", "notes.txt"], "notes.txt is a file, not a gptcli run or checkpoint"),
    ("ckpt is a device", ["sample", "--ckpt", "/dev/zero"], "/dev/zero is a character device, not a gptcli run"),
    ("ckpt truncated", ["sample", "--ckpt", "ckpt-truncated"], "model.safetensors is corrupted"),
    ("ckpt bad header", ["inspect-attn", "The", "--ckpt", "ckpt-header"], "model.safetensors is corrupted"),
    ("ckpt shape mismatch", ["sample", "--ckpt", "ckpt-shape"], "the weights do not match the config"),
    ("ckpt vocab mismatch", ["sample", "--ckpt", "ckpt-vocab"], "do not belong together"),
    ("ckpt weights a directory", ["sample", "--ckpt", "ckpt-weights-dir"],
     "model.safetensors is a directory, not a file; the checkpoint is damaged"),
    ("ckpt tokenizer a pipe", ["sample", "--ckpt", "ckpt-tokenizer-pipe"], "tokenizer.json is a named pipe, not a tokenizer file"),
    ("ckpt newer format", ["sample", "--ckpt", "ckpt-newer"], "written by a newer gptcli"),
    ("tokenized otherwise", ["tokenize", "corpus.txt", "--out", "tok-char", "-t", "bpe:300"],
     "tok-char already holds a different tokenization (with tokenizer char, not bpe:300)"),
    ("chat scoring of a model without a template", ["eval", "--ckpt", "{trained}", "chat.jsonl", "--task", "chat"],
     "scoring conversations (--task chat) needs a chat model, and this one has no chat template"),
    ("chat scoring of a text file", ["eval", "--ckpt", "{trained}", "corpus.txt", "--task", "chat"],
     "corpus.txt: --task chat scores JSONL or CSV records, not text; pass --task text to score it as text"),
    ("eval an empty file", ["eval", "--ckpt", "{trained}", "empty.txt"], "empty.txt: no text to score (the file is empty)"),
    ("unknown tokenizer", ["tokenize", "corpus.txt", "--out", "o", "-t", "sentencepiece"], "unknown tokenizer"),
    ("config twice", ["pretrain", "corpus.txt", "-c", "notes.txt", "--config", "notes.txt", "--out", "o"],
     "--config is given 2 times (notes.txt, notes.txt); give one file"),
    ("finetune config twice", ["finetune", "corpus.txt", "--ckpt", "{trained}", "-c", "a", "-c", "b"],
     "--config is given 2 times (a, b)"),
    ("export target", ["export", "{trained}", "out", "--to", "onnx"], "--to must be hf or gguf"),
    ("export onto a file", ["export", "{trained}", "notes.txt", "--force"],
     "notes.txt is a file; a Hugging Face export writes a directory"),
    ("export into a link", ["export", "{trained}", "to-emptydir"], "to-emptydir is a symbolic link"),
    ("export onto a dangling link", ["export", "{trained}", "dangling", "--force"], "dangling is a symbolic link"),
    ("unknown quantization", ["sample", "--ckpt", "{trained}", "--quantize", "int4"],
     "--quantize must be int8, got 'int4'; did you mean 'int8'?"),
    ("empty stop text", ["beam", "The", "--ckpt", "{trained}", "--stop", ".", "--stop", ""],
     "--stop is empty; give the text that ends one"),
    # (--max-batch 0 is refused as well, after the key: a server never starts here)
    ("empty API key", ["serve", "--ckpt", "{trained}", "--api-key", "", "--max-batch", "0"],
     "--api-key is empty; give a key, or leave --api-key out to serve without one"),
    ("classify an LM", ["classify", "--ckpt", "{trained}", "some text"], "is not a classifier"),
    ("an empty choice", ["classify", "--ckpt", "{trained}", "The owl", "--choice", "", "--choice", " x"],
     "--choice is empty; give the text of each choice"),
    ("fp16 on the CPU", ["sample", "--ckpt", "{trained}", "--dtype", "fp16", "--device", "cpu"], "--dtype fp16 is for GPUs"),
    ("unknown dtype", ["pretrain", "corpus.txt", "--dtype", "fp64"], "train.dtype (--dtype) must be auto, fp32, bf16 or fp16, got 'fp64'"),
    ("unknown flag", ["finetune", "--n-layer", "2"], "No such option: --n-layer (Possible options: --lr, --min-lr, --muon-lr) (see 'gptcli finetune --help')"),
]  # fmt: skip


@pytest.mark.parametrize(("args", "message"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input(ws, trained, monkeypatch, args, message):
    monkeypatch.chdir(ws)
    before = snapshot(ws)
    result = run(*[a.format(trained=trained) for a in args])
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    assert message in lines[0], lines[0]
    assert "Traceback" not in result.output and not CLASS_NAME.search(result.output)
    assert snapshot(ws) == before  # nothing changed, nothing added


def test_an_empty_api_key_in_the_environment_is_refused(ws, monkeypatch):
    """GPTCLI_API_KEY="" (a key meant, e.g. from an unset variable) is refused rather than
    served without one, before the model is read (no model here: a server never starts)."""
    monkeypatch.chdir(ws)
    monkeypatch.setenv("GPTCLI_API_KEY", "")
    result = run("serve", "--ckpt", "nowhere")
    assert result.exit_code == 2, result.output
    assert result.output.strip() == (
        "error: GPTCLI_API_KEY is set but empty; give it a key, or unset it to serve without one"
    )


def test_a_prompt_longer_than_the_context_is_cut_with_a_warning(ws, trained, monkeypatch):
    monkeypatch.chdir(ws)
    result = run("sample", "--ckpt", trained, "-p", "The fox dug a den. " * 4, "-n", "2")
    assert result.exit_code == 0
    assert (
        "warning: the prompt is 76 tokens, more than the model's block_size 16; kept its last 16"
        in result.output
    )


def test_running_out_of_memory_names_the_knob(ws, trained, monkeypatch):
    import torch

    from gptcli.train.trainer import Trainer

    def oom(self, resume=False, reporter=None):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(Trainer, "run", oom)
    monkeypatch.chdir(ws)
    result = run("pretrain", "corpus.txt", "--out", "oom-run")
    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: out of memory on the GPU: lower --batch-size (raise --grad-accum to keep the same batch) "
        "or --block-size, or train a smaller model"
    )


def test_debug_shows_the_traceback(ws, monkeypatch):
    import gptcli.cli.app as cli_app

    monkeypatch.setattr(cli_app, "_debug", False)
    monkeypatch.chdir(ws)
    result = run("--debug", "sample", "--ckpt", "nowhere")
    assert result.exit_code != 0
    from gptcli.errors import UsageError

    assert isinstance(result.exception, UsageError)  # raised through, for the traceback


def test_debug_shows_the_traceback_of_a_verb_that_cannot_be_made(monkeypatch):
    """A verb's module is imported after Click reads the command line, before the root's
    --debug is seen: the failure is still raised through with --debug, one line without."""
    import gptcli.cli.app as cli_app

    def broken(name):
        raise RuntimeError(f"cannot import {name}")

    monkeypatch.setattr(cli_app, "_debug", False)
    monkeypatch.setattr(cli_app, "verb_parts", broken)
    result = run("sample", "-h")
    assert result.exit_code == 1 and "cannot import sample" in result.output
    assert "run again with --debug" in result.output
    result = run("--debug", "sample", "-h")
    assert isinstance(result.exception, RuntimeError)  # raised through, for the traceback
    assert run("--help").exit_code == 0  # the other verbs are unaffected


def test_json_cut_short_is_named_once(tmp_path):
    """json's 'Unterminated string starting at' is not followed by a second 'at'."""
    from gptcli.data.inputs import read_json
    from gptcli.errors import UsageError

    (tmp_path / "c.json").write_text('{"format": "x')
    with pytest.raises(UsageError, match=r"\(not valid JSON: Unterminated string starting at line 1\); it"):
        read_json(tmp_path / "c.json", "it is damaged")


def test_json_that_gives_a_key_twice_is_refused(tmp_path):
    """A checkpoint.json (or any JSON file read whole) that says two things for one key."""
    from gptcli.data.inputs import read_json
    from gptcli.errors import UsageError

    (tmp_path / "c.json").write_text('{"model": {"n_layer": 2, "n_layer": 200}}')
    with pytest.raises(UsageError, match=r"not valid JSON: the key 'n_layer' appears twice\); it is damaged"):
        read_json(tmp_path / "c.json", "it is damaged")
