"""What decoding and classification show: streamed text, samples, next-token (or label)
probability tables with bars, beam hypotheses, and predictions over a file."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
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


def _cells(cell: str | Text) -> int:
    """Columns a cell takes on screen (a CJK character or an emoji takes two)."""
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)


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
    probability the token was drawn with, shown beside the model's p. A terminal too narrow
    for the table and a bar gets a line per row, its token whole."""
    heading = title or Text.assemble(
        ("…" if len(context) > 48 else "", "dim"), (printable(context[-48:]), "dim"), " →"
    )
    caption = f"p: model, q: drawn from ({sampling})" if sampling else None
    table = Table(
        title=heading,
        title_justify="left",
        caption=caption,
        caption_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("#", justify="right", style="dim", no_wrap=True)
    table.add_column(column)
    table.add_column("p" if sampling else "prob", justify="right", no_wrap=True)
    if sampling:
        table.add_column("q", justify="right", no_wrap=True)
    table.add_column("", style="green", no_wrap=True)
    body = [
        [str(rank), text(piece, "bold green" if chosen else ""), f"{prob:.4f}"]
        + ([f"{q[0]:.4f}"] if sampling else [])
        for rank, piece, prob, chosen, *q in rows
    ]
    # the bars as long as the terminal leaves them, so that the chosen row's ◀ stays on its row
    # (each column but the outer ones is padded by a space each side, with a rule between)
    headers = [str(c.header) for c in table.columns]
    widths = [max(cell_len(headers[i]), *(_cells(r[i]) for r in body)) for i in range(len(body[0]))]
    room = out.width - sum(widths) - 3 * len(widths) - 2
    if room < 4:
        out.print(heading if isinstance(heading, Text) else Text(heading, style="italic"))
        for cells, (_, _, _, chosen, *_) in zip(body, rows, strict=True):
            rank, piece, p, *q = cells  # (figures with no space inside: a wrap never parts them)
            figures = f"p={p}" + (f" q={q[0]}" if q else "") if sampling else p
            mark = (" ◀" if chosen else "", "green")
            out.print(Text.assemble((f"{rank}. ", "dim"), piece, mark, f" {figures}"))
        if caption:
            out.print(Text(caption, style="dim italic"))
        return
    bar = min(24, room)
    for cells, (_, _, prob, chosen, *_) in zip(body, rows, strict=True):
        table.add_row(*cells, _bar(prob, bar) + (" ◀" if chosen else ""))
    out.print(table)


# --- beam search ---------------------------------------------------------------------------


def beam_table(prompt: str, rows: Sequence[dict[str, Any]]) -> None:
    """The n-best hypotheses: rank, text (prompt dimmed, continuation bright), total
    log-probability, length-normalised score, length, and whether it ended. A terminal too
    narrow for the table gets a line of figures and the text below it, per hypothesis."""
    figures = [
        (str(i), f"{r['logprob']:.3f}", f"{r['score']:.4f}", str(len(r["ids"])), "✓✗"[not r["finished"]])
        for i, r in enumerate(rows, 1)
    ]
    headers = ("#", "log p", "score", "len", "ended")
    widths = [max(len(h), *(len(f[i]) for f in figures)) for i, h in enumerate(headers)]
    texts = [Text.assemble((printable(prompt), "dim"), (printable(r["text"]), "bold")) for r in rows]
    if out.width - sum(widths) - 3 * len(widths) < 16:  # numbers are never cut; the text wraps
        out.print(Text("beam search", style="italic"))
        for (rank, logp, score, length, ended), line in zip(figures, texts, strict=True):
            out.print(Text(f"{rank}. log p {logp}, score {score}, len {length}, ended {ended}", style="bold"))
            out.print(line)
        return
    table = Table(show_edge=False, pad_edge=False, title="beam search", title_justify="left")
    table.add_column("#", justify="right", style="dim", no_wrap=True)
    table.add_column("text", ratio=1, overflow="fold")  # (text without spaces, CJK's, folds: none is lost)
    table.add_column("log p", justify="right", no_wrap=True)
    table.add_column("score", justify="right", style="bold", no_wrap=True)
    table.add_column("len", justify="right", no_wrap=True)
    table.add_column("ended", justify="center", no_wrap=True)
    for (rank, *numbers), line in zip(figures, texts, strict=True):
        table.add_row(rank, line, *numbers)
    out.print(table)


def predictions_table(
    rows: Sequence[tuple[str, str, float, str | None]], accuracy: float | None, column: str = "label"
) -> None:
    """(input text, predicted label or choice, its probability, the true one or None) per
    record, and the accuracy over the labelled ones."""
    cells = []
    for i, (_, predicted, prob, true) in enumerate(rows, 1):
        mark = "" if true is None else (" ✓" if true == predicted else " ✗")
        style = "" if true is None else ("green" if true == predicted else "red")
        true_cell = text(f"{true or ''}{mark}", limit=40)
        cells.append((str(i), text(predicted, style, 40), f"{prob:.3f}", true_cell))
    headers = ("#", f"predicted {column}", "prob", "true")
    widths = [max([cell_len(h), *(cell_len(str(c[n])) for c in cells)]) for n, h in enumerate(headers)]
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="dim", no_wrap=True, min_width=widths[0])
    # the text gets what the other columns leave (each " │ " apart): a long one is cut, they never are
    room = max(12, out.width - sum(widths) - 3 * len(widths))
    table.add_column("text", overflow="ellipsis", no_wrap=True, max_width=room)
    for header, width, justify in zip(headers[1:], widths[1:], ("left", "right", "left"), strict=True):
        table.add_column(header, justify=justify, no_wrap=True, min_width=width)  # type: ignore[arg-type]
    for (record, *_), (i, predicted, prob, true) in zip(rows, cells, strict=True):
        table.add_row(i, text(record, limit=500), predicted, prob, true)
    out.print(table)
    if accuracy is not None:
        labelled = sum(true is not None for *_, true in rows)
        out.print(f"accuracy {accuracy:.4f} ({round(accuracy * labelled)}/{labelled})")
