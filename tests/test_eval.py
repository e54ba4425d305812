"""`gptcli eval` against references computed here with Hugging Face's GPT2LMHeadModel, the
way its perplexity guide and lm-evaluation-harness compute them (not through gptcli)."""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.helpers import assert_usage_error, make_corpus, run

WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "dog",
    "ran",
    "to",
    "big",
    "red",
    "house",
    "while",
    "old",
    "man",
    "slept",
    "in",
    "warm",
    "sun",
]


@pytest.fixture(scope="module")
def hf_dir(hf_gpt2, tmp_path_factory) -> Path:
    """A small random GPT-2 with the real GPT-2 vocabulary, saved as Hugging Face does."""
    out = tmp_path_factory.mktemp("hf") / "tiny-gpt2"
    hf_gpt2(vocab_size=50257, n_positions=64, n_embd=32, n_head=2).save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def hf(hf_dir):
    import transformers

    return transformers.GPT2LMHeadModel.from_pretrained(hf_dir).eval()


@pytest.fixture(scope="module")
def enc():
    from gptcli.data.tokenizer import gpt2_tokenizer

    return gpt2_tokenizer()


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def eval_json(*args) -> dict | list:
    result = run("eval", *args, "--json", "--device", "cpu", "--dtype", "fp32")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@torch.no_grad()
def logprobs(hf, ids: list[int]) -> torch.Tensor:
    """(len(ids) - 1, V) log-probabilities of each next token."""
    return hf(torch.tensor([ids])).logits[0, :-1].double().log_softmax(-1)


