"""bench case: `gptcli tokenize` of the same documents as JSONL, gzip and zstd JSONL, and Parquet."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from bench.common import Result, generated_text, scratch


def run(args) -> list[Result]:
    """`gptcli tokenize` of the same documents as JSONL, gzip and zstd JSONL, and Parquet
    (and the same text as .txt, .txt.gz, .txt.zst): MB of text per second, each against
    the plain file in the same run; formats interleaved, the best of the repeats kept."""
    from gptcli.data.corpus import tokenize_corpus
    from gptcli.data.sources import Reader

    work = scratch("gptcli-bench-")
    seed = (args.corpus.read_text(encoding="utf-8") if args.corpus else None) or generated_text()
    lines = [ln for ln in seed.splitlines() if ln.strip()]
    size = (5 if args.quick else 25) * 1_000_000
    docs, total = [], 0
    while total < size:
        doc = "\n".join(lines[len(docs) * 7 % len(lines) :][:7])
        docs.append(doc)
        total += len(doc.encode())
    paths = _write(work, docs)

    def rate(path: Path) -> float:
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        tokenize_corpus([path], out, "gpt2", reader=Reader())
        return total / 1e6 / (time.perf_counter() - t0)

    runs: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(args.repeats):
        for k, p in paths.items():
            runs[k].append(rate(p))
    shutil.rmtree(work, ignore_errors=True)
    results = []
    for k, base in (
        ("jsonl.gz", "jsonl"),
        ("jsonl.zst", "jsonl"),
        ("parquet", "jsonl"),
        ("txt.gz", "txt"),
        ("txt.zst", "txt"),
    ):
        ours, plain = max(runs[k]), max(runs[base])  # the best run of each: the least disturbed
        what = "the same documents as plain .jsonl" if base == "jsonl" else "the same text as plain .txt"
        results.append(
            Result(
                f"tokenize {total / 1e6:.0f} MB as .{k} (GPT-2 BPE)",
                ours,
                plain,
                "MB/s",
                what,
                ">= 0.9x",
                ours / plain >= 0.9,
            )
        )
    return results


def _write(work: Path, docs: list[str]) -> dict[str, Path]:
    """The documents as JSONL (plain, gzip, zstd) and Parquet, and their text as one plain
    text document (plain, gzip, zstd)."""
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    blob = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    text = "\n".join(docs).encode()  # the same text as one plain-text document
    paths = {}
    for name, data in (("jsonl", blob), ("txt", text)):
        paths[name] = work / f"d.{name}"
        paths[name].write_bytes(data)
        paths[f"{name}.gz"] = work / f"d.{name}.gz"
        paths[f"{name}.gz"].write_bytes(gzip.compress(data, compresslevel=6))
        paths[f"{name}.zst"] = work / f"d.{name}.zst"
        paths[f"{name}.zst"].write_bytes(zstandard.ZstdCompressor(level=3).compress(data))
    paths["parquet"] = work / "d.parquet"
    pq.write_table(pa.table({"text": docs}), paths["parquet"])
    return paths
