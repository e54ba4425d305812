"""Attention maps in the terminal: one map large with its weights, or many small, shaded."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.cells import cell_len
from rich.table import Table
from rich.text import Text

from gptcli.cli.render.console import fits, out, wide
from gptcli.messages import printable

# viridis, from 0 (dark) to 1 (bright)
_SCALE = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
_SHADES = " ░▒▓█"


def color(w: float) -> str:
    x = min(max(w, 0.0), 1.0) * (len(_SCALE) - 1)
    i = min(int(x), len(_SCALE) - 2)
    f = x - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(_SCALE[i], _SCALE[i + 1], strict=True))
    return f"rgb({r},{g},{b})"


def _cell(w: float, masked: bool, numbers: bool) -> Text:
    """One heatmap cell: a shade (and the weight, for short prompts); masked cells are dots."""
    if masked:
        return Text("  · " if numbers else "· ", style="grey35")
    if numbers:
        label = " 1.0" if w >= 0.995 else " " + f"{w:.2f}"[1:]
        return Text(label, style=f"{'black' if w > 0.55 else 'white'} on {color(w)}")
    shade = _SHADES[min(len(_SHADES) - 1, round(w * (len(_SHADES) - 1)))]
    return Text(shade * 2, style=color(w))


def attention_heatmap(tokens: Sequence[str], weights: Any, title: str) -> None:
    """One attention map large: query tokens as rows, key tokens as columns, future
    positions masked. weights: (T, T) nested sequence or tensor. Cells show their weight
    when the prompt is 16 tokens or shorter and the terminal is wide enough, else a shade;
    a map wider than the terminal shows its last positions and says so."""
    tokens = [printable(t) for t in tokens]
    T = len(tokens)
    labels = [f"{tokens[q][:12]} {q:>2} " for q in range(T)]
    label_width = max(cell_len("query ↓  key →"), *map(cell_len, labels))
    numbers = T <= 16 and fits(label_width + 4 * T)
    start = _first_shown(T, label_width, 4 if numbers else 2)
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, show_lines=False,
                  box=None, padding=(0, 0))  # fmt: skip
    table.add_column("query ↓  key →", justify="right", style="bold", no_wrap=True)
    for tok in tokens[start:]:
        label = tok[:6]
        table.add_column(Text("\n".join(label) if numbers else label[:1]), justify="center", no_wrap=True,
                         header_style="cyan", vertical="bottom")  # fmt: skip
    for q in range(start, T):
        row = [_cell(float(weights[q][k]), k > q, numbers) for k in range(start, T)]
        table.add_row(Text(labels[q]), *row)
    wide(label_width + (4 if numbers else 2) * T).print(table)
    _say_left_out(start)


def _first_shown(T: int, others: int, cell: int) -> int:
    """The first position a map of T positions shows at this terminal (0: all of them), its
    cells `cell` columns wide beside `others` columns of labels or borders."""
    if fits(others + cell * T):
        return 0
    return max(0, T - max(1, (out.width - others) // cell))


def _say_left_out(start: int) -> None:
    if start:
        out.print(Text(f"(positions 0..{start - 1} left out to fit: a wider terminal, --json or "
                       "--save attn.html shows them)", style="dim"))  # fmt: skip


def attention_grid(tokens: Sequence[str], maps: Sequence[tuple[str, Any]]) -> None:
    """Many attention maps small, side by side: (title, (T, T) weights) each. A map wider
    than the terminal shows its last positions and says so."""
    from rich.columns import Columns
    from rich.panel import Panel

    T = len(tokens)
    start = _first_shown(T, 2, 2)
    panels = []
    for title, weights in maps:
        lines = Text()
        for q in range(start, T):
            for k in range(start, T):
                lines.append_text(_cell(float(weights[q][k]), k > q, numbers=False))
            if q < T - 1:
                lines.append("\n")
        # as wide as its title too ("╭─ L0 H1 ─╮"), which a panel of 1 to 3 positions would cut
        width = max(2 * (T - start), cell_len(title) + 4) + 2
        panels.append(Panel(lines, title=title, width=width, padding=(0, 0), border_style="grey42"))
    wide(2 * T + 2).print(Columns(panels, padding=(0, 1)))  # (as many a row as fit)
    _say_left_out(start)
    out.print(Text("rows: queries, columns: keys, · masked (future)   ", style="dim") + legend())


def legend(what: str = "weight") -> Text:
    legend = Text(f"{what} 0 ", style="dim")
    for i in range(5):
        legend.append_text(_cell(i / 4, False, numbers=False))
    return legend + Text(" 1", style="dim")


def token_labels(tokens: Sequence[str]) -> None:
    """The prompt's tokens with their positions, for reading the small maps."""
    tokens = [printable(t) for t in tokens]
    out.print(Text("tokens: ", style="dim") + Text("  ".join(f"{i}:{t}" for i, t in enumerate(tokens))),
              soft_wrap=True)  # fmt: skip