@pytest.mark.parametrize("stride", [64, 32, 7])
def test_text_perplexity_as_the_guide_computes_it(hf, hf_dir, enc, tmp_path, stride):
    rng = random.Random(0)
    text = ". ".join(words(rng, 9) for _ in range(30)) + ".\n"
    (tmp_path / "t.txt").write_text(text)
    ids = [50256, *enc.encode(text)]  # end-of-text in front
    assert len(ids) > 4 * 64
    nll, n, nbytes, prev_end = 0.0, 0, 0, 0
    for begin in range(0, len(ids), stride):  # huggingface.co/docs/transformers/perplexity
        end = min(begin + 64, len(ids))
        trg_len = end - prev_end
        window = torch.tensor(ids[begin:end])
        labels = window.clone()
        labels[: len(window) - trg_len] = -100
        lp = logprobs(hf, ids[begin:end])
        for j, label in enumerate(labels[1:].tolist()):
            if label != -100:
                nll -= float(lp[j, label])
                n += 1
                nbytes += len(enc.token_bytes(label))
        prev_end = end
        if end == len(ids):
            break
    got = eval_json("--ckpt", hf_dir, tmp_path / "t.txt", "--stride", stride)
    assert got["task"] == "text" and got["tokens"] == n
    assert got["nll"] == pytest.approx(nll / n, rel=1e-5)
    assert got["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5)
    assert got["bytes"] == nbytes == got["chars"]  # ASCII: a byte is a character
    assert got["bpb"] == pytest.approx(nll / math.log(2) / nbytes, rel=1e-5)
    if stride == 64:
        assert n == len(ids) - math.ceil(len(ids) / 64)  # each window's first token is context only
        listed = run("eval", "--ckpt", hf_dir, tmp_path / "t.txt", "--json", "--per-example")
        assert listed.exit_code == 0 and "examples" not in json.loads(listed.stdout)
        assert listed.output.count("has no examples to list") == 1
        twice = run("eval", "--ckpt", hf_dir, "--ckpt", hf_dir, tmp_path / "t.txt", "--json", "--per-example")
        assert twice.output.count("has no examples to list") == 1  # once a file, not once a model


def test_lambada_accuracy_and_both_perplexities(hf, hf_dir, enc, tmp_path):
    rng = random.Random(1)
    texts = [words(rng, rng.randint(4, 12)) for _ in range(12)]
    texts[0] = "the cat sat on the mat and the cat sat on the"  # something a model may get right
    (tmp_path / "l.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    hits, nlls, n_tokens = 0, [], 0
    for t in texts:
        context, word = t.rsplit(" ", 1)
        ctx, whole = enc.encode(context), enc.encode(context + " " + word)
        lp = logprobs(hf, whole)
        target = whole[len(ctx) :]
        rows = lp[len(ctx) - 1 :]
        nlls.append(-sum(float(rows[i, tok]) for i, tok in enumerate(target)))
        hits += all(int(rows[i].argmax()) == tok for i, tok in enumerate(target))
        n_tokens += len(target)
    got = eval_json("--ckpt", hf_dir, tmp_path / "l.jsonl", "--task", "lambada")
    assert got["n"] == 12 and got["acc"] == pytest.approx(hits / 12)
    assert got["ppl"] == pytest.approx(math.exp(sum(nlls) / n_tokens), rel=1e-5)
    assert got["ppl_per_example"] == pytest.approx(math.exp(sum(nlls) / 12), rel=1e-5)


def test_choice_as_the_harness_scores_it(hf, hf_dir, enc, tmp_path):
    rng = random.Random(2)
    records = []
    for i in range(10):
        endings = [words(rng, rng.randint(1, 6)) for _ in range(4)]
        if i % 3 == 1:
            endings = [" " + e for e in endings]  # already spaced: no delimiter
        ctx = words(rng, 7) + (" " if i % 3 == 2 else "")  # ends with a space: no delimiter
        records.append({"ctx": ctx, "endings": endings, "label": str(i % 4)})  # HellaSwag's names
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    acc = acc_norm = 0
    expected = []
    for r in records:
        ctx, sums = r["ctx"], []
        for e in r["endings"]:
            delim = " " if not ctx.endswith(" ") and not e.startswith(" ") else ""
            n = len(ctx) - len(ctx.rstrip())  # the harness's _encode_pair: trailing spaces move on
            context, cont = ctx[: len(ctx) - n], ctx[len(ctx) - n :] + delim + e
            c, whole = enc.encode(context), enc.encode(context + cont)
            lp = logprobs(hf, whole)
            sums.append(sum(float(lp[len(c) - 1 + i, t]) for i, t in enumerate(whole[len(c) :])))
        norms = [s / len(e) for s, e in zip(sums, r["endings"], strict=True)]
        acc += max(range(4), key=sums.__getitem__) == int(r["label"])
        acc_norm += max(range(4), key=norms.__getitem__) == int(r["label"])
        expected.append(sums)
    got = eval_json("--ckpt", hf_dir, tmp_path / "c.jsonl", "--per-example")  # choice: from the file
    assert got["task"] == "choice" and got["scored_by"] == "zero-shot" and got["n"] == 10
    assert (got["acc"], got["acc_norm"]) == (acc / 10, acc_norm / 10)
    for mine, theirs in zip(got["examples"], expected, strict=True):
        assert mine["logprob"] == pytest.approx(theirs, rel=1e-5, abs=1e-6)


def test_char_level_bits_per_byte_is_the_loss_over_ln2(trained, tmp_path):
    text = make_corpus(tmp_path / "held.txt", n_sentences=40, seed=7).read_text()
    assert text.isascii()
    got = eval_json("--ckpt", trained, tmp_path / "held.txt")
    assert got["tokens"] == got["bytes"] == got["chars"]
    assert got["bpb"] == pytest.approx(got["nll"] / math.log(2)) == got["bpc"]
    assert got["ppl"] == pytest.approx(math.exp(got["nll"]))


def test_a_csv_is_scored_as_text_by_its_text_column_as_jsonl_records_are(trained, tmp_path):
    """--task text on a CSV scores its "text" column (its header, commas and labels are no
    text: they were scored, ppl 15,000 against 17), and an empty text is named as such."""
    texts = ["The fox dug a den.", "The cat sat on a mat."]
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"text": t, "label": "x"}) + "\n" for t in texts))
    csv = 'text,label\nThe fox dug a den.,x\n"The cat sat on a mat.",x\n'
    (tmp_path / "t.csv").write_text(csv)
    (tmp_path / "one.csv").write_text("text\n" + "\n".join(f'"{t}"' for t in texts) + "\n")
    jsonl = eval_json("--ckpt", trained, tmp_path / "t.jsonl", "--task", "text")
    csv_scores = eval_json("--ckpt", trained, tmp_path / "t.csv", "--task", "text")
    assert {**csv_scores, "file": ""} == {**jsonl, "file": ""}
    assert jsonl["bytes"] <= sum(len(t) + 1 for t in texts) < len(csv)  # the texts and their line ends
    assert eval_json("--ckpt", trained, tmp_path / "one.csv")["nll"] == jsonl["nll"]  # (no label: text)
    (tmp_path / "n.csv").write_text("body\nThe fox.\n")
    refused = run("eval", "--ckpt", trained, tmp_path / "n.csv", "--task", "text")
    assert_usage_error(refused, "no 'text' column")
    (tmp_path / "e.jsonl").write_text(json.dumps({"text": ""}) + "\n")
    assert_usage_error(run("eval", "--ckpt", trained, tmp_path / "e.jsonl"), "every text in it is empty")


