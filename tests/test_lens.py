"""`gptcli inspect-lens`: the logit lens against Hugging Face's hidden states, the last layer
against the model's own next-token distribution, and the verb end to end."""

from __future__ import annotations

import json
import re

import pytest
import torch

from gptcli.inspect.lens import Lens, logit_lens
from tests.helpers import assert_usage_error, chromium, ours_from_hf, rendered_dom, run


def full(lens: Lens, vocab: int) -> torch.Tensor:
    """(L+1, P, V) probabilities from a lens read with top_k = the whole vocabulary."""
    out = torch.zeros(*lens.ids.shape[:2], vocab)
    return out.scatter(-1, lens.ids, lens.probs)


def test_each_layer_is_softmax_of_ln_f_and_the_unembedding_of_hf_hidden_states(hf_gpt2):
    hf = hf_gpt2(n_layer=3, n_head=2, n_embd=32, vocab_size=97)
    ours = ours_from_hf(hf)
    ids = [5, 17, 42, 3, 88, 60, 1]
    T, V = len(ids), hf.config.vocab_size
    lens = logit_lens(ours, ids, list(range(T)), top_k=V)
    with torch.no_grad():
        theirs = hf(torch.tensor([ids]), output_hidden_states=True)
        # HF's last hidden state has been through ln_f already: layer L is the logits themselves
        want = [hf.lm_head(hf.transformer.ln_f(h[0])).softmax(-1) for h in theirs.hidden_states[:-1]]
        want.append(theirs.logits[0].softmax(-1))
    assert len(lens.ids) == 3 + 1
    torch.testing.assert_close(full(lens, V), torch.stack(want), atol=1e-5, rtol=0)
    # and the layers differ, or the test would not tell them apart
    assert (full(lens, V)[0] - full(lens, V)[-1]).abs().max() > 0.05


def test_the_last_layer_is_exactly_the_models_own_next_token_distribution(hf_gpt2):
    model = ours_from_hf(hf_gpt2(n_layer=2, vocab_size=97))
    ids = torch.tensor([[5, 17, 42, 3, 88]])
    every = logit_lens(model, ids[0].tolist(), list(range(5)), top_k=97)
    last = logit_lens(model, ids[0].tolist(), [4], top_k=97)
    with torch.no_grad():
        logits, _ = model(ids)  # what training and eval see, all positions
        next_logits = model.next_logits(ids)  # what sample and beam see, the last position
    assert torch.equal(full(every, 97)[-1], logits[0].float().softmax(-1))
    assert torch.equal(full(last, 97)[-1, 0], next_logits[0].float().softmax(-1))


def test_tracked_token_probability_and_rank(hf_gpt2):
    model = ours_from_hf(hf_gpt2(n_layer=2, vocab_size=97))
    ids = [5, 17, 42]
    lens = logit_lens(model, ids, [0, 1, 2], top_k=97, track=11)
    probs = full(lens, 97)
    torch.testing.assert_close(lens.track_probs, probs[..., 11], atol=0, rtol=0)
    ranks = (probs > probs[..., 11:12]).sum(-1) + 1
    assert torch.equal(lens.track_ranks, ranks)
    where = (lens.ids == 11).nonzero().tolist()  # wherever 11 made the list, its rank is its place
    assert all(lens.track_ranks[layer, pos] == k + 1 for layer, pos, k in where)


def test_padded_vocabulary_gets_no_probability(hf_gpt2):
    model = ours_from_hf(hf_gpt2(n_layer=1, vocab_size=97))
    lens = logit_lens(model, [1, 2, 3], [2], top_k=200, vocab_size=90)
    assert lens.ids.shape[-1] == 90 and int(lens.ids.max()) < 90
    assert lens.probs.sum(-1).sub(1).abs().max() < 1e-5


# --- the verb ----------------------------------------------------------------------------------------


