"""Corpora as users keep them: compressed text and JSONL, Parquet shards. The same
documents give byte-identical token shards whatever the file format."""

from __future__ import annotations

import builtins
import gzip
import importlib
import json
from pathlib import Path

import pytest

from gptcli.errors import UsageError
from tests.helpers import TINY, assert_usage_error, make_corpus, run

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstd = pytest.importorskip("zstandard")


@pytest.fixture
def docs(tmp_path) -> list[str]:
    lines = make_corpus(tmp_path / "c.txt", n_sentences=120).read_text().splitlines()
    return [" ".join(lines[i : i + 3]) + ("\n\n  ünïcode ✓" if i % 9 == 0 else "") for i in range(0, 120, 3)]


def write_all(tmp_path: Path, docs: list[str]) -> dict[str, Path]:
    jsonl = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    text = "\n".join(docs).encode()
    out = {
        "plain.jsonl": jsonl,
        "gz.jsonl.gz": gzip.compress(jsonl),
        "zst.jsonl.zst": zstd.ZstdCompressor().compress(jsonl),
        # frames one after another (zstd -c a b > ab.zst), cut mid-document
        "frames.jsonl.zst": b"".join(
            zstd.ZstdCompressor().compress(jsonl[i : i + 1000]) for i in range(0, len(jsonl), 1000)
        ),
        "plain.txt": text,
        "gz.txt.gz": gzip.compress(text),
        "zst.txt.zst": zstd.ZstdCompressor().compress(text),
    }
    for name, blob in out.items():
        (tmp_path / name).write_bytes(blob)
    table = pa.table({"id": list(range(len(docs))), "body": docs})
    pq.write_table(table, tmp_path / "shard.parquet", row_group_size=7)  # several row groups
    return {name: tmp_path / name for name in [*out, "shard.parquet"]}


@pytest.mark.parametrize("tokenizer", ["char", "bpe:300"])
def test_every_format_gives_the_same_shards(tmp_path, docs, tokenizer):
    paths = write_all(tmp_path, docs)
    shards = {}
    for name, path in paths.items():
        extra = ["--text-column", "body"] if name.endswith(".parquet") else []
        result = run("tokenize", path, "--out", tmp_path / f"tok-{name}", "-t", tokenizer, *extra, "--json")
        assert result.exit_code == 0, result.output
        out = tmp_path / f"tok-{name}"
        shards[name] = ((out / "train.bin").read_bytes(), (out / "val.bin").read_bytes())
        assert json.loads(result.stdout)["documents"] == (
            1 if name.endswith((".txt", ".gz", ".zst")) and ".txt" in name else len(docs)
        )
    documents = {k: v for k, v in shards.items() if "jsonl" in k or k.endswith(".parquet")}
    assert len(set(documents.values())) == 1, "JSONL, compressed JSONL and Parquet differ"
    texts = {k: v for k, v in shards.items() if ".txt" in k}
    assert len(set(texts.values())) == 1, "text and compressed text differ"


