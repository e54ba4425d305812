"""Figures saved to files for people to look at: loss curves, attention maps and the logit
lens (PNG, HTML).

matplotlib is optional (the `plot` extra): the PNG writers return False without it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from importlib.resources import files as resources
from pathlib import Path
from typing import Any

from gptcli import files


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save_loss_png(metrics_path: Any, png_path: Any) -> bool:
    """Plot metrics.jsonl's train and val loss to png_path; False if matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return False
    train, val = [], []
    with open(metrics_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                rec = json.loads(line)
            except (ValueError, RecursionError):
                continue  # a damaged line: resume sets such lines aside (metrics.jsonl.damaged)
            if not isinstance(rec, dict):
                continue
            if rec.get("kind") == "train":
                train.append((rec["step"], rec["loss"]))
            elif rec.get("kind") == "eval":
                val.append((rec["step"], rec["val_loss"]))
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    if train:
        ax.plot(*zip(*train, strict=True), label="train", linewidth=1)
    if val:
        ax.plot(*zip(*val, strict=True), label="val", marker="o", markersize=3)
    ax.set_title(f"{Path(metrics_path).parent.name}: loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    if all(v > 0 for _, v in train + val):
        ax.set_yscale("log")  # the late, small improvements stay visible beside the early drop
        from matplotlib.ticker import FormatStrFormatter

        for axis_formatter in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis_formatter(FormatStrFormatter("%g"))  # 0.6, 2, 4, not 6 x 10^-1
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    try:
        with files.writing(png_path) as f:
            fig.savefig(f, format="png")
    finally:
        plt.close(fig)
    return True


def save_attention_png(
    path: Path, tokens: list[str], attention: Any, layers: list[int], heads: list[str], replace: bool = False
) -> bool:
    """A grid of heatmaps, one row per layer and one column per head (or the head mean);
    attention: (len(layers), len(heads), T, T). False if matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return False
    _write_png(plt, attention_figure(plt, tokens, attention, layers, heads), path, replace)
    return True


def _write_png(plt: Any, fig: Any, path: Path, replace: bool) -> None:
    """fig to path through the one file writer, and closed either way."""
    try:
        with files.writing(path, replace=replace) as f:
            fig.savefig(f, format="png", bbox_inches="tight")
    finally:
        plt.close(fig)


def attention_figure(plt: Any, tokens: list[str], attention: Any, layers: list[int], heads: list[str]) -> Any:
    """The figure of save_attention_png. tokens are drawn exactly as given (no mathtext: a
    "$" is a dollar sign)."""
    import numpy as np

    L, H, T = len(layers), len(heads), len(tokens)
    size = 1.2 + 0.22 * T if T <= 24 else 2.4
    fig, axes = plt.subplots(
        L, H, figsize=(size * H + 1.2, size * L + 0.6), squeeze=False, dpi=110, layout="constrained"
    )
    cmap = plt.get_cmap("viridis").with_extremes(bad="#e8e8e8")
    future = np.triu(np.ones((T, T), dtype=bool), k=1)
    for i, layer in enumerate(layers):
        for j, head in enumerate(heads):
            ax = axes[i][j]
            m = np.ma.masked_where(future, np.asarray(attention[i][j], dtype=float))
            image = ax.imshow(m, cmap=cmap, vmin=0.0, vmax=1.0)
            ax.set_title(f"layer {layer} · head {head}", fontsize=8)
            # every panel has the same tokens: label the left column and the bottom row only
            left, bottom = j == 0, i == L - 1
            ax.set_xticks(range(T) if T <= 24 and bottom else [])
            ax.set_yticks(range(T) if T <= 24 and left else [])
            if T <= 24 and bottom:
                ax.set_xticklabels(tokens, rotation=90, fontsize=6, parse_math=False)
            if T <= 24 and left:
                ax.set_yticklabels(tokens, fontsize=6, parse_math=False)
            if bottom:
                ax.set_xlabel("key (attended to)", fontsize=7)
            if left:
                ax.set_ylabel("query", fontsize=7)
    fig.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    return fig


def script_json(data: Any) -> str:
    """JSON to place inside a <script> element: no "<", ">" or "&" appears in it (they are
    written as \\u escapes, which JSON.parse reads back), so no text in the data can end the
    element, open a comment or a tag, or change how the page parses."""
    text = json.dumps(data, ensure_ascii=False)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def _save_page(template: str, path: Path, data: dict[str, Any], replace: bool) -> None:
    page = resources("gptcli.cli").joinpath(template).read_text(encoding="utf-8")
    head, tail = page.split("/*DATA*/null")
    files.write_file(path, head + script_json(data) + tail, replace=replace)


def save_attention_html(path: Path, data: dict[str, Any], replace: bool = False) -> None:
    """One self-contained page (no network) to pick a layer and head and hover the cells.
    data: {"prompt", "tokens", "attention": [layer][head][query][key], "top_k": [...]}.
    The page puts every text into the document with textContent, never as markup."""
    _save_page("attention.html", path, data, replace)


def save_lens_html(path: Path, data: dict[str, Any], replace: bool = False) -> None:
    """One self-contained page of the logit lens: the grid of top tokens, each cell's top-k
    on hover. data: inspect-lens's JSON document. Texts go in with textContent only."""
    _save_page("lens.html", path, data, replace)


def save_lens_png(
    path: Path, data: dict[str, Any], visible: Callable[[str], str], replace: bool = False
) -> bool:
    """The logit lens as a heatmap: rows layers, columns positions, each cell the top token
    (drawn as visible(token) shows it) on a shade of its probability. False if matplotlib
    is missing."""
    plt = _pyplot()
    if plt is None:
        return False
    import numpy as np

    lens, positions = data["lens"], data["positions"]
    L, P = len(lens), len(positions)
    probs = np.array([[cell[0]["prob"] for cell in row] for row in lens])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * P, 0.9 + 0.42 * L), dpi=110, layout="constrained")
    image = ax.imshow(probs, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    for i, row in enumerate(lens):
        for j, cell in enumerate(row):
            ink = "black" if cell[0]["prob"] > 0.55 else "white"
            ax.text(j, i, visible(cell[0]["token"])[:10], ha="center", va="center", fontsize=7,
                    color=ink, parse_math=False)  # fmt: skip
    ax.set_xticks(range(P))
    labels = [f"{visible(data['tokens'][p])[:10]}\n{p}" for p in positions]
    ax.set_xticklabels(labels, fontsize=7, parse_math=False)
    ax.set_yticks(range(L))
    ax.set_yticklabels(["embed", *(f"layer {i}" for i in range(1, L))], fontsize=7)
    ax.set_xlabel("position (the token read there)", fontsize=8)
    ax.set_title("logit lens: the top next token after each layer", fontsize=9)
    fig.colorbar(image, ax=ax, shrink=0.8, label="top-1 probability")
    _write_png(plt, fig, path, replace)
    return True
