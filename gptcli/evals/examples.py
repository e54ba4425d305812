"""Reading evaluation records (lambada, choice) and turning them into scored sequences,
as lm-evaluation-harness does: the model reads encode(context), then the continuation's
tokens, which are those of encode(context + continuation) after the first
len(encode(context)); the context's trailing whitespace moves to the continuation."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gptcli.data.records import Record, read_records
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError


@dataclass
class Pair:
    """One (context, continuation) sequence to score: ids[:first] are the context's tokens,
    ids[first:] the continuation's."""

    ids: list[int]
    first: int
    cut: int  # context tokens dropped from the left to fit the block


def records(path: Path, limit: int | None) -> list[Record]:
    rows = read_records(path)
    return rows[:limit] if limit is not None else rows


def field(record: Record, *names: str) -> object:
    """The first of names the record has (HellaSwag's "ctx"/"endings" or gptcli's names)."""
    for name in names:
        if name in record.fields:
            return record.fields[name]
    raise UsageError(f"{record.source}: {' or '.join(repr(n) for n in names)} is missing")


def pair(tokenizer: Tokenizer, context: str, continuation: str, block_size: int, where: str) -> Pair:
    """The sequence context + continuation, cut from the left to block_size + 1 tokens (the
    model reads all but the last). As the harness does, whitespace that ends the context
    goes to the continuation (BPE joins a space to the word after it), and an empty context
    becomes the end-of-text token."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    try:
        ctx = tokenizer.encode(context)
        whole = tokenizer.encode(context + continuation)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    if not ctx:
        if tokenizer.eot_id is None:
            raise UsageError(
                f"{where}: the context is empty and the tokenizer has no end-of-text token to stand for it"
            )
        ctx, whole = [tokenizer.eot_id], [tokenizer.eot_id, *whole]
    first = len(ctx)
    if first >= len(whole):
        raise UsageError(f"{where}: the continuation {continuation!r} adds no token to the context")
    if len(whole) - first > block_size:
        raise UsageError(
            f"{where}: the continuation is {len(whole) - first} tokens; the model sees {block_size} "
            "at once, and needs at least one token of context before it"
        )
    ids = ctx + whole[first:]  # the harness feeds encode(context), then the continuation's tokens
    # the model reads all but the last token: block_size of them fit (the harness's
    # (context + continuation)[-(max_length + 1):][:-1])
    cut = max(0, len(ids) - (block_size + 1))
    return Pair(ids[cut:], first - cut, cut)


def cut_warning(path: Path, rows: list[Record], pairs: list[list[Pair]], block_size: int) -> str | None:
    """One line naming the first record whose context was cut to fit, and how many were."""
    cut = [(r, max(p.cut for p in ps)) for r, ps in zip(rows, pairs, strict=True) if any(p.cut for p in ps)]
    if not cut:
        return None
    record, n = cut[0]
    more = f" (and {len(cut) - 1} more records)" if len(cut) > 1 else ""
    return (
        f"{record.source}: context and continuation are longer than the model's {block_size} "
        f"tokens; dropped the first {n} context tokens{more}"
    )
