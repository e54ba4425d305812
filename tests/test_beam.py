"""Beam search: parity with Hugging Face generate(num_beams=...), greedy at B=1, honest scores."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from gptcli.config import ModelConfig
from gptcli.infer.generate import GREEDY, beam_search, generate
from gptcli.model import GPT
from tests.helpers import ours_from_hf

EOS = 7


@pytest.fixture(scope="module")
def models(hf_gpt2):
    """Random HF models (and ours on the same weights) that end sentences often enough for
    early stopping to matter: the final LayerNorm's bias is tilted towards the EOS token."""
    pairs = []
    for seed, tilt in [(0, 2.0), (1, 2.5), (2, 3.0)]:
        hf = hf_gpt2(n_layer=2, n_head=2, n_embd=32, vocab_size=50, n_positions=64, seed=seed)
        hf.generation_config.pad_token_id = EOS
        with torch.no_grad():
            e = hf.transformer.wte.weight[EOS]
            hf.transformer.ln_f.bias.add_(tilt * e / e.norm() ** 2)
        pairs.append((hf, ours_from_hf(hf)))
    return pairs


def hf_best(hf, prompt: list[int], beams: int, alpha: float, n: int) -> tuple[list[int], float]:
    out = hf.generate(
        torch.tensor([prompt]),
        attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
        num_beams=beams,
        num_return_sequences=beams,
        max_new_tokens=n,
        length_penalty=alpha,
        early_stopping=True,
        do_sample=False,
        eos_token_id=EOS,
        pad_token_id=EOS,
        output_scores=True,
        return_dict_in_generate=True,
    )
    ids = out.sequences[0, len(prompt) :].tolist()
    if EOS in ids:
        ids = ids[: ids.index(EOS) + 1]
    return ids, out.sequences_scores[0].item()


@pytest.fixture(params=["c", "torch"])
def ranking(request, monkeypatch):
    """Beams ranked in C (kernels.logsumexp, kernels.top_rows) or by torch (top_of_all)."""
    from gptcli.infer import kernels

    if request.param == "torch":
        monkeypatch.setattr(kernels, "logsumexp", lambda *args: None)
        monkeypatch.setattr(kernels, "top_rows", lambda *args: None)
    else:
        if kernels._compiler() is None:
            pytest.skip("no C compiler on this machine")
        kernels.LIBRARY.start()
        assert kernels.LIBRARY.wait() is not None, kernels.LIBRARY.failed
    return request.param


@pytest.mark.parametrize(("beams", "alpha"), [(2, 1.0), (4, 1.0), (4, 0.5), (3, 2.0), (5, 0.0)])
def test_best_hypothesis_and_score_match_hugging_face(models, beams, alpha, ranking):
    finished_early = 0
    for i, (hf, ours) in enumerate(models):
        for j in range(3):
            prompt = torch.randint(
                0, 50, (4 + j,), generator=torch.Generator().manual_seed(10 * i + j)
            ).tolist()
            want_ids, want_score = hf_best(hf, prompt, beams, alpha, 12)
            hyps = beam_search(ours, prompt, beams, 12, length_penalty=alpha, end_ids=[EOS])
            assert hyps[0].ids == want_ids, (i, j)
            assert hyps[0].score == pytest.approx(want_score, abs=1e-4)
            finished_early += hyps[0].finished and len(hyps[0].ids) < 12
    assert finished_early > 0  # the comparison covered hypotheses that ended with EOS


def test_one_beam_is_greedy_decoding(models):
    for _, ours in models:
        prompt = [3, 1, 4, 1, 5]
        greedy = []
        for step in generate(ours, prompt, 15, sampling=GREEDY):
            greedy.append(int(step.tokens[0]))
            if greedy[-1] == EOS:
                break
        (hyp,) = beam_search(ours, prompt, 1, 15, end_ids=[EOS])
        assert hyp.ids == greedy


