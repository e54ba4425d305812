"""What `gptcli eval` shows: one table per task, a row per model and file."""

from __future__ import annotations

from collections.abc import Sequence

from rich.table import Table
from rich.text import Text

from gptcli.cli.render.console import fmt, out

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
}
TITLES = {
    "text": "text: perplexity per token, bits per byte and per character",
    "lambada": "lambada: last-word accuracy and perplexity",
    "choice": "multiple choice: accuracy (acc_norm: per character)",
    "classify": "classification with the finetuned head",
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
    tasks = list(dict.fromkeys(m["task"] for *_, m in rows))
    for task in tasks:
        table = Table(title=TITLES[task], title_justify="left", show_edge=False, pad_edge=False)
        table.add_column("model", overflow="fold")
        table.add_column("file", overflow="fold")
        table.add_column("scored by", style="dim")
        for _, header, _ in COLUMNS[task]:
            table.add_column(header, justify="right")
        for model, file, how, metrics in rows:
            if metrics["task"] != task:
                continue
            cells = [fmt(metrics.get(key), spec) for key, _, spec in COLUMNS[task]]
            table.add_row(Text(model), Text(file), how, *cells)
        out.print(table)
