"""What decoding and classification show: streamed text, samples, next-token (or label)
probability tables with bars, beam hypotheses, and predictions over a file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from gptcli.cli.render.console import out, text
from gptcli.messages import printable


def stream_text(piece: str, style: str = "") -> None:
    """Print text with no newline, at once (streaming generation)."""
    out.print(piece, end="", style=style, soft_wrap=True, markup=False, highlight=False)
    out.file.flush()


def sample_text(prompt: str, continuation: str, index: int | None = None) -> None:
    """A prompt (dimmed) and its continuation (bright)."""
    if index is not None:
        out.rule(f"sample {index}", style="dim")
    out.print(Text.assemble((printable(prompt), "dim"), (printable(continuation), "bold")), soft_wrap=True)


def _bar(prob: float, width: int = 24) -> str:
    full = prob * width
    return "█" * int(full) + ("▌" if full - int(full) >= 0.5 else "")


def probs_table(
    context: str,
    rows: Sequence[tuple[Any, ...]],
    title: str | None = None,
    column: str = "token",
    sampling: str | None = None,
) -> None:
    """The most likely next tokens (or labels) after context: (rank, name, probability,
    chosen) rows, with bars; the chosen one is marked. With `sampling` (how sampling
    reshaped the distribution, e.g. "T=0.7, top-k 3"), rows carry a fifth value, q, the
    probability the token was drawn with, shown beside the model's p."""
    table = Table(
        title=title
        or Text.assemble(("…" if len(context) > 48 else "", "dim"), (printable(context[-48:]), "dim"), " →"),
        title_justify="left",
        caption=f"p: model, q: drawn from ({sampling})" if sampling else None,
        caption_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("#", justify="right", style="dim")
    table.add_column(column)
    table.add_column("p" if sampling else "prob", justify="right")
    if sampling:
        table.add_column("q", justify="right")
    table.add_column("", style="green")
    for rank, piece, prob, chosen, *q in rows:
        cells = [str(rank), text(piece, "bold green" if chosen else ""), f"{prob:.4f}"]
        if sampling:
            cells.append(f"{q[0]:.4f}")
        table.add_row(*cells, _bar(prob) + (" ◀" if chosen else ""))
    out.print(table)


# --- beam search ---------------------------------------------------------------------------


def beam_table(prompt: str, rows: Sequence[dict[str, Any]]) -> None:
    """The n-best hypotheses: rank, text (prompt dimmed, continuation bright), total
    log-probability, length-normalised score, length, and whether it ended."""
    table = Table(show_edge=False, pad_edge=False, title="beam search", title_justify="left")
    table.add_column("#", justify="right", style="dim")
    table.add_column("text", ratio=1)
    table.add_column("log p", justify="right")
    table.add_column("score", justify="right", style="bold")
    table.add_column("len", justify="right")
    table.add_column("ended", justify="center")
    for rank, r in enumerate(rows, 1):
        table.add_row(
            str(rank),
            Text.assemble((printable(prompt), "dim"), (printable(r["text"]), "bold")),
            f"{r['logprob']:.3f}",
            f"{r['score']:.4f}",
            str(len(r["ids"])),
            "✓" if r["finished"] else "✗",
        )
    out.print(table)


def predictions_table(
    rows: Sequence[tuple[str, str, float, str | None]], accuracy: float | None, column: str = "label"
) -> None:
    """(input text, predicted label or choice, its probability, the true one or None) per
    record, and the accuracy over the labelled ones."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("text", ratio=1, overflow="ellipsis", no_wrap=True)
    table.add_column(f"predicted {column}")
    table.add_column("prob", justify="right")
    table.add_column("true")
    for i, (record, predicted, prob, true) in enumerate(rows, 1):
        mark = "" if true is None else (" ✓" if true == predicted else " ✗")
        style = "" if true is None else ("green" if true == predicted else "red")
        table.add_row(
            str(i),
            text(record, limit=500),
            text(predicted, style, 200),
            f"{prob:.3f}",
            text(f"{true or ''}{mark}"),
        )
    out.print(table)
    if accuracy is not None:
        labelled = sum(true is not None for *_, true in rows)
        out.print(f"accuracy {accuracy:.4f} ({round(accuracy * labelled)}/{labelled})")
