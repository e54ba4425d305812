"""`gptcli beam` and `gptcli inspect-attn` end to end; the HTML view in a real browser."""

from __future__ import annotations

import json
import re

import pytest

from tests.helpers import assert_usage_error, chromium, rendered_dom, run


def test_beam_table_and_json(trained):
    result = run("beam", "The fox", "--ckpt", trained, "--beams", "3", "-n", "8")
    assert result.exit_code == 0, result.output
    for header in ("#", "text", "log p", "score", "len", "ended"):
        assert header in result.output
    data = json.loads(run("beam", "The fox", "--ckpt", trained, "--beams", "3", "-n", "8", "--json").output)
    assert data["prompt"] == "The fox" and len(data["hypotheses"]) == 3
    for h in data["hypotheses"]:
        assert set(h) == {"text", "ids", "logprob", "score", "finished"}
        assert h["score"] == pytest.approx(h["logprob"] / len(h["ids"]))  # alpha = 1: mean log-likelihood
    scores = [h["score"] for h in data["hypotheses"]]
    assert scores == sorted(scores, reverse=True)
    two = json.loads(
        run("beam", "The fox", "--ckpt", trained, "--beams", "3", "--n-best", "2", "--json").output
    )
    assert len(two["hypotheses"]) == 2


def test_one_beam_equals_greedy_sampling(trained):
    beam = json.loads(run("beam", "The rab", "--ckpt", trained, "--beams", "1", "-n", "8", "--json").output)
    greedy = json.loads(
        run("sample", "--ckpt", trained, "-p", "The rab", "--temp", "0", "-n", "8", "--json").output
    )
    assert beam["hypotheses"][0]["ids"] == greedy["samples"][0]["ids"]


def test_beam_stops_at_stop_strings_and_eos_tokens(trained):
    from gptcli.data.tokenizer import load_tokenizer

    tok = load_tokenizer(trained / "best")
    data = json.loads(run("beam", "The", "--ckpt", trained, "-n", "12", "--stop", "use", "--json").stdout)
    ended = [h for h in data["hypotheses"] if h["finished"]]
    assert ended  # every corpus line says "because" early; training is seeded, so this is fixed
    for h in ended:
        assert tok.decode(h["ids"]).endswith("use") and "use" not in h["text"]  # ended there; text cut before
    for h in data["hypotheses"]:
        assert h["finished"] or len(h["ids"]) == 12
    data = json.loads(run("beam", "The", "--ckpt", trained, "-n", "12", "--eos", "e", "--json").stdout)
    for h in data["hypotheses"]:
        assert h["finished"] == (h["ids"][-1] == tok.encode("e")[0])
        if h["finished"]:
            assert h["text"] == tok.decode(h["ids"][:-1])  # the end token itself is not in the text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--beams", "0"], "--beams must be >= 1"),
        (["--beams", "2", "--n-best", "3"], "--n-best must be between 1 and --beams (2)"),
        (["--eos", "abc"], "is 3 tokens, not one"),
        (["--eos", ""], "--eos is empty; give the text of a token"),
        (["-n", "16"], "below the model's block_size 16"),
        (["--no-repeat-ngram", "-1"], "--no-repeat-ngram must be >= 0"),
    ],
)
def test_beam_bad_input(trained, args, message):
    assert_usage_error(run("beam", "The", "--ckpt", trained, *args), message)


def test_inspect_attn_grid_large_and_top_k(trained):
    grid = run("inspect-attn", "The fox", "--ckpt", trained)
    assert grid.exit_code == 0, grid.output
    assert "L0 H0" in grid.output and "L0 H1" in grid.output and "· masked" in grid.output
    assert "The fox →" in grid.output  # the top-k table
    large = run("inspect-attn", "The fox", "--ckpt", trained, "--layer", "0", "--head", "1")
    assert "layer 0, head 1" in large.output
    assert re.search(r" 1\.0", large.output)  # the first query attends only to itself
    mean = run("inspect-attn", "The fox", "--ckpt", trained, "--layer", "0", "--head", "mean")
    assert "layer 0, mean of heads" in mean.output


def test_inspect_attn_json_file(trained, tmp_path):
    out = tmp_path / "attn.json"
    result = run("inspect-attn", "The fox dug", "--ckpt", trained, "--save", out, "--top-k", "4")
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    T = len(data["tokens"])
    assert "".join(data["tokens"]) == "The fox dug" and T == 11
    att = data["attention"]
    assert (len(att), len(att[0]), len(att[0][0]), len(att[0][0][0])) == (1, 2, T, T)
    for row in att[0][1]:
        assert sum(row) == pytest.approx(1.0, abs=1e-5)
    assert [set(t) for t in data["top_k"]] == [{"token", "id", "prob"}] * 4
    assert (
        json.loads(run("inspect-attn", "The fox dug", "--ckpt", trained, "--json", "--top-k", "4").output)
        == data
    )


def test_inspect_attn_png(trained, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "attn.png"
    assert run("inspect-attn", "The fox", "--ckpt", trained, "--save", out).exit_code == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_inspect_attn_html_is_self_contained(trained, tmp_path):
    out = tmp_path / "attn.html"
    assert run("inspect-attn", "The fox", "--ckpt", trained, "--save", out).exit_code == 0
    html = out.read_text()
    assert "<script" in html and '"attention"' in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from the network
    assert "http://" not in html and "https://" not in html


@pytest.mark.skipif(chromium() is None, reason="no chromium to render the page")
def test_inspect_attn_html_renders_in_a_headless_browser(trained, tmp_path):
    out = tmp_path / "attn.html"
    assert run("inspect-attn", "The fox", "--ckpt", trained, "--save", out).exit_code == 0
    dom = rendered_dom(out, tmp_path / "profile")
    assert 'data-ready="1"' in dom  # the page's script ran to the end
    T = 7
    assert dom.count('class="cell"') + dom.count('class="cell masked"') == T * T
    assert dom.count('class="cell masked"') == T * (T - 1) // 2
    assert dom.count('class="thumb') == 1 * (2 + 1)  # every head of every layer, and the mean


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--layer", "5"], "--layer 5: the model has 1 layers, numbered 0 to 0"),
        (["--head", "x"], "--head takes N, all or mean"),
        (["--layer", "mean"], "--layer takes N or all"),
        (["--save", "out.txt"], "use a .json, .png or .html file name"),
        (["--top-k", "0"], "--top-k must be >= 1"),
        (["--save", "/nonexistent/dir/attn.html"], "the directory /nonexistent/dir does not exist"),
    ],
)
def test_inspect_attn_bad_input(trained, args, message):
    assert_usage_error(run("inspect-attn", "The fox", "--ckpt", trained, *args), message)
