"""The logit lens in the terminal: a grid of each layer's top next token at each position,
shaded by its probability, and the top-k of every layer at one position."""

from __future__ import annotations

from collections.abc import Sequence

from rich import box
from rich.cells import set_cell_size
from rich.table import Table
from rich.text import Text

from gptcli.cli.render.console import fits, out, wide
from gptcli.cli.render.heatmaps import color, legend

PIECE = 7  # characters of a token in a grid cell, then its probability: "·hole  .42"
CELL = PIECE + 4


def _prob(p: float) -> str:
    """Two decimals without the leading zero: .42, 1.0."""
    return "1.0" if p >= 0.995 else f"{p:.2f}"[1:]


def layer_name(layer: int) -> str:
    return "embed" if layer == 0 else f"L{layer}"


def lens_grid(
    pieces: Sequence[str], positions: Sequence[int], top: Sequence[Sequence[Sequence[tuple[str, float]]]]
) -> None:
    """Rows: layers (the embeddings, then each block's output); columns: positions, headed by
    the token read there; cells: the top next token, on a shade of its probability.
    top: [layer][position] -> [(piece, prob), ...] best first. Only as many positions as fit
    the terminal are drawn (the last ones), and the rest is said; a file or a pipe gets them all."""
    fit = len(positions) if fits(8 + (CELL + 1) * len(positions)) else max(1, (out.width - 8) // (CELL + 1))
    shown = range(max(0, len(positions) - fit), len(positions))
    out.print(Text("top next token, layer by layer, at each position (below the token read there)"))
    table = Table(
        box=None,
        padding=(0, 1, 0, 0),
        show_edge=False,
    )
    table.add_column("layer", style="bold", justify="right", no_wrap=True)
    for j in shown:
        head = set_cell_size(pieces[j], CELL).rstrip()  # (cells on screen: a CJK character takes two)
        header = Text(head, style="cyan") + Text(f"\n{positions[j]}", style="dim")
        table.add_column(header, width=CELL, no_wrap=True, overflow="ellipsis", vertical="bottom")
    for layer, row in enumerate(top):
        cells = []
        for j in shown:
            piece, prob = row[j][0]
            ink = "black" if prob > 0.55 else "white"
            label = set_cell_size(piece, PIECE) + _prob(prob).rjust(4)
            cells.append(Text(label, style=f"{ink} on {color(prob)}"))
        table.add_row(layer_name(layer), *cells)
    wide(8 + (CELL + 1) * len(shown)).print(table)
    hidden = len(positions) - len(shown)
    if hidden:
        out.print(Text(f"(positions {positions[0]}..{positions[hidden - 1]} left out to fit: "
                       "--position N or --save lens.html shows them)", style="dim"))  # fmt: skip
    out.print(legend("top-1 probability"))


def lens_table(
    piece: str,
    position: int,
    top: Sequence[Sequence[tuple[str, float]]],
    tracked: tuple[str, Sequence[float], Sequence[int]] | None = None,
) -> None:
    """The top-k next tokens of every layer at one position; tracked: (piece, prob per
    layer, rank per layer) of the token followed with --track."""
    table = Table(
        title=Text.assemble("after ", (piece, "cyan"), f" (position {position}), layer by layer"),
        title_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("layer", style="bold", justify="right", no_wrap=True)
    table.add_column(f"top {len(top[0])} next tokens, best first", ratio=1)
    if tracked is not None:
        table.add_column(Text(tracked[0], style="green"), justify="right", no_wrap=True)
        table.add_column("rank", justify="right", no_wrap=True)
    for layer, row in enumerate(top):
        tokens = Text()
        for i, (piece, prob) in enumerate(row):
            tokens.append_text(Text.assemble((" " if i else "", ""), (piece, "bold" if i == 0 else "")))
            tokens.append(" " + _prob(prob), "dim")
        cells = [tokens]
        if tracked is not None:
            rank = tracked[2][layer]
            style = "bold green" if rank == 1 else ""
            cells += [Text(f"{tracked[1][layer]:.3f}", style=style), Text(str(rank), style=style)]
        table.add_row(layer_name(layer), *cells)
    out.print(table)