def test_several_models_and_files_in_one_table(trained, hf_dir, tmp_path):
    make_corpus(tmp_path / "a.txt", n_sentences=20, seed=8)  # characters the char model knows
    (tmp_path / "b.jsonl").write_text(json.dumps({"text": "The fox dug a den."}) + "\n")
    both = eval_json("--ckpt", trained, "--ckpt", hf_dir, tmp_path / "a.txt", tmp_path / "b.jsonl")
    assert [(r["ckpt"], Path(r["file"]).name) for r in both] == [
        (str(trained), "a.txt"), (str(trained), "b.jsonl"), (str(hf_dir), "a.txt"), (str(hf_dir), "b.jsonl"),
    ]  # fmt: skip
    assert all(r["task"] == "text" for r in both)
    table = run("eval", "--ckpt", trained, "--ckpt", hf_dir, tmp_path / "a.txt", "--limit", "2")
    assert table.exit_code == 0, table.output
    assert "bits/byte" in table.stdout and str(hf_dir.name) in table.stdout
    assert "a.txt: text, scored zero-shot" in table.stderr
    # a later --ckpt that is not there, or a file a later model cannot score: refused before
    # any model scores anything (one line: no file was scored, as a long run would have been)
    typo = run("eval", "--ckpt", trained, "--ckpt", tmp_path / "nope", tmp_path / "a.txt")
    assert_usage_error(typo, "--ckpt", "nope: no such file or directory")
    (tmp_path / "c.jsonl").write_text(json.dumps({"context": "The fox", "choices": [" dug", " a"]}) + "\n")
    unlabelled = run("eval", "--ckpt", trained, "--ckpt", hf_dir, tmp_path / "a.txt", tmp_path / "c.jsonl")
    assert_usage_error(unlabelled, "c.jsonl:1: 'label' is missing")


def test_limit_scores_the_first_examples(hf_dir, tmp_path):
    rng = random.Random(3)
    rows = [{"context": words(rng, 5), "choices": [" a", " b"], "label": i % 2} for i in range(9)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "c3.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:3]))
    three = eval_json("--ckpt", hf_dir, tmp_path / "c.jsonl", "--limit", "3")
    assert three["n"] == 3
    assert three["acc"] == eval_json("--ckpt", hf_dir, tmp_path / "c3.jsonl")["acc"]


def test_a_finetuned_classifier_is_scored_with_its_head(trained, tmp_path, monkeypatch):
    lines = make_corpus(tmp_path / "s.txt", n_sentences=60, seed=4).read_text().splitlines()
    rows = [{"text": line, "label": line.split()[1]} for line in lines]  # the animal
    data = tmp_path / "cls.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    args = ["finetune", "--ckpt", trained, data, "--task", "classify", "--out", tmp_path / "cls"]
    result = run(*args, "--max-iters", "30", "--eval-interval", "30", "--batch-size", "8", "--lr", "3e-3")
    assert result.exit_code == 0, result.output
    got = eval_json("--ckpt", tmp_path / "cls", data, "--per-example")
    assert got["task"] == "classify" and got["scored_by"] == "head" and got["n"] == 60
    refused = run("eval", "--ckpt", tmp_path / "cls", tmp_path / "s.txt")  # text, not records
    assert_usage_error(refused, "--task classify scores JSONL or CSV records, not text; pass --task text")
    as_text = eval_json("--ckpt", tmp_path / "cls", tmp_path / "s.txt", "--task", "text")
    assert as_text["scored_by"] == "zero-shot"
    strided = run("eval", "--ckpt", tmp_path / "cls", data, "--stride", "4")  # (its head has no windows)
    assert_usage_error(strided, "--stride is for --task text")
    (tmp_path / "runs").mkdir()  # without --ckpt: the newest classifier, as classify takes it
    shutil.copytree(trained, tmp_path / "runs" / "lm")
    later = (tmp_path / "cls" / "last" / "checkpoint.json").stat().st_mtime + 10
    for name in ("best", "last"):  # the language model is the newest run
        os.utime(tmp_path / "runs" / "lm" / name / "checkpoint.json", (later, later))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "cls").symlink_to(tmp_path / "cls")
    newest = run("eval", "cls.jsonl", "--json", "--device", "cpu", "--dtype", "fp32")
    assert newest.exit_code == 0, newest.output
    assert "using the newest classifier of labelled texts: runs/cls" in newest.output
    assert json.loads(newest.stdout)["acc"] == got["acc"]
    classified = json.loads(run("classify", "--ckpt", tmp_path / "cls", "--file", data, "--json").stdout)
    assert got["acc"] == pytest.approx(classified["accuracy"])
    pred = [p["label"] for p in classified["predictions"]]
    true = [r["label"] for r in rows]
    f1 = []
    for c in sorted(set(pred) | set(true)):
        tp = sum(p == c == t for p, t in zip(pred, true, strict=True))
        fp = sum(p == c != t for p, t in zip(pred, true, strict=True))
        fn = sum(t == c != p for p, t in zip(pred, true, strict=True))
        f1.append(2 * tp / (2 * tp + fp + fn))
    assert got["f1"] == pytest.approx(sum(f1) / len(f1))


