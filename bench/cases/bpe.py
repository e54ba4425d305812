"""bench case: GPT-2 BPE encoding MB/s of text against tiktoken on one thread."""

from __future__ import annotations

import shutil
import statistics
import time

from bench.common import Result, generated_text, scratch


def run(args) -> list[Result]:
    from gptcli.data.corpus import tokenize_corpus
    from gptcli.data.tokenizer import gpt2_tokenizer

    work = scratch("gptcli-bench-")
    seed = (args.corpus.read_text(encoding="utf-8") if args.corpus else None) or generated_text()
    size = (10 if args.quick else 50) * 1_000_000
    text = (seed * (size // len(seed.encode()) + 1))[:size]
    src = work / "corpus.txt"
    src.write_text(text, encoding="utf-8")
    n = len(text.encode())
    enc = gpt2_tokenizer().enc

    def peer() -> float:
        t0 = time.perf_counter()
        enc.encode_ordinary(text)
        return n / 1e6 / (time.perf_counter() - t0)

    def ours() -> float:
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        tokenize_corpus([src], out, "gpt2")  # read, check, encode, write train/val shards
        return n / 1e6 / (time.perf_counter() - t0)

    ours_runs, peer_runs = [], []
    for _ in range(args.repeats):
        ours_runs.append(ours())
        peer_runs.append(peer())
    shutil.rmtree(work, ignore_errors=True)
    o, p = statistics.median(ours_runs), statistics.median(peer_runs)
    return [
        Result(
            f"GPT-2 BPE encoding, {size // 1_000_000} MB corpus",
            o,
            p,
            "MB/s",
            "tiktoken encode_ordinary, 1 thread",
            ">= 1.7x",
            o / p >= 1.7,
            ["ours: `gptcli tokenize --out` end to end (hash, split, encode, write shards)"],
        )
    ]
