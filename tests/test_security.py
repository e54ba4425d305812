"""Safe loading: a pickle that would run code is refused wherever a file is loaded, configs
are data, and nothing reaches the network."""

from __future__ import annotations

import os
import pickle
import shutil
import socket
from pathlib import Path

import pytest

from tests.helpers import run


class Payload:
    """Unpickling this would create a file: the proof that code ran."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def evil_bytes(marker: Path) -> bytes:
    return pickle.dumps({"weights": Payload(marker)})


@pytest.mark.parametrize(
    ("target", "verb"),
    [
        ("best/model.safetensors", ["sample", "--ckpt", "{run}", "-n", "2"]),
        ("best/tokenizer.json", ["sample", "--ckpt", "{run}", "-n", "2"]),
        ("best/checkpoint.json", ["inspect-attn", "The", "--ckpt", "{run}"]),
        ("last/train_state.safetensors", ["pretrain", "--resume", "--out", "{run}", "--max-iters", "200"]),
        ("last/train_state.json", ["pretrain", "--resume", "--out", "{run}", "--max-iters", "200"]),
    ],
)
def test_a_pickle_in_place_of_a_file_is_refused_and_not_run(trained, tmp_path, monkeypatch, target, verb):
    run_dir = tmp_path / "run"
    shutil.copytree(trained, run_dir)
    marker = tmp_path / "pwned"
    (run_dir / target).write_bytes(evil_bytes(marker))
    monkeypatch.chdir(tmp_path)
    result = run(*[a.format(run=run_dir) for a in verb])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and "Traceback" not in result.output
    assert not marker.exists()


def test_a_pickled_tokenizer_for_tokenize_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "tokenizer.json").write_bytes(evil_bytes(marker))
    result = run("tokenize", "hello", "-t", str(tmp_path / "tokenizer.json"))
    assert result.exit_code == 2 and "not valid JSON" in result.output
    assert not marker.exists()


def test_yaml_configs_cannot_run_code(tmp_path):
    marker = tmp_path / "pwned"
    (tmp_path / "c.yaml").write_text(f"model: !!python/object/apply:os.system ['touch {marker}']\n")
    (tmp_path / "c.txt").write_text("some text\n" * 100)
    result = run("pretrain", str(tmp_path / "c.txt"), "-c", str(tmp_path / "c.yaml"))
    assert result.exit_code == 2 and "not valid YAML" in result.output
    assert not marker.exists()


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"network access attempted: {args}")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)


def test_no_verb_reaches_the_network(trained, tmp_path, no_network):
    (tmp_path / "c.txt").write_text("The rabbit dug a hole.\n" * 200)
    out = tmp_path / "tok"
    commands = [
        ["tokenize", "The rabbit dug a", "-t", "gpt2"],
        ["tokenize", str(tmp_path / "c.txt"), "--out", str(out), "-t", "gpt2"],
        ["sample", "--ckpt", str(trained), "-n", "3"],
        ["beam", "The", "--ckpt", str(trained), "-n", "3"],
        ["inspect-attn", "The", "--ckpt", str(trained)],
        ["export", str(trained), str(tmp_path / "hf")],
    ]
    for args in commands:
        result = run(*args)
        assert result.exit_code == 0, (args, result.output)