def lens_json(trained, *args: str) -> dict:
    result = run("inspect-lens", "The fox dug", "--ckpt", trained, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_json_is_layers_by_positions_by_top_k(trained):
    data = lens_json(trained, "--top-k", "3")
    T = len(data["ids"])
    assert "".join(data["tokens"]) == "The fox dug" and data["prompt"] == "The fox dug"
    assert data["positions"] == list(range(T))
    assert len(data["lens"]) == 1 + 1  # the embeddings and the one block of the tiny model
    assert all(len(row) == T for row in data["lens"])
    for row in data["lens"]:
        for cell in row:
            assert [set(c) for c in cell] == [{"token", "id", "prob"}] * 3
            assert [c["prob"] for c in cell] == sorted((c["prob"] for c in cell), reverse=True)
    # the last layer at the last position is what inspect-attn lists as the next tokens
    attn = json.loads(run("inspect-attn", "The fox dug", "--ckpt", trained, "--json", "--top-k", "3").stdout)
    assert [c["id"] for c in data["lens"][-1][-1]] == [t["id"] for t in attn["top_k"]]
    want = [t["prob"] for t in attn["top_k"]]
    assert [c["prob"] for c in data["lens"][-1][-1]] == pytest.approx(want, abs=1e-6)
    # both say which weights made them, as eval's --json does
    assert (data["dtype"], data["quantize"]) == (attn["dtype"], attn["quantize"]) == ("fp32", None)
    int8 = lens_json(trained, "--top-k", "3", "--quantize", "int8")
    assert (int8["dtype"], int8["quantize"]) == ("fp32", "int8")


def test_one_position_and_a_tracked_token(trained):
    every = lens_json(trained, "--top-k", "2", "--track", "x")
    one = lens_json(trained, "--top-k", "2", "--position", "-1", "--track", "x")
    T = len(every["ids"])
    assert one["positions"] == [T - 1]
    for row_one, row_every in zip(one["lens"], every["lens"], strict=True):  # the same, to rounding
        assert [c["id"] for c in row_one[0]] == [c["id"] for c in row_every[-1]]
        assert [c["prob"] for c in row_one[0]] == pytest.approx([c["prob"] for c in row_every[-1]], abs=1e-6)
    assert one["track"]["token"] == "x" and len(one["track"]["prob"]) == 2
    assert [r[0] for r in one["track"]["rank"]] == [r[-1] for r in every["track"]["rank"]]
    assert lens_json(trained, "--position", "4")["positions"] == [4]


def test_terminal_view_shows_the_grid_and_the_table(trained):
    result = run("inspect-lens", "The fox dug", "--ckpt", trained, "--track", "x", "--top-k", "2")
    assert result.exit_code == 0, result.output
    data = lens_json(trained, "--top-k", "2", "--track", "x")
    assert "top next token, layer by layer" in result.output
    assert re.search(r"^\s*embed\b", result.output, re.M) and re.search(r"^\s*L1\b", result.output, re.M)
    assert "layer by layer" in result.output and "rank" in result.output
    tracked = [f"{row[-1]:.3f}" for row in data["track"]["prob"]]  # every layer's, as the table shows it
    assert re.findall(r"(\d\.\d{3})\s+\d+\s*$", result.output, re.M) == tracked


def test_save_json_png_html(trained, tmp_path):
    out = tmp_path / "lens.json"
    assert run("inspect-lens", "The fox dug", "--ckpt", trained, "--save", out).exit_code == 0
    assert json.loads(out.read_text()) == lens_json(trained)
    again = run("inspect-lens", "The fox dug", "--ckpt", trained, "--save", out)
    assert_usage_error(again, "--force")  # never replaced without being asked
    page = tmp_path / "lens.html"
    assert run("inspect-lens", "The fox", "--ckpt", trained, "--save", page, "--track", "x").exit_code == 0
    html = page.read_text()
    assert '"lens"' in html and '"track"' in html
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", html)  # nothing fetched from the network
    html5lib = pytest.importorskip("html5lib")
    scripts = html5lib.parse(html, namespaceHTMLElements=False).findall(".//script")
    assert [s.get("id") for s in scripts] == ["data", None]
    assert json.loads(scripts[0].text)["tokens"] == list("The fox")
    pytest.importorskip("matplotlib")
    png = tmp_path / "lens.png"
    assert run("inspect-lens", "The fox", "--ckpt", trained, "--save", png).exit_code == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.skipif(chromium() is None, reason="no chromium to render the page")
def test_lens_page_renders_in_a_headless_browser(trained, tmp_path):
    page = tmp_path / "lens.html"
    assert run("inspect-lens", "The fox", "--ckpt", trained, "--save", page).exit_code == 0
    dom = rendered_dom(page, tmp_path / "profile")
    assert 'data-ready="1"' in dom
    assert len(re.findall(r'class="cell( sel)?"', dom)) == 2 * 7  # layers x positions
    assert dom.count('class="bar"') == 2  # the chosen column's top token at every layer


def test_a_long_prompt_is_cut_with_a_warning(trained):
    result = run("inspect-lens", "The fox dug a hole. " * 20, "--ckpt", trained, "--json")
    assert result.exit_code == 0
    assert "kept its last" in result.stderr
    assert len(json.loads(result.stdout)["ids"]) == 16  # the tiny model's block_size


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--position", "99"], "--position 99: the prompt has 7 tokens"),
        (["--position", "last"], "--position takes N (-1 for the last token) or all"),
        (["--track", "fo"], "--track 'fo' is 2 tokens"),
        (["--track", "Ω"], "not a character this model knows"),
        (["--save", "out.txt"], "use a .json, .png or .html file name"),
        (["--top-k", "0"], "--top-k must be >= 1"),
    ],
)
def test_bad_input(trained, args, message):
    assert_usage_error(run("inspect-lens", "The fox", "--ckpt", trained, *args), message)


def test_unknown_characters_are_listed(trained):
    assert_usage_error(run("inspect-lens", "The fox ☃", "--ckpt", trained), "☃")
