"""The pages' examples: the replay's rules (tests/tour.py) checked here; the whole tour is
replayed on a fresh clone by `make tour` (CI runs it after the suite)."""

from __future__ import annotations

from tests import tour
from tests.helpers import ROOT


def test_a_pages_commands_and_what_it_shows_are_read(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(
        "text\n```\n$ gptcli sample --ckpt runs/demo \\\n  --seed 1\nThe fox 0.4991\n$ true\n```\n"
        "```bash\nmake demo    # not a tour step: no $\n```\n"
    )
    got = tour.steps(page)
    assert [(s.command, s.shown) for s in got] == [
        ("gptcli sample --ckpt runs/demo --seed 1", ["The fox 0.4991"]),
        ("true", []),
    ]


def test_what_counts_as_printed():
    shown = tour.Step("p", "x", ["1 │ ·hole │ 0.4991 │ ███", "time 0:48 | 33,139 tok/s"])
    assert tour.missing(shown, "·hole 0.4950", 0) == []  # within 3%
    assert tour.missing(shown, "·hole 0.4500", 0) == ["0.4991"]
    assert (
        tour.missing(
            tour.Step("p", "x", ["error: --top-p must be in (0, 1]"]),
            "error: --top-p must be in (0, 1], got 1.5",
            2,
        )
        == []
    )
    assert tour.missing(tour.Step("p", "x", []), "", 1) == ["exit 1"]


def test_where_figures_are_not_expected_only_broken_commands_fail():
    """A CPU without native bf16 trains the demo in fp32: its figures and the model's words
    differ from the pages' (printed where it trains in bf16), but a command that fails or
    prints other words of the program's own fails."""
    step = tour.Step("p", "gptcli tokenize notes.txt", [])
    chat = tour.Step("p", 'gptcli chat --ckpt runs/animals-chat --message "What did the rabbit do?"', [])
    refused = tour.Step("p", "gptcli sample --ckpt runs/demo --top-p 1.5", [])
    figures = (step, ["0.4991", "32"], 0)
    exited = (step, ["exit 1"], 1)
    words = (step, ["error: --top-p must be in"], 0)
    reply = (chat, ["The rabbit dug a hole."], 0)
    assert tour.failures([figures, (step, [], 0)], figures_expected=True) == 1
    assert tour.failures([figures, (step, [], 0)], figures_expected=False) == 0
    assert tour.failures([figures, exited, words], figures_expected=False) == 2
    # the model's reply is its own words: expected only where the figures are
    assert tour.failures([reply], figures_expected=True) == 1
    assert tour.failures([reply], figures_expected=False) == 0
    # but an error message printed by a command that reads a checkpoint is the program's
    assert tour.failures([(refused, ["error: --top-p must be in"], 2)], figures_expected=False) == 1
    assert tour.failures([(chat, ["exit 1"], 1)], figures_expected=False) == 1


def test_every_page_in_the_nav_exists_and_the_tour_starts_with_make_demo():
    names = [p.name for p in tour.pages(ROOT)]
    assert names[0] == "README.md" and len(names) > 10
    first = next(s for p in tour.pages(ROOT) for s in tour.steps(p))
    assert first.command == "make demo"