OK = {"context": "a", "choices": [" x", " y"], "label": 0}


@pytest.mark.parametrize(
    ("lines", "args", "fragments"),
    [
        ([{"ctx": "a b", "label": 0}], ["--task", "choice"], ["c.jsonl:1", "'endings' is missing"]),
        ([{"context": "a", "choices": [" x", " y"], "label": 2}], [], ["c.jsonl:1", "label 2", "0 to 1"]),
        ([OK, {"context": "a", "choices": [" x", ""], "label": 0}], [], ["c.jsonl:2", "choice 1 is empty"]),
        ([{"context": "a", "choices": [" x"], "label": 0}], [], ["c.jsonl:1", "at least two"]),
        ([{"text": "oneword"}], ["--task", "lambada"], ["c.jsonl:1", "at least two words"]),
        ([{"text": "a b", "label": 1}], [], ["labelled examples", "--task text"]),
        ([{"text": "a b c"}], ["--task", "nope"], ["--task 'nope'", "text, lambada, choice"]),
        ([{"text": "a b c"}], ["--stride", "0"], ["--stride 0", "block_size 64"]),
        ([{"text": "a b c"}], ["--limit", "0"], ["--limit 0"]),
        ([{"text": "a b c"}], ["--per-example"], ["--per-example goes with --json"]),
        ([{"context": "a", "choices": [" x", " y"], "label": 0}], ["--task", "choice", "--stride", "4"],
         ["--stride is for --task text"]),
    ],
)  # fmt: skip
def test_bad_files_and_flags_get_one_line(hf_dir, tmp_path, lines, args, fragments):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    assert_usage_error(run("eval", "--ckpt", hf_dir, path, *args), *fragments)


