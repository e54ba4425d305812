"""Tokens on screen: visible pieces, the token table, a tokenized corpus's counts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from gptcli.cli.render.console import out, text
from gptcli.messages import printable

_VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def visible_piece(raw: bytes) -> str:
    """A token's bytes as text with whitespace made visible; bytes that are only part of a
    UTF-8 character are shown as <0xNN>, other control characters escaped (\\x1b)."""
    piece = raw.decode("utf-8", errors="surrogateescape")
    return "".join(
        f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else _VISIBLE.get(c) or printable(c)
        for c in piece
    )


def token_table(
    tokenizer: str, vocab_size: int, text: str, ids: Sequence[int], pieces: Sequence[bytes]
) -> None:
    """Position, id and piece of every token, the text shaded token by token, and counts."""
    if out.is_terminal and ids:
        shades = ("on grey23", "on dark_blue")
        out.print(
            Text.assemble(*[(visible_piece(p), shades[i % 2]) for i, p in enumerate(pieces)]),
            soft_wrap=True,
        )
    table = Table(title=f"{tokenizer} tokens", title_justify="left", show_edge=False)
    table.add_column("pos", justify="right", style="dim")
    table.add_column("id", justify="right", style="cyan")
    table.add_column("piece", style="bold")
    for pos, (i, p) in enumerate(zip(ids, pieces, strict=True)):
        table.add_row(str(pos), str(i), Text(visible_piece(p)))
    out.print(table)
    ratio = f", {len(text) / len(ids):.2f} chars/token" if ids else ""
    out.print(
        f"{len(ids)} tokens, {len(text)} characters{ratio} "
        f"({tokenizer}, vocabulary {vocab_size:,}; · space, ↵ newline, → tab)"
    )


def tokenize_summary(report: Any, out_dir: str) -> None:
    """The counts of a tokenized corpus (a gptcli.data.TokenizeReport)."""
    table = Table(
        title=text(f"{'reused' if report.reused else 'wrote'} {out_dir}", "italic"),
        title_justify="left",
        show_header=False,
        show_edge=False,
    )
    table.add_column(style="dim")
    table.add_column(justify="right")
    rows = [
        ("files", f"{len(report.files):,}"),
        ("documents", f"{report.documents:,}"),
        ("characters", f"{report.chars:,}"),
        ("tokens", f"{report.tokens:,}"),
        ("  train.bin", f"{report.train_tokens:,}"),
        ("  val.bin", f"{report.val_tokens:,}"),
        ("chars / token", f"{report.chars_per_token:.2f}"),
        ("tokenizer", report.tokenizer),
        ("vocabulary", f"{report.vocab_size:,} ({report.dtype})"),
    ]
    if not report.reused:
        rows += [("time", f"{report.seconds:.2f} s"), ("speed", f"{report.mb_per_s:.1f} MB/s")]
    for k, v in rows:
        table.add_row(k, text(v))
    out.print(table)
