"""`gptcli tokenize` end to end, the CLI shell, and its error boundary."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gptcli.data.corpus import load_split, read_meta
from gptcli.data.tokenizer import load_tokenizer
from tests.helpers import assert_usage_error, make_corpus, run


def test_text_table_shows_positions_ids_and_visible_pieces():
    result = run("tokenize", "The rabbit dug a")
    assert result.exit_code == 0, result.output
    for fragment in ("464", "22746", "·rabbit", "·dug", "4 tokens", "gpt2"):
        assert fragment in result.output


def test_text_json():
    result = run("tokenize", "The rabbit dug a", "--json")
    assert result.exit_code == 0
    assert json.loads(result.output) == {
        "tokenizer": "gpt2",
        "ids": [464, 22746, 18735, 257],
        "pieces": ["The", " rabbit", " dug", " a"],
        "bytes": ["546865", "20726162626974", "20647567", "2061"],
    }
    # a character split over tokens: each token's exact bytes, which join to its UTF-8
    fox = json.loads(run("tokenize", "a 🦊", "--json").output)
    assert "".join(fox["bytes"]) == " ".join(["a", "🦊"]).encode().hex() and len(fox["bytes"]) == 4


def test_text_with_char_tokenizer_uses_the_texts_characters():
    data = json.loads(run("tokenize", "abba", "-t", "char", "--json").output)
    assert data == {
        "tokenizer": "char",
        "ids": [0, 1, 1, 0],
        "pieces": ["a", "b", "b", "a"],
        "bytes": ["61", "62", "62", "61"],
    }


def _docs(tmp_path: Path) -> tuple[Path, list[str]]:
    d = tmp_path / "docs"
    d.mkdir()
    texts = []
    for i in range(3):
        p = make_corpus(d / f"doc{i}.txt", n_sentences=150, seed=i)
        texts.append(p.read_text())
    (d / ".hidden").write_text("never read")
    return d, texts


@pytest.mark.parametrize("spec", ["char", "gpt2", "bpe:300"])
def test_corpus_shards_decode_to_the_input(tmp_path, spec):
    src, texts = _docs(tmp_path)
    out = tmp_path / "out"
    result = run("tokenize", src, "--out", out, "-t", spec, "--val-fraction", "0.2", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    tok = load_tokenizer(out)
    train, val = load_split(out, "train"), load_split(out, "val")
    assert train.dtype == np.uint16
    assert report["train_tokens"] == len(train) and report["val_tokens"] == len(val)
    decoded = tok.decode(train.tolist()) + tok.decode(val.tolist())
    if tok.eot_id is None:
        assert decoded == "".join(texts)
    else:  # every document ends with <|endoftext|>
        assert decoded == "".join(t + "<|endoftext|>" for t in texts)
    assert 0.15 < len(val) / (len(train) + len(val)) < 0.25
    assert read_meta(out).documents == 3
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]


def test_a_corpus_of_one_long_line_still_gets_a_val_split(tmp_path):
    """With no line boundary after the split point, the last document is cut there."""
    text = "the cat sat on the mat and the dog ran far away " * 200  # one line, no newline
    (tmp_path / "one.txt").write_text(text)
    result = run("tokenize", tmp_path / "one.txt", "--out", tmp_path / "out", "-t", "char", "--json")
    assert result.exit_code == 0, result.output
    train, val = load_split(tmp_path / "out", "train"), load_split(tmp_path / "out", "val")
    assert len(val) == round(0.1 * len(text)) and len(train) + len(val) == len(text) + 1  # + "\n"
    tok = load_tokenizer(tmp_path / "out")
    assert tok.decode(train.tolist()) + tok.decode(val.tolist()) == text + "\n"


def test_a_long_last_line_before_an_empty_file_still_gets_a_val_split(tmp_path):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "a.txt").write_text("the cat sat on the mat and the dog ran far away " * 200)
    (corpus / "b.txt").write_text("")  # an empty last document
    result = run("tokenize", corpus, "--out", tmp_path / "out", "-t", "char", "--json")
    assert result.exit_code == 0, result.output
    assert len(load_split(tmp_path / "out", "val")) > 0


def test_the_split_still_moves_to_a_line_boundary_in_a_later_chunk(tmp_path, monkeypatch):
    """Only the corpus's very last chunk is cut where the split falls; elsewhere the cut
    moves on to the next line boundary, even when it lies in the next chunk."""
    from gptcli.data import corpus as data

    text = "".join(f"line{i:03d} with a few more words on it\n" for i in range(60))
    (tmp_path / "lines.txt").write_text(text)
    chunk = data.iter_chunks
    monkeypatch.setattr(data, "iter_chunks", lambda pieces: chunk(pieces, 100))  # small chunks
    for split_char in range(1, len(text) - 50, 7):
        parts = {"train": "", "val": ""}
        for split, piece in data._split_stream([tmp_path / "lines.txt"], split_char, True, None, len(text)):
            parts[split] += piece or ""
        assert parts["train"] + parts["val"] == text
        assert parts["train"].endswith("\n") and parts["val"].startswith("line"), split_char


def test_large_vocabularies_use_uint32(tmp_path):
    # 70,000 distinct characters: more ids than uint16 holds
    text = "".join(chr(0x10000 + i) for i in range(70_000)) + "\n"
    (tmp_path / "wide.txt").write_text(text, encoding="utf-8")
    result = run("tokenize", tmp_path / "wide.txt", "--out", tmp_path / "out", "--val-fraction", "0")
    assert result.exit_code == 0, result.output
    train = load_split(tmp_path / "out", "train")
    assert train.dtype == np.uint32
    assert load_tokenizer(tmp_path / "out").decode(train.tolist()) == text


def test_same_corpus_twice_is_reused_and_a_different_one_refused(tmp_path, corpus):
    out = tmp_path / "out"
    assert run("tokenize", corpus, "--out", out).exit_code == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    again = run("tokenize", corpus, "--out", out)
    assert again.exit_code == 0 and "reused" in again.output

    other = make_corpus(tmp_path / "other.txt", seed=9)
    assert_usage_error(
        run("tokenize", other, "--out", out), "already holds a different tokenization", "--force"
    )
    assert_usage_error(run("tokenize", corpus, "--out", out, "-t", "gpt2"), "tokenizer char, not gpt2")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing touched

    assert run("tokenize", other, "--out", out, "--force").exit_code == 0
    assert load_tokenizer(out).decode(load_split(out, "train").tolist()) in other.read_text()


@pytest.mark.parametrize("damage", ["missing", "replaced"])
def test_a_tokenizer_missing_or_replaced_is_not_reused(damage, tmp_path, corpus):
    """The tokens mean nothing without the tokenizer they were written with: a directory
    whose tokenizer.json is gone, or is another one, is not "reused"; --force writes it anew."""
    out = tmp_path / "out"
    assert run("tokenize", corpus, "--out", out).exit_code == 0
    tok = out / "tokenizer.json"
    if damage == "missing":
        tok.unlink()
    else:
        other, text = tmp_path / "other", tmp_path / "o.txt"
        text.write_text("zebra quiz\n" * 50)
        assert run("tokenize", text, "--out", other).exit_code == 0
        assert (other / "tokenizer.json").read_bytes() != tok.read_bytes()
        tok.write_bytes((other / "tokenizer.json").read_bytes())
    assert_usage_error(
        run("tokenize", corpus, "--out", out), "tokenizer.json is missing or is not the one", "--force"
    )
    assert run("tokenize", corpus, "--out", out, "--force").exit_code == 0
    again = run("tokenize", corpus, "--out", out)
    assert again.exit_code == 0 and "reused" in again.output
    assert load_tokenizer(out).decode(load_split(out, "train").tolist()) in corpus.read_text()


def test_token_files_cut_short_are_never_trained_on_nor_reused(tmp_path, corpus, monkeypatch):
    from tests.helpers import TINY

    monkeypatch.setenv("GPTCLI_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "out"
    assert run("tokenize", corpus, "--out", out).exit_code == 0
    whole = (out / "train.bin").read_bytes()
    os.truncate(out / "train.bin", 3000)  # a whole number of ids, fewer than meta.json counts
    assert_usage_error(
        run("pretrain", out, "--out", tmp_path / "r", *TINY),
        "train.bin holds 1,500 ids where",
        "cut short or changed since",
        "--force",
    )
    assert not (tmp_path / "r").exists()
    assert_usage_error(run("tokenize", corpus, "--out", out), "token files are missing, cut short or changed")
    assert run("tokenize", corpus, "--out", out, "--force").exit_code == 0
    assert (out / "train.bin").read_bytes() == whole
    # the cache of raw text: encoded again, in silence
    assert run("pretrain", corpus, "--out", tmp_path / "a", *TINY, "--max-iters", "1").exit_code == 0
    (cached,) = (tmp_path / "cache" / "tokens").iterdir()
    os.truncate(cached / "train.bin", 3000)
    assert run("pretrain", corpus, "--out", tmp_path / "b", *TINY, "--max-iters", "1").exit_code == 0
    assert (cached / "train.bin").read_bytes() == whole


def test_tokenizer_from_a_data_dir(tmp_path, corpus):
    out = tmp_path / "bpe"
    assert run("tokenize", corpus, "--out", out, "-t", "bpe:300").exit_code == 0
    data = json.loads(run("tokenize", "The rabbit", "-t", out, "--json").output)
    assert data["tokenizer"] == "bpe:300"
    assert "".join(data["pieces"]) == "The rabbit"
    # and encoding another corpus with that same tokenizer
    result = run(
        "tokenize", make_corpus(tmp_path / "b.txt", seed=3), "--out", tmp_path / "b", "-t", out, "--json"
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["vocab_size"] == 300


def test_bad_input_is_one_line_and_exit_2(tmp_path, corpus):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(b"caf" + "é au lait".encode("latin-1"))
    binary = tmp_path / "blob.bin"
    binary.write_bytes(b"abc\x00\x01\x02")
    notempty = tmp_path / "busy"
    notempty.mkdir()
    (notempty / "mine.txt").write_text("keep me")
    emptydir = tmp_path / "emptydir"
    emptydir.mkdir()

    assert_usage_error(run("tokenize", tmp_path / "nope.txt", "--out", tmp_path / "o1"), "no such file")
    assert_usage_error(run("tokenize", empty, "--out", tmp_path / "o2"), "corpus is empty")
    assert_usage_error(run("tokenize", emptydir, "--out", tmp_path / "o2b"), "holds no text files")
    assert_usage_error(run("tokenize", latin1, "--out", tmp_path / "o3"), "invalid UTF-8", "byte offset 3")
    assert_usage_error(run("tokenize", binary, "--out", tmp_path / "o4"), "NUL byte", "byte offset 3")
    assert_usage_error(
        run("tokenize", corpus, "--out", tmp_path / "o5", "-t", "wordpiece"), "unknown tokenizer"
    )
    assert_usage_error(run("tokenize", corpus, "--out", notempty), "is not empty")
    assert_usage_error(
        run("tokenize", corpus, "--out", tmp_path / "o6", "--val-fraction", "1.5"), "val-fraction"
    )
    assert_usage_error(run("tokenize", corpus), "add --out")
    assert_usage_error(run("tokenize", "x", "-t", "bpe:512"), "trained on a corpus")
    assert_usage_error(run("tokenize", "x", "--no-such-flag"), "No such option", "gptcli tokenize --help")
    assert (notempty / "mine.txt").read_text() == "keep me"
    for name in ("o1", "o2", "o3", "o4", "o5", "o6"):
        assert not (tmp_path / name).exists()


def _python(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False)


def test_help_does_not_import_torch():
    code = (
        "import sys\n"
        "from gptcli.cli.app import app\n"
        "try:\n"
        "    app(['--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "verbs = ['tokenize', 'pretrain', 'finetune', 'sample', 'beam', 'inspect-attn', 'classify']\n"
        "verbs.append('export')\n"
        "for verb in verbs:\n"
        "    try:\n"
        "        app([verb, '--help'])\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = sorted(m for m in ('torch', 'numpy', 'tiktoken', 'transformers') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert "HEAVY []" in proc.stdout
    assert "tokenize" in proc.stdout
    assert "--json" in proc.stdout and "<bool>" not in proc.stdout  # flags take no value


def test_tokenizing_a_corpus_does_not_import_torch(tmp_path):
    (tmp_path / "c.txt").write_text("the fox dug a hole.\n" * 50)
    code = (
        "import sys\n"
        "from gptcli.cli.app import app\n"
        "try:\n"
        f"    app(['tokenize', {str(tmp_path / 'c.txt')!r}, '--out', {str(tmp_path / 'tok')!r}])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    proc = _python(code)
    assert proc.returncode == 0, proc.stderr
    assert "TORCH False" in proc.stdout and (tmp_path / "tok" / "train.bin").is_file()


def test_python_dash_m_and_version():
    proc = subprocess.run(
        [sys.executable, "-m", "gptcli", "--version"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and proc.stdout.startswith("gptcli ")


@pytest.mark.parametrize("spec", ["char", "gpt2"])
def test_jsonl_lines_are_documents(tmp_path, spec):
    texts = ["The fox dug a den.", "Ünïcödé story\nwith two lines", "The owl sat."]
    src = tmp_path / "stories.jsonl"
    src.write_text("\n".join(json.dumps({"text": t}) for t in texts) + "\n\n", encoding="utf-8")
    out = tmp_path / "out"
    result = run("tokenize", src, "--out", out, "-t", spec, "--val-fraction", "0", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["documents"] == 3
    tok = load_tokenizer(out)
    decoded = tok.decode(load_split(out, "train").tolist())
    sep = "<|endoftext|>" if spec == "gpt2" else "\n"  # no end-of-text token: a newline
    assert decoded == "".join(t + sep for t in texts)


def test_bad_jsonl_names_the_line(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "ok"}\n{"txt": "no text key"}\n', encoding="utf-8")
    assert_usage_error(run("tokenize", src, "--out", tmp_path / "o"), "bad.jsonl:2", '"text"')
    src.write_text('{"text": "ok"}\n{not json\n', encoding="utf-8")
    assert_usage_error(run("tokenize", src, "--out", tmp_path / "o"), "bad.jsonl:2", "not valid JSON")
    assert not (tmp_path / "o").exists()


def test_the_validation_split_starts_at_a_line_or_document_boundary(tmp_path):
    texts = [f"Story {i} is one long line about a fox, with no newline inside it." for i in range(40)]
    src = tmp_path / "stories.jsonl"
    src.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    plain = make_corpus(tmp_path / "plain.txt", n_sentences=200)
    for path, spec in [(src, "gpt2"), (plain, "char")]:
        out = tmp_path / f"out-{spec}"
        assert run("tokenize", path, "--out", out, "-t", spec, "--val-fraction", "0.25").exit_code == 0
        tok = load_tokenizer(out)
        val = tok.decode(load_split(out, "val").tolist())
        train = tok.decode(load_split(out, "train").tolist())
        if spec == "gpt2":
            assert train.endswith("<|endoftext|>") and val.startswith("Story ")
        else:
            assert train.endswith("\n") and val.startswith("The ")
        assert 0.15 < len(val) / (len(val) + len(train)) < 0.35


def test_concurrent_tokenizations_of_the_same_cache_entry(tmp_path):
    """Two processes filling the same cache entry at once both succeed, with the same files."""
    corpus = make_corpus(tmp_path / "c.txt", n_sentences=20_000)
    code = (
        "import sys; from gptcli.data.corpus import cached_corpus; "
        "d, r = cached_corpus([sys.argv[1]], 'char'); print(d, r.train_tokens)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).parents[1]),
        "GPTCLI_CACHE_DIR": str(tmp_path / "cache"),
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(corpus)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1].decode()[-500:] for o in outs]
    assert outs[0][0] == outs[1][0]
    entry = Path(outs[0][0].decode().split()[0])
    assert sorted(p.name for p in entry.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]


def test_texts_that_look_odd_as_paths_are_still_text():
    assert run("tokenize", "", "--json").exit_code == 0  # not the current directory
    long = " ".join(["word"] * 100)  # longer than a file name may be
    data = json.loads(run("tokenize", long, "--json").output)
    assert len(data["ids"]) == 100
    assert "0 tokens" in run("tokenize", "").output


def test_bytes_that_are_not_utf8_in_an_argument():
    # Python hands undecodable argv bytes over as lone surrogates: \xe9 -> \udce9
    assert_usage_error(run("tokenize", "caf\udce9"), "not valid UTF-8 (byte 0xE9 at character 3)")
    assert_usage_error(run("tokenize", "caf\udce9", "-t", "char"), "not valid UTF-8")


def test_pieces_that_look_like_markup_are_shown_as_they_are(capsys):
    from gptcli.cli import render

    render.token_table("bpe:9", 9, "a [/] [bold]b", [1, 2, 3], [b"a", b" [/]", b" [bold]b"])
    out = capsys.readouterr().out
    assert "·[/]" in out and "·[bold]b" in out


def test_a_directory_corpus_skips_what_gptcli_wrote_in_it(tmp_path, monkeypatch):
    """`gptcli pretrain .` in a project reads its text, not its runs (checkpoints, loss.png)
    nor its tokenized directories; a tokenized directory among text is refused."""
    from tests.helpers import TINY

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GPTCLI_CACHE_DIR", str(tmp_path / ".cache"))
    make_corpus(tmp_path / "c.txt")
    assert run("pretrain", ".", "--out", "runs/a", *TINY, "--max-iters", "1").exit_code == 0
    assert run("export", "runs/a", "exported").exit_code == 0
    Path("a.gguf").write_bytes(b"GGUF\3\0\0\0" + b"\0" * 64)  # (a char model has no GGUF export)
    Path("adapters").mkdir()  # what export --adapters-only writes
    Path("adapters/adapter_config.json").write_text("{}")
    Path("adapters/adapter_model.safetensors").write_bytes(b"\0" * 16)
    assert run("tokenize", ".", "--out", "data/t", "--json").exit_code == 0
    assert read_meta(Path("data/t")).files == ["c.txt"]
    again = run("tokenize", ".", "--out", "t2", "--json")  # runs/a, the exports and data/t: all skipped
    assert again.exit_code == 0, again.output
    assert (Path("t2/train.bin").read_bytes(), read_meta(Path("t2")).files) == (
        Path("data/t/train.bin").read_bytes(),
        ["c.txt"],
    )
    assert_usage_error(run("pretrain", "data/t", "c.txt", "--out", "runs/b"), "data/t holds tokens", "alone")
    # a folder of the user's that merely holds such file names is text like any other
    Path("notes").mkdir()
    Path("notes/metrics.jsonl").write_text('{"text": "the fox ran"}\n')
    with_notes = run("tokenize", ".", "--out", "t3", "--json")
    assert with_notes.exit_code == 0 and read_meta(Path("t3")).files == ["c.txt", "notes/metrics.jsonl"]
    from gptcli.store.checkpoint import FORMAT

    assert FORMAT == "gptcli-checkpoint"  # what data/corpus.py recognises a checkpoint by


def test_a_linked_folder_in_a_corpus_is_read_once(tmp_path):
    """A folder of data linked into a corpus directory is data (`find -L`); a link back up
    the tree is walked once, not forever."""
    real = tmp_path / "elsewhere"
    real.mkdir()
    make_corpus(real / "more.txt")
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    make_corpus(corpus / "c.txt", seed=1)
    (corpus / "linked").symlink_to(real)
    (corpus / "loop").symlink_to(corpus)
    (real / "back").symlink_to(real)
    result = run("tokenize", corpus, "--out", tmp_path / "t", "--json")
    assert result.exit_code == 0, result.output
    assert sorted(Path(f).name for f in read_meta(tmp_path / "t").files) == ["c.txt", "more.txt"]


def test_a_file_reached_twice_is_read_once(tmp_path):
    """The same file named twice, linked under another name, or inside a folder given beside
    its directory: read once (twice, its lines would be in the training split and again in
    the validation split)."""
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    make_corpus(corpus / "a.txt")
    make_corpus(corpus / "sub" / "b.txt", seed=1)
    (corpus / "same.txt").symlink_to(corpus / "a.txt")
    result = run("tokenize", corpus, corpus / "sub", corpus / "a.txt", "--out", tmp_path / "t", "--json")
    assert result.exit_code == 0, result.output
    assert sorted(Path(f).name for f in read_meta(tmp_path / "t").files) == ["a.txt", "b.txt"]


def test_the_cache_is_under_an_absolute_xdg_cache_home_and_ignores_a_relative_one(tmp_path, monkeypatch):
    """XDG_CACHE_HOME is taken only when absolute (the XDG spec): a relative one would put
    the cache wherever the command happens to run."""
    from gptcli.paths import cache_dir

    monkeypatch.delenv("GPTCLI_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "gptcli"
    monkeypatch.setenv("XDG_CACHE_HOME", "cache")
    assert cache_dir() == tmp_path / "home" / ".cache" / "gptcli"
    monkeypatch.setenv("GPTCLI_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