def test_scores_are_the_models_log_probabilities(models):
    _, ours = models[0]
    prompt = [2, 9, 4]
    alpha = 0.7
    hyps = beam_search(ours, prompt, 4, 10, length_penalty=alpha, end_ids=[EOS])
    assert 1 <= len(hyps) <= 4
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    for h in hyps:
        seq = torch.tensor([prompt + h.ids])
        with torch.no_grad():
            logp = F.log_softmax(ours(seq)[0][0, :-1], dim=-1)
        total = sum(logp[len(prompt) - 1 + t, tok].item() for t, tok in enumerate(h.ids))
        assert h.logprob == pytest.approx(total, abs=1e-4)
        assert h.score == pytest.approx(h.logprob / len(h.ids) ** alpha, abs=1e-6)
        assert h.finished == (h.ids[-1] == EOS)


def test_no_repeat_ngram_and_custom_end_condition(ranking):
    torch.manual_seed(3)
    model = GPT(ModelConfig(vocab_size=12, block_size=40, n_layer=1, n_head=2, n_embd=16)).eval()
    for h in beam_search(model, [1, 2], 3, 25, no_repeat_ngram=2):
        seq = [1, 2, *h.ids]
        bigrams = list(itertools.pairwise(seq))
        assert len(bigrams) == len(set(bigrams))
    ended = beam_search(model, [1, 2], 3, 25, is_end=lambda ids: len(ids) >= 3 and ids[-1] == ids[-2])
    for h in ended:
        assert h.finished == (len(h.ids) >= 3 and h.ids[-1] == h.ids[-2])


def test_beam_search_refuses_to_run_past_the_context():
    model = GPT(ModelConfig(vocab_size=12, block_size=8, n_layer=1, n_head=1, n_embd=8)).eval()
    with pytest.raises(ValueError, match="block_size"):
        beam_search(model, [1, 2, 3], 2, 6)


def test_the_c_and_torch_rankings_find_the_same_beams(monkeypatch):
    """The same hypotheses and scores (within float rounding) whichever ranks, with n-grams
    banned and padded ids ruled out."""
    from gptcli.infer import kernels

    if kernels._compiler() is None:
        pytest.skip("no C compiler on this machine")
    kernels.LIBRARY.start()
    assert kernels.LIBRARY.wait() is not None, kernels.LIBRARY.failed
    torch.manual_seed(5)
    model = GPT(ModelConfig(vocab_size=40, block_size=40, n_layer=1, n_head=2, n_embd=16)).eval()

    def search() -> list[tuple[list[int], float]]:
        hyps = beam_search(model, [1, 2, 3], 4, 20, no_repeat_ngram=2, vocab_size=33, end_ids=[7])
        assert all(t < 33 for h in hyps for t in h.ids)
        return [(h.ids, h.score) for h in hyps]

    c = search()
    monkeypatch.setattr(kernels, "logsumexp", lambda *args: None)
    monkeypatch.setattr(kernels, "top_rows", lambda *args: None)
    by_torch = search()
    assert [ids for ids, _ in c] == [ids for ids, _ in by_torch]
    assert [s for _, s in c] == pytest.approx([s for _, s in by_torch], abs=1e-5)


def test_a_row_of_nan_logits_has_no_continuation_whichever_ranks(monkeypatch):
    """A row whose logits hold a NaN (or +inf) is dropped by both rankings alike."""
    from gptcli.infer import kernels
    from gptcli.infer.generate import best_continuations

    if kernels._compiler() is None:
        pytest.skip("no C compiler on this machine")
    kernels.LIBRARY.start()
    assert kernels.LIBRARY.wait() is not None, kernels.LIBRARY.failed
    logits = torch.randn(3, 20, generator=torch.Generator().manual_seed(0))
    logits[0, 4] = float("nan")
    logits[2, 7] = float("inf")
    scores = torch.zeros(3)
    c = best_continuations(logits, scores, 6)
    monkeypatch.setattr(kernels, "logsumexp", lambda *args: None)
    monkeypatch.setattr(kernels, "top_rows", lambda *args: None)
    by_torch = best_continuations(logits, scores, 6)
    assert c[1] == by_torch[1] and all(20 <= i < 40 for i in c[1])  # only row 1's continuations
    assert c[0] == pytest.approx(by_torch[0], abs=1e-5)