def test_a_context_longer_than_the_block_is_cut_and_said(hf_dir, tmp_path):
    rng = random.Random(5)
    rows = [{"context": words(rng, 5), "choices": [" a", " b"], "label": 0} for _ in range(3)]
    rows[1]["context"] = words(rng, 100)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = run("eval", "--ckpt", hf_dir, tmp_path / "c.jsonl", "--json")
    assert result.exit_code == 0, result.output
    assert "c.jsonl:2: context and continuation are longer than the model's 64 tokens" in result.stderr
    rows[1]["choices"] = [" a", words(rng, 80)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert_usage_error(run("eval", "--ckpt", hf_dir, tmp_path / "c.jsonl"), "c.jsonl:2", "the model sees 64")


def test_a_long_context_keeps_a_full_block_of_input_as_the_harness_does(hf, hf_dir, enc, tmp_path):
    """lm-evaluation-harness feeds (context + continuation)[-(max_length + 1):][:-1]: the
    model reads block_size tokens (it predicts the last). Contexts about the block's length
    (64 here), cut or not, score as that slice does, in lambada and choice alike."""
    rng = random.Random(11)
    rows, expected = [], []
    for n in (58, 61, 62, 63, 64, 70, 90):  # around 64 tokens of context and continuation
        ids = enc.encode(words(rng, 200))[:n]
        context = enc.decode(ids)
        choices = [" " + words(rng, 1), " " + words(rng, 2)]
        rows.append({"context": context, "choices": choices, "label": 0})
        sums = []
        for choice in choices:
            c, whole = enc.encode(context), enc.encode(context + choice)
            cont = whole[len(c) :]
            inp = (c + cont)[-(64 + 1) :][:-1]
            lp = hf(torch.tensor([inp])).logits[0].double().log_softmax(-1)
            sums.append(sum(float(lp[len(inp) - len(cont) + i, t]) for i, t in enumerate(cont)))
        expected.append(sums)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = eval_json("--ckpt", hf_dir, tmp_path / "c.jsonl", "--per-example")
    for mine, theirs in zip(got["examples"], expected, strict=True):
        assert mine["logprob"] == pytest.approx(theirs, rel=1e-5, abs=1e-6)
    lambada = [{"text": r["context"] + r["choices"][0]} for r in rows]  # its last word: the one-word choice
    (tmp_path / "l.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lambada))
    scored = eval_json("--ckpt", hf_dir, tmp_path / "l.jsonl", "--task", "lambada", "--per-example")
    nll = [e["nll"] for e in scored["examples"]]
    assert nll == pytest.approx([-sums[0] for sums in expected], rel=1e-5, abs=1e-6)


def test_no_such_file(hf_dir, tmp_path):
    assert_usage_error(run("eval", "--ckpt", hf_dir, tmp_path / "gone.txt"), "gone.txt: no such file")


def test_tiny_models_are_fine_on_cpu_with_the_default_device(trained, tmp_path):
    make_corpus(tmp_path / "a.txt", n_sentences=5, seed=9)
    result = run("eval", "--ckpt", trained, tmp_path / "a.txt", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tokens"] > 0


# --- --eval-file: the same metrics at every evaluation of a training run ------------------


def test_training_scores_eval_files_as_eval_does(tmp_path, monkeypatch):
    from tests.helpers import TINY

    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "c.txt", n_sentences=200)
    make_corpus(tmp_path / "held.txt", n_sentences=20, seed=3)
    row = {"context": "The fox dug a", "choices": [" den", " hole because"], "label": 0}
    (tmp_path / "mc.jsonl").write_text(json.dumps(row) + "\n" + json.dumps({**row, "label": 1}) + "\n")
    args = ["pretrain", "c.txt", "--out", "r", *TINY, "--eval-file", "held.txt", "--eval-file", "mc.jsonl"]
    result = run(*args, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    evals = [json.loads(x) for x in Path("r/metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["kind"] == "eval"]
    assert [e["step"] for e in evals] == [0, 15, 30]
    assert all(set(e["files"]) == {"held.txt", "mc.jsonl"} for e in evals)
    assert evals[-1]["files"] == summary["last_files"]  # the log and the summary agree
    assert "held.txt: ppl" in result.stderr and "mc.jsonl: acc" in result.stderr  # the progress lines
    for name in ("held.txt", "mc.jsonl"):  # and gptcli eval on the saved model gives the same
        again = eval_json("--ckpt", "r/last", name)
        for key, value in summary["last_files"][name].items():
            assert again[key] == (pytest.approx(value, rel=1e-6) if isinstance(value, float) else value)
    last = evals[-1]
    assert last["val_bpb"] == pytest.approx(last["val_loss"] / math.log(2))  # ASCII, one char a token
    assert Path("r/config.yaml").read_text().count(str(tmp_path / "held.txt")) == 1  # found from anywhere


def test_eval_files_on_resume_and_bad_ones(tmp_path, monkeypatch):
    from tests.helpers import TINY

    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "c.txt", n_sentences=200)
    make_corpus(tmp_path / "held.txt", n_sentences=10, seed=3)
    assert_usage_error(run("pretrain", "c.txt", "--out", "r", *TINY, "--eval-file", "nope.txt"), "nope.txt")
    Path("labels.jsonl").write_text('{"text": "a b", "label": 1}\n')
    labelled = run("pretrain", "c.txt", "--out", "r", *TINY, "--eval-file", "labels.jsonl")
    assert_usage_error(labelled, "labels.jsonl holds labelled examples", "or give texts to score as text")
    assert "--task" not in labelled.output.replace("--task classify", "")  # pretrain has no --task
    assert not Path("r").exists()
    assert run("pretrain", "c.txt", "--out", "r", *TINY, "--max-iters", "15").exit_code == 0
    again = run(
        "pretrain", "c.txt", "--out", "r", *TINY, "--max-iters", "30", "--resume", "--eval-file", "held.txt"
    )
    assert again.exit_code == 0, again.output  # a file to report on may be added on resume
    last = json.loads(Path("r/metrics.jsonl").read_text().splitlines()[-1])
    assert last["step"] == 30 and "held.txt" in last["files"]
    Path("held.txt").unlink()
    gone = run("pretrain", "c.txt", "--out", "r", *TINY, "--max-iters", "45", "--resume")
    assert gone.exit_code == 0, gone.output
    assert "held.txt: no longer there; not scored from now on" in gone.output
    (tmp_path / "run.yaml").write_text("train:\n  eval_files: c.txt\n")  # one file, not a list: fine
    yaml_run = run("pretrain", "c.txt", "--out", "y", *TINY, "--max-iters", "15", "--config", "run.yaml")
    assert yaml_run.exit_code == 0, yaml_run.output
    assert "c.txt" in json.loads(Path("y/metrics.jsonl").read_text().splitlines()[-1])["files"]


def test_a_shared_context_scores_as_the_whole_sequences_do(hf_gpt2):
    """score_shared (the context read once, its KV cache copied per continuation, prefixes
    left-padded and continuations right-padded) gives what scoring each whole sequence does."""
    from gptcli.evals.scoring import score, score_shared
    from tests.helpers import ours_from_hf

    model = ours_from_hf(hf_gpt2(vocab_size=97, n_positions=32))
    rng = random.Random(6)
    prefixes = [[rng.randrange(97) for _ in range(rng.randint(1, 12))] for _ in range(9)]
    conts = [
        [[rng.randrange(97) for _ in range(rng.randint(1, 8))] for _ in range(rng.randint(2, 5))]
        for _ in prefixes
    ]
    shared = score_shared(model, prefixes, conts, batch_tokens=120)  # several batches
    for p, cs, got in zip(prefixes, conts, shared, strict=True):
        want = score(model, [p + c for c in cs], [len(p)] * len(cs))
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-5, atol=1e-6)
            assert (g.greedy == w.greedy).all()


def test_the_live_view_shows_eval_files_and_bits_per_byte():
    from rich.console import Console

    from gptcli.cli import render
    from gptcli.reports import EvalReport, RunInfo, StepReport

    view = render.TrainView("gptcli pretrain →")
    view.live.start = lambda *a, **k: None  # draw by hand
    view.on_start(RunInfo(Path("r"), "cpu", "CPU", "fp32", "fp32", 1000, 128, 8, 1, 1, 0, 100, None, False))
    view.on_step(StepReport(10, 100, 1.0, 1e-3, loss=2.0))
    files = {"held.txt": {"task": "text", "tokens": 900, "ppl": 7.389, "bpb": 1.4427, "bpc": 1.4427}}
    metrics = {"train": {"loss": 2.0, "bpb": 2.9}, "val": {"loss": 2.1, "bpb": 3.03}}
    view.on_eval(EvalReport(10, metrics, 2.1, True, 1.0, files))
    console = Console(width=120, record=True, color_system=None)
    console.print(view._render())
    text = console.export_text()
    assert "bits per byte 3.0300" in text
    assert "held.txt" in text and "ppl 7.389  bits/byte 1.4427  bits/char 1.4427" in text


def test_a_sample_prompt_the_tokenizer_cannot_encode_is_refused_before_training(tmp_path, monkeypatch):
    from tests.helpers import TINY

    monkeypatch.chdir(tmp_path)
    make_corpus(tmp_path / "c.txt", n_sentences=100)
    result = run("pretrain", "c.txt", "--out", "r", *TINY, "--sample-every", "5", "--sample-prompt", "Zürich")
    assert_usage_error(result, "ü")
    assert not Path("r").exists()
