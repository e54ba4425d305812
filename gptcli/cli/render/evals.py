"""What `gptcli eval` shows: one table per task, a row per model and file."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from gptcli.cli.render.console import fmt, out
from gptcli.messages import printable

# the columns of each task's table: (metric key, header, format)
COLUMNS: dict[str, list[tuple[str, str, str]]] = {
    "text": [
        ("tokens", "tokens", ","),
        ("ppl", "ppl", ".3f"),
        ("bpb", "bits/byte", ".4f"),
        ("bpc", "bits/char", ".4f"),
    ],
    "lambada": [
        ("n", "n", ","),
        ("acc", "acc", ".4f"),
        ("ppl", "ppl", ".3f"),
        ("ppl_per_example", "ppl/example", ".3f"),
    ],
    "choice": [("n", "n", ","), ("acc", "acc", ".4f"), ("acc_norm", "acc_norm", ".4f")],
    "classify": [("n", "n", ","), ("acc", "acc", ".4f"), ("f1", "macro-F1", ".4f")],
    "chat": [
        ("n", "n", ","),
        ("tokens", "tokens", ","),
        ("loss", "loss", ".4f"),
        ("ppl", "ppl", ".3f"),
        ("acc", "acc", ".4f"),
    ],
}
TITLES = {
    "text": "text: perplexity per token, bits per byte and per character",
    "lambada": "lambada: last-word accuracy and perplexity",
    "choice": "multiple choice: accuracy (acc_norm: per character)",
    "classify": "classification with the finetuned head",
    "chat": "chat: the assistant turns' loss, perplexity and top-1 accuracy",
}


def headline(metrics: dict) -> str:
    """One evaluation's figures on one line, e.g. "ppl 12.345  bits/byte 1.2345"."""
    return "  ".join(
        f"{header} {fmt(metrics.get(key), spec)}"
        for key, header, spec in COLUMNS[metrics["task"]]
        if key not in ("n", "tokens") and metrics.get(key) is not None
    )


def eval_tables(rows: Sequence[tuple[str, str, str, dict]]) -> None:
    """(model, file, how, metrics) per evaluation, grouped by task in the order they came."""
    rows = [(printable(m), printable(f), how, s) for m, f, how, s in rows]  # before measuring them
    tasks = list(dict.fromkeys(m["task"] for *_, m in rows))
    for task in tasks:
        mine = [
            (m, f, how, [fmt(s.get(k), spec) for k, _, spec in COLUMNS[task]])
            for m, f, how, s in rows
            if s["task"] == task
        ]
        widths = [
            max(len(h), *(len(cells[i]) for *_, cells in mine)) for i, (_, h, _) in enumerate(COLUMNS[task])
        ]
        # numbers are never cut: the model and file names give way, keeping their ends
        room = out.width - sum(widths) - 3 * (len(widths) + 1)
        if room < 16:  # too narrow a terminal for a table: a line per evaluation
            out.print(Text(TITLES[task], style="italic"))
            for model, file, how, cells in mine:
                figures = ", ".join(f"{h} {c}" for (_, h, _), c in zip(COLUMNS[task], cells, strict=True))
                out.print(Text(f"{model}{' (head)' if how == 'head' else ''} on {file}: {figures}"))
            continue
        # the model and file names share what is left
        model_w = max(len(m) + (7 if how == "head" else 0) for m, _, how, _ in mine)
        file_w = max(len(f) for _, f, _, _ in mine)
        if model_w + file_w > room:
            model_w = max(8, min(model_w, room * 2 // 5))
            file_w = room - model_w
        table = Table(title=TITLES[task], title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("model", no_wrap=True)
        table.add_column("file", no_wrap=True)
        for (_, header, _), width in zip(COLUMNS[task], widths, strict=True):
            table.add_column(header, justify="right", no_wrap=True, min_width=width)
        for model, file, how, cells in mine:
            mark = " (head)" if how == "head" else ""
            name = Text(_tail(model, model_w - len(mark))) + Text(mark, style="dim")
            table.add_row(name, Text(_tail(file, file_w)), *cells)
        out.print(table)


def _tail(path: str, width: int) -> str:
    """A path cut to width from the left, where its least telling part is."""
    return path if len(path) <= width else "…" + path[len(path) - width + 1 :]
