"""The Rich views at a terminal of a given width, and in a file: numbers are never cut, a
row never splits, a map wider than the terminal says what it leaves out, and a file gets
the whole view."""

from __future__ import annotations

import io

import pytest

from gptcli.cli import render
from gptcli.cli.render import console, decoding, heatmaps, lens


@pytest.fixture
def screen(monkeypatch):
    """draw(width or None for a file, view, *args) -> the text it printed, without colours:
    the views draw on a console of that width, made through Rich's public API."""

    def draw(width: int | None, view, *args) -> str:
        buf = io.StringIO()
        screen = console._Console(
            file=buf, width=width or 80, force_terminal=width is not None, color_system=None, highlight=False
        )
        for module in (console, heatmaps, decoding, lens):  # each holds the console it draws on
            monkeypatch.setattr(module, "out", screen)
        view(*args)
        return buf.getvalue()

    return draw


def _weights(T: int) -> list[list[float]]:
    return [[1 / (q + 1) if k <= q else 0.0 for k in range(T)] for q in range(T)]


def test_small_maps_keep_their_titles_for_a_short_prompt(screen):
    text = screen(
        80, render.attention_grid, ["The", "·fox"], [("L0 H0", _weights(2)), ("L0 H1", _weights(2))]
    )
    assert "L0 H0" in text and "L0 H1" in text
    text = screen(80, render.attention_grid, ["a"], [("L11 Hmean", _weights(1))])
    assert "L11 Hmean" in text


def test_a_large_map_fits_the_terminal_and_a_file_gets_it_whole(screen):
    tokens = [f"·w{i}" for i in range(40)]
    shown = screen(80, render.attention_heatmap, tokens, _weights(40), "layer 1, head 0")
    assert max(map(len, shown.splitlines())) <= 80
    assert "(positions 0..6 left out to fit" in shown  # 33 positions of 2 columns beside 14 of labels
    assert "·w7  7" in shown and "·w6  6" not in shown and "·w39 39" in shown
    whole = screen(None, render.attention_heatmap, tokens, _weights(40), "layer 1, head 0")
    assert "left out" not in whole and "·w0  0" in whole and "·w39 39" in whole
    assert max(map(len, whole.splitlines())) > 80  # a file is not cut at 80 columns
    # 16 tokens: the weights themselves where they fit, shades where they do not
    assert " .50" in screen(100, render.attention_heatmap, tokens[:16], _weights(16), "t")
    narrow = screen(40, render.attention_heatmap, tokens[:12], _weights(12), "t")
    assert " .50" not in narrow and "left out" not in narrow and max(map(len, narrow.splitlines())) <= 40


def test_the_chosen_token_s_mark_stays_on_its_row_in_a_narrow_terminal(screen):
    rows = [
        (1, "·hunted", 0.3722, False, 0.7562),
        (2, "·dug", 0.1686, True, 0.2438),
        (3, "·was", 0.16, False, 0.0),
    ]
    for width in (30, 40, 100):
        text = screen(width, render.probs_table, "The fox", rows, None, "token", "T=0.7, top-k 2")
        marked = [line for line in text.splitlines() if "◀" in line]
        assert len(marked) == 1 and "0.1686" in marked[0] and "0.2438" in marked[0] and "·dug" in marked[0]
        assert max(map(len, text.splitlines())) <= width
    # too narrow for the table and a bar: a line per row, every token whole
    text = screen(30, render.probs_table, "The fox", rows, None, "token", "T=0.7, top-k 2")
    assert "1. ·hunted p=0.3722 q=0.7562" in text and "3. ·was p=0.1600 q=0.0000" in text
    assert "2. ·dug ◀ p=0.1686 q=0.2438" in text
    narrow = screen(20, render.probs_table, "The fox", rows, None, "token", "T=0.7, top-k 2")
    assert "·hunted" in narrow and "q=0.7562" in narrow and "·dug ◀" in narrow  # wrapped between figures
    assert max(map(len, narrow.splitlines())) <= 20


def test_a_long_text_never_squeezes_out_the_predictions(screen):
    """classify --file: a text longer than the terminal is cut; the row's number, predicted
    label, probability and true label stay whole (they had shrunk to nothing)."""
    long = "The owl caught a mouse because it was hungry. It was not hungry any more. " * 3
    rows = [(long, "food", 0.3951, "food"), ("The mole dug a tunnel.", "shelter", 0.6302, "rest")]
    for width in (60, 80, 120):
        text = screen(width, render.predictions_table, rows, 0.5)
        lines = text.splitlines()
        assert max(map(len, lines)) <= width and len(lines) == 5, text  # a line a row
        for cell in ("predicted label", "prob", "true", "food ✓", "0.395", "shelter", "0.630", "rest ✗"):
            assert cell in text, (width, cell, text)
        assert lines[2].startswith("1 │ The owl") and "…" in lines[2] and lines[3].startswith("2 │ The mole")
        assert "accuracy 0.5000 (1/2)" in text


def test_beam_figures_stay_whole_in_a_narrow_terminal(screen):
    rows = [
        {"text": " dug a burrow because it was cold", "logprob": -3.8871, "score": -0.64781, "ids": [1] * 6,
         "finished": True},
        {"text": " ate", "logprob": -12.5, "score": -12.5, "ids": [2], "finished": False},
    ]  # fmt: skip
    for width in (40, 80):
        text = screen(width, render.beam_table, "The rabbit", rows)
        for figure in ("-3.887", "-0.6478", "-12.500", "-12.5000"):
            assert figure in text, (width, text)
        assert "because it was" in text.replace("\n", " ") and max(map(len, text.splitlines())) <= width


def test_the_lens_grid_shows_every_position_in_a_file(screen):
    pieces = [f"·t{i}" for i in range(11)]
    top = [[[("·x", 0.5)] for _ in pieces] for _ in range(3)]
    at_80 = screen(80, render.lens_grid, pieces, list(range(11)), top)
    assert "left out to fit" in at_80 and max(map(len, at_80.splitlines())) <= 80
    whole = screen(None, render.lens_grid, pieces, list(range(11)), top)
    assert "left out" not in whole and "·t0" in whole and "·t10" in whole


def test_wide_characters_count_as_two_columns(screen):
    rows = [(1, "负面的评论", 0.9, True), (2, "正面的", 0.1, False)]
    text = screen(40, render.probs_table, "这部电影", rows, None, "label")
    marked = [line for line in text.splitlines() if "◀" in line]
    assert len(marked) == 1 and "负面的评论" in marked[0]


def test_cjk_text_is_never_cut(screen):
    rows = [
        {
            "text": "狗在公园里跑。猫が魚を食べた。",
            "logprob": -1.0,
            "score": -0.5,
            "ids": [1] * 6,
            "finished": True,
        }
    ]
    shown = screen(80, render.beam_table, "猫が魚を食べた。" * 3, rows)
    assert "狗在公园里跑" in shown.replace("\n", "").replace("│", "").replace(" ", "")
    top = [[[("猫", 0.98)], [("が", 0.5)]]]
    grid = screen(80, render.lens_grid, ["猫", "が"], [0, 1], top)
    assert "猫      .98" in grid and "が      .50" in grid  # two cells each, padded to the column