def test_pretrain_reads_parquet_with_a_text_column(tmp_path, docs, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_all(tmp_path, docs)
    result = run(
        "pretrain", "shard.parquet", "--text-column", "body", "--out", "r", *TINY, "--max-iters", "3"
    )
    assert result.exit_code == 0, result.output
    assert "text_column: body" in Path("r/config.yaml").read_text()


def test_bad_rows_and_damaged_files_get_one_line(tmp_path, docs):
    pq.write_table(pa.table({"text": ["fine", None, "also fine"]}), tmp_path / "nulls.parquet")
    assert_usage_error(
        run("tokenize", tmp_path / "nulls.parquet", "--out", tmp_path / "o1"), "nulls.parquet:row 2", "null"
    )
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "ints.parquet")
    assert_usage_error(
        run("tokenize", tmp_path / "ints.parquet", "--out", tmp_path / "o2"),
        "ints.parquet:row 1",
        "not a string",
    )
    write_all(tmp_path, docs)
    assert_usage_error(
        run("tokenize", tmp_path / "shard.parquet", "--out", tmp_path / "o3"),
        "no column 'text'",
        "id, body",
        "--text-column",
    )
    blob = (tmp_path / "gz.jsonl.gz").read_bytes()
    (tmp_path / "cut.jsonl.gz").write_bytes(blob[: len(blob) // 2])
    assert_usage_error(
        run("tokenize", tmp_path / "cut.jsonl.gz", "--out", tmp_path / "o4"), "cut.jsonl.gz", "gzip"
    )
    for name in ("zst.txt.zst", "zst.jsonl.zst"):  # cut inside a frame: refused as gzip is, not read short
        blob = (tmp_path / name).read_bytes()
        (tmp_path / f"cut-{name}").write_bytes(blob[: len(blob) // 2])
        assert_usage_error(
            run("tokenize", tmp_path / f"cut-{name}", "--out", tmp_path / "o8"),
            f"cut-{name}: not a complete zstd file (it ends inside a frame)",
        )
    (tmp_path / "fake.txt.zst").write_bytes(b"not zstd at all")
    assert_usage_error(
        run("tokenize", tmp_path / "fake.txt.zst", "--out", tmp_path / "o5"), "fake.txt.zst", "zstd"
    )
    (tmp_path / "fake.parquet").write_bytes(b"PAR1 nope")
    assert_usage_error(
        run("tokenize", tmp_path / "fake.parquet", "--out", tmp_path / "o6"), "fake.parquet", "Parquet"
    )
    bad_json = gzip.compress(b'{"text": "ok"}\n{"text": 5}\n')
    (tmp_path / "bad.jsonl.gz").write_bytes(bad_json)
    assert_usage_error(run("tokenize", tmp_path / "bad.jsonl.gz", "--out", tmp_path / "o7"), "bad.jsonl.gz:2")
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 9))


def test_a_missing_extra_is_named(tmp_path, docs, monkeypatch):
    write_all(tmp_path, docs)
    real_import, real_import_module = builtins.__import__, importlib.import_module

    def no_optional(name, *args, **kwargs):
        if name.startswith(("pyarrow", "zstandard")):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    def no_optional_module(name, package=None):
        if name.startswith(("pyarrow", "zstandard")):
            raise ImportError(name)
        return real_import_module(name, package)

    monkeypatch.setattr(builtins, "__import__", no_optional)
    monkeypatch.setattr("importlib.import_module", no_optional_module)
    out = run("tokenize", tmp_path / "zst.txt.zst", "--out", tmp_path / "o")
    assert_usage_error(out, "pip install 'gptcli[zstd]'")
    out = run("tokenize", tmp_path / "shard.parquet", "--out", tmp_path / "o")
    assert_usage_error(out, "pip install 'gptcli[parquet]'")


@pytest.mark.parametrize("isal", [True, False], ids=["isal", "stdlib"])
def test_gzip_reads_alike_with_and_without_the_gzip_extra(tmp_path, monkeypatch, isal):
    """The gzip extra (ISA-L) only makes .gz faster: the same text from several gzip
    members, and the same one-line errors for a cut file and a file that is not gzip."""
    from gptcli.data.sources import iter_file_text

    if isal:
        pytest.importorskip("isal")
    else:
        real_import = builtins.__import__

        def no_isal(name, *args, **kwargs):
            if name.startswith("isal"):
                raise ImportError(name)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", no_isal)
    text = "".join(f"line {i} ünï ✓\n" for i in range(50_000))
    members = gzip.compress(text[:1000].encode()) + gzip.compress(text[1000:].encode())
    (tmp_path / "two.txt.gz").write_bytes(members)
    assert "".join(iter_file_text(tmp_path / "two.txt.gz")) == text
    blob = gzip.compress(text.encode())
    (tmp_path / "cut.txt.gz").write_bytes(blob[: len(blob) // 2])
    (tmp_path / "fake.txt.gz").write_bytes(b"plain text, not gzip")
    for name in ("cut.txt.gz", "fake.txt.gz"):
        with pytest.raises(UsageError, match=f"{name}: not a complete gzip file"):
            "".join(iter_file_text(tmp_path / name))


def test_a_zstd_file_that_expands_a_thousandfold_is_read_in_bounded_memory():
    """zstandard's decompressobj gives all a piece of input holds at once (a 4-byte block
    may hold 128 KiB): fed a slice at a time, the reader never holds more than 16 MiB."""
    import io

    from gptcli.data.sources import _Zstd

    c = zstd.ZstdCompressor().compressobj()
    blob = b"".join(c.compress(b"the same line\n" * (1 << 16)) for _ in range(300)) + c.flush()
    assert len(blob) < 200_000  # 275 MB of text
    reader = _Zstd(zstd.ZstdDecompressor(), io.BytesIO(blob))
    buffer, total, most = bytearray(1 << 20), 0, 0
    while n := reader.readinto(buffer):
        total, most = total + n, max(most, len(reader.pending))
    assert total == 300 * 14 * (1 << 16) and most <= 16 << 20
