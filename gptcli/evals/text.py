"""--task text: perplexity and bits per byte/character of a text (WikiText, PTB, enwik8).

The text is tokenized as a whole, after an end-of-text token where the tokenizer has one
(a .jsonl file: one document per line, each after its own end-of-text token, as `gptcli
tokenize` reads them; a .csv file: one per row of its "text" column). Sliding windows as
in Hugging Face's perplexity guide, with max_length = block_size: window k is
ids[k*S : k*S + block_size], and it scores only the tokens no earlier window scored, each
from the tokens before it in its window. With S = block_size the windows do not overlap
and each window's first token is context only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch.nn as nn

from gptcli.data.records import read_records
from gptcli.data.sources import iter_documents, kind_of
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.evals.result import Result
from gptcli.evals.scoring import Progress, score


@dataclass
class Encoded:
    """A text's token ids, and how many UTF-8 bytes and characters each token carries."""

    ids: list[int]
    nbytes: np.ndarray  # (len(ids),)
    nchars: np.ndarray  # (len(ids),): a character counts for the token holding its last byte


def encode_text(path: Path, tokenizer: Tokenizer) -> Encoded:
    ids: list[int] = []
    nbytes: list[np.ndarray] = []
    nchars: list[np.ndarray] = []
    eot = tokenizer.eot_id
    csv = path.suffix.lower() == ".csv"
    records = csv or kind_of(path) == "jsonl"
    docs = _csv_texts(path) if csv else ["".join(d) for d in iter_documents(path)]
    if not any(docs):  # (not one token to predict, whatever a document's start adds)
        what = "every text in it is empty" if records and docs else "the file is empty"
        raise UsageError(f"{path}: no text to score ({what})")
    if eot is None and len(docs) > 1:  # documents end with a newline where no token separates them
        docs = [d if d.endswith("\n") else d + "\n" for d in docs]
    for doc in docs:
        if eot is not None:
            ids.append(eot)
            nbytes.append(np.zeros(1, np.int64))
            nchars.append(np.zeros(1, np.int64))
        try:
            doc_ids = tokenizer.encode(doc)
        except UsageError as e:
            raise UsageError(f"{path}: {e}") from None
        b, c = _bytes_and_chars(doc, tokenizer.byte_lengths()[doc_ids], path)
        ids += doc_ids
        nbytes.append(b)
        nchars.append(c)
    if not ids:
        raise UsageError(f"{path}: no text to score")
    return Encoded(ids, np.concatenate(nbytes), np.concatenate(nchars))


def _csv_texts(path: Path) -> list[str]:
    """A CSV's "text" column, a document a row, as a JSONL file's "text" fields (not the
    file as text: its header, commas and labels are no text to score)."""
    rows = read_records(path)
    if "text" not in rows[0].fields:
        raise UsageError(
            f"{path}: no 'text' column (it has {', '.join(map(repr, rows[0].fields))}); "
            "--task text scores a CSV's text column"
        )
    return [r.fields["text"] for r in rows]


def _bytes_and_chars(text: str, nbytes: np.ndarray, path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The bytes (given) and characters of each token of text."""
    data = text.encode("utf-8")
    if nbytes.sum() != len(data):
        raise UsageError(
            f"{path}: the tokenizer does not reproduce the text byte for byte; cannot count bytes"
        )
    raw = np.frombuffer(data, np.uint8)
    starts = np.flatnonzero((raw & 0xC0) != 0x80)  # bytes that begin a character
    char_ends = np.append(starts[1:], len(data))  # byte offset after each character
    token_ends = np.cumsum(nbytes)
    # the token holding each character's last byte: the first token ending at or after it
    owner = np.searchsorted(token_ends, char_ends, side="left")
    return nbytes, np.bincount(owner, minlength=len(nbytes)).astype(np.int64)


def windows(n: int, block_size: int, stride: int) -> list[tuple[int, int, int]]:
    """(begin, end, first scored index within the window) of each window over n tokens."""
    out, prev_end, begin = [], 0, 0
    while True:
        end = min(begin + block_size, n)
        width = end - begin
        out.append((begin, end, max(1, width - (end - prev_end))))
        prev_end = end
        if end == n:
            return out
        begin += stride


def evaluate_text(
    model: nn.Module,
    tokenizer: Tokenizer,
    path: Path,
    stride: int | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Result:
    """{"task": "text", "tokens", "bytes", "chars", "nll", "ppl", "bpb", "bpc"} (nll in nats
    per scored token; bpb, bpc: the total in bits over the scored bytes, characters).
    limit: score the first windows only."""
    block = model.config.block_size
    stride = block if stride is None else stride
    if not 1 <= stride <= block:
        raise UsageError(f"--stride {stride}: use 1 to the model's block_size {block}")
    enc = encode_text(path, tokenizer)
    if len(enc.ids) < 2:
        raise UsageError(f"{path}: one token; there is nothing to predict")
    spans = windows(len(enc.ids), block, stride)[:limit]
    seqs = [enc.ids[b:e] for b, e, _ in spans]
    results = score(model, seqs, [f for _, _, f in spans], progress)
    scored = np.concatenate([np.arange(b + f, e) for b, e, f in spans])
    nll = -sum(float(r.logprobs.sum()) for r in results)
    n, nbytes, nchars = len(scored), int(enc.nbytes[scored].sum()), int(enc.nchars[scored].sum())
    bits = nll / math.log(2)
    return Result(
        {
            "task": "text",
            "tokens": n,
            "bytes": nbytes,
            "chars": nchars,
            "nll": nll / n,
            "ppl": math.exp(nll / n),
            "bpb": bits / nbytes if nbytes else None,
            "bpc": bits / nchars if nchars else None,
        }
    )
