"""Finetuning: GPT-1's classification recipe on a task that needs word order, multiple
choice, instruction tuning with masked prompts, domain text, and bad data."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import pytest
import torch

from gptcli.data.records import Record, read_records
from gptcli.data.tokenizer import CharTokenizer
from gptcli.errors import UsageError
from gptcli.model import IGNORE_INDEX
from gptcli.tasks import SFTTask, predict_records, sft_examples, sft_targets
from tests.helpers import assert_usage_error, run

NOUNS = ["cat", "dog", "fox", "owl", "bee", "elk"]
VERBS = ["saw", "bit", "met", "fed"]
FAST = [
    "--dtype",
    "fp32",
    "--device",
    "cpu",
    "--batch-size",
    "16",
    "--warmup-iters",
    "10",
    "--eval-iters",
    "4",
]


def sentence(rng: random.Random) -> tuple[str, str]:
    """'the fox bit the owl' and its subject, 'fox': the label depends on word order, so a
    bag of words (which sees {fox, owl} either way) cannot tell."""
    x, y = rng.sample(NOUNS, 2)
    return x, f"the {x} {rng.choice(VERBS)} the {y}"


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    """A tiny char-level LM pretrained on such sentences."""
    tmp = tmp_path_factory.mktemp("ft")
    rng = random.Random(0)
    (tmp / "corpus.txt").write_text("".join(sentence(rng)[1] + ".\n" for _ in range(3000)))
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTCLI_CACHE_DIR", str(tmp / "cache"))
    try:
        result = run(
            "pretrain", tmp / "corpus.txt", "--out", tmp / "pre", "--n-layer", "2", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--max-iters", "150", "--eval-interval", "150",
            "--lr", "3e-3", *FAST,
        )  # fmt: skip
        assert result.exit_code == 0, result.output
    finally:
        mp.undo()
    return tmp / "pre"


@pytest.fixture(scope="module")
def order_data(tmp_path_factory) -> Path:
    rng = random.Random(1)
    path = tmp_path_factory.mktemp("order") / "order.jsonl"
    path.write_text(
        "".join(json.dumps({"text": s, "label": x}) + "\n" for x, s in (sentence(rng) for _ in range(600)))
    )
    return path


def finetune(pretrained: Path, data: Path, out: Path, *args: str):
    result = run("finetune", "--ckpt", pretrained, data, "--out", out, "--lr", "2e-3", *FAST, *args)
    assert result.exit_code == 0, result.output
    return json.loads((out / "last" / "checkpoint.json").read_text()), result.output


@pytest.mark.parametrize("aux", ["0", "0.5"])
def test_classification_that_needs_word_order_reaches_95_percent(pretrained, order_data, tmp_path, aux):
    meta, output = finetune(
        pretrained, order_data, tmp_path / "cls", "--task", "classify", "--aux-lm-weight", aux,
        "--max-iters", "150", "--eval-interval", "50",
    )  # fmt: skip
    evals = [json.loads(x) for x in (tmp_path / "cls" / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["kind"] == "eval"]
    assert evals[0]["val_accuracy"] < 0.5  # chance is 1/6 before finetuning
    assert evals[-1]["val_accuracy"] >= 0.95
    assert evals[-1]["val_f1"] >= 0.95
    assert ("val_lm_loss" in evals[-1]) == (aux != "0")  # L3 = L2 + lambda * L1, lambda = 0 drops L1
    assert meta["labels"] == sorted(NOUNS) and meta["model"]["n_classes"] == 6
    assert "val accuracy" in output


def test_finetune_names_a_flag_its_settings_leave_unused(pretrained, order_data, tmp_path):
    args = ("--max-iters", "1", "--decay-fraction", "0.3")
    _, output = finetune(pretrained, order_data, tmp_path / "r", *args)
    warning = "--decay-fraction is not used: it goes with --schedule wsd, and this run has --schedule cosine"
    assert warning in output


def test_compile_covers_the_classification_loss(pretrained, order_data, tmp_path):
    """A classifier's loss calls hidden_states and the classifier head, not the model's
    forward: --compile compiles the task's loss as a whole, and trains as eager does."""
    from torch._dynamo.utils import counters

    args = ("--task", "classify", "--max-iters", "4", "--eval-interval", "4", "--log-interval", "1")
    graphs = counters["stats"]["unique_graphs"]
    finetune(pretrained, order_data, tmp_path / "compiled", *args, "--compile")
    assert counters["stats"]["unique_graphs"] > graphs  # the training loss went through dynamo
    finetune(pretrained, order_data, tmp_path / "eager", *args)

    def losses(run: str) -> list[float]:
        lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
        return [r["loss"] for r in map(json.loads, lines) if r["kind"] == "train"]

    assert len(losses("eager")) == 4
    assert losses("compiled") == pytest.approx(losses("eager"), rel=1e-3)


def test_the_classifier_reloads_and_predicts_the_same(pretrained, order_data, tmp_path, monkeypatch):
    """The model in memory at the end of training and `gptcli classify` on its saved
    checkpoint give the same probabilities."""
    from gptcli.config import FinetuneSettings, flag_overrides
    from gptcli.train.recipes import finetune_trainer

    monkeypatch.chdir(tmp_path)
    settings = FinetuneSettings(task="classify", data=[str(order_data)], base=str(pretrained))
    flags = flag_overrides(
        max_iters=60, lr=2e-3, batch_size=16, warmup_iters=10, eval_iters=4, device="cpu", dtype="fp32"
    )
    trainer = finetune_trainer(settings, out=tmp_path / "cls", flags=flags)  # from Python, no CLI
    trainer.run()
    records = read_records(order_data)[:20]
    in_memory = predict_records(
        trainer.model.eval(), trainer.tokenizer, trainer.meta, records, torch.device("cpu")
    )

    out = run("classify", "--ckpt", tmp_path / "cls" / "last", "--file", order_data, "--json")
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    labels = trainer.meta["labels"]
    for p, row in zip(in_memory, data["predictions"][:20], strict=True):
        assert row["probs"] == pytest.approx(dict(zip(labels, p.probs, strict=True)), abs=1e-6)
        assert row["label"] == labels[p.best] and row["true"] == labels[p.true]
    assert data["accuracy"] is not None and 0 <= data["accuracy"] <= 1
    single = run("classify", "--ckpt", tmp_path / "cls", "the dog fed the cat")
    assert single.exit_code == 0 and "label" in single.output and "◀" in single.output
    (tmp_path / "one.jsonl").write_text(order_data.read_text().splitlines()[0] + "\n")
    one = run("classify", "--ckpt", tmp_path / "cls", "--file", tmp_path / "one.jsonl")  # a table, as for 2
    assert one.exit_code == 0 and "true" in one.stdout and "accuracy" in one.stdout, one.output
    assert trainer.meta["pairs"] is False  # trained on single texts: a pair is refused
    assert_usage_error(
        run("classify", "--ckpt", tmp_path / "cls", "the dog", "--text-b", "the cat"),
        "the command line: this classifier was trained on single texts, not pairs",
    )
    (tmp_path / "typo.jsonl").write_text('{"txt": "the dog fed the cat"}\n')  # neither kind: the field named
    assert_usage_error(
        run("classify", "--ckpt", tmp_path / "cls", "--file", tmp_path / "typo.jsonl"),
        "typo.jsonl:1: needs 'text', or 'text_a' and 'text_b'",
    )


def test_multiple_choice_trains(pretrained, tmp_path):
    rng = random.Random(2)
    rows = []
    for _ in range(300):
        x, s = sentence(rng)
        wrong = rng.sample([n for n in NOUNS if n != x], 2)
        choices = [x, *wrong]
        rng.shuffle(choices)
        rows.append({"context": f"{s}. who", "choices": choices, "label": choices.index(x)})
    data = tmp_path / "choice.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta, _ = finetune(
        pretrained, data, tmp_path / "mc", "--task", "choice", "--max-iters", "200", "--eval-interval", "100",
        "--lr", "5e-3",
    )  # fmt: skip
    evals = [json.loads(x) for x in (tmp_path / "mc" / "metrics.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["kind"] == "eval"]
    assert evals[0]["val_accuracy"] < 0.6 and evals[-1]["val_accuracy"] >= 0.8
    assert meta["model"]["n_classes"] == 1  # one score per choice, softmax over an example's choices

    # the choice model in use: one question from the command line, and a labelled file
    x, s = sentence(random.Random(9))
    choices = [x, *(n for n in NOUNS if n != x)][:3]
    args = [a for c in choices for a in ("--choice", c)]
    one = run("classify", "--ckpt", tmp_path / "mc", f"{s}. who", *args, "--json")
    assert one.exit_code == 0, one.output
    answer = json.loads(one.stdout)["predictions"][0]
    assert answer["choice"] in choices and len(answer["probs"]) == 3
    assert sum(answer["probs"]) == pytest.approx(1.0, abs=1e-5)
    scored = run("classify", "--ckpt", tmp_path / "mc", "--file", data, "--json")
    assert json.loads(scored.stdout)["accuracy"] >= 0.8
    as_text = tmp_path / "as-text.jsonl"  # labels written "1", as HellaSwag writes them: the same
    as_text.write_text("".join(json.dumps({**r, "label": str(r["label"])}) + "\n" for r in rows))
    again = run("classify", "--ckpt", tmp_path / "mc", "--file", as_text, "--json")
    assert again.exit_code == 0 and json.loads(again.stdout) == json.loads(scored.stdout), again.output
    assert "--choice" in run("classify", "--ckpt", tmp_path / "mc", "who").output  # choices are needed


def test_sft_loss_ignores_the_prompt():
    tok = CharTokenizer(list("abcdefgh \n?"))
    recs = [
        Record({"prompt": "abc?", "completion": "defg"}, "x:1"),
        Record({"prompt": "hh?", "completion": "ab"}, "x:2"),
    ]
    examples = sft_examples(recs, tok, block_size=16)
    ids, n_prompt = examples[0]
    assert n_prompt == 4 and tok.decode(ids) == "abc?defg\n"
    y = sft_targets(ids, n_prompt)
    assert (y[:3] == IGNORE_INDEX).all() and y[3:].tolist() == ids[4:]  # first target: 'd' after '?'

    torch.manual_seed(0)
    from gptcli.config import ModelConfig
    from gptcli.model import GPT

    model = GPT(ModelConfig(vocab_size=tok.vocab_size, block_size=16, n_layer=1, n_head=1, n_embd=8)).eval()
    task = SFTTask({"train": examples}, 16)
    batch = task.batch("train", torch.tensor([0, 1]), torch.device("cpu"))
    loss = task.loss(model, batch)
    # the prompt's targets, perturbed before the mask is applied, change nothing ...
    full = torch.tensor(ids[1:])
    perturbed = full.clone()
    perturbed[: n_prompt - 1] = torch.tensor([7, 7, 7])
    masked = perturbed.clone()
    masked[: n_prompt - 1] = IGNORE_INDEX
    assert torch.equal(masked, y)
    x = torch.tensor([ids[:-1]])
    with torch.no_grad():
        assert model(x, y[None])[1] == model(x, masked[None])[1]
        # ... while training on the whole sequence would count them
        assert model(x, full[None])[1] != model(x, y[None])[1]
    assert torch.isfinite(loss)


def test_sft_and_lm_finetuning_run(pretrained, tmp_path):
    data = tmp_path / "qa.jsonl"
    rng = random.Random(3)
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{s}. ", "completion": x}) + "\n"
            for x, s in (sentence(rng) for _ in range(200))
        )
    )
    meta, _ = finetune(
        pretrained, data, tmp_path / "sft", "--task", "sft", "--max-iters", "20", "--eval-interval", "10"
    )
    assert meta["task"] == "sft" and meta["tokenizer"] == "char"
    text = tmp_path / "more.txt"
    text.write_text("".join(sentence(rng)[1] + ".\n" for _ in range(500)))
    meta, _ = finetune(
        pretrained, text, tmp_path / "lm", "--task", "lm", "--max-iters", "10", "--eval-interval", "10"
    )
    assert meta["task"] == "lm" and meta["base"] == str(pretrained)


def test_finetune_resumes(pretrained, order_data, tmp_path):
    finetune(
        pretrained,
        order_data,
        tmp_path / "r",
        "--task",
        "classify",
        "--max-iters",
        "20",
        "--eval-interval",
        "10",
    )
    before = (tmp_path / "r" / "last" / "model.safetensors").read_bytes()
    for extra, said in (
        (["--task", "sft"], "--task is 'sft', the run's is 'classify'"),
        (["--ckpt", tmp_path], "--ckpt is"),
        (["--both-orders"], "--both-orders is 'True', the run's is False"),
        (["--aux-lm-weight", "0.25"], "--aux-lm-weight is '0.25', the run's is 0.5"),
    ):
        refused = run("finetune", "--resume", "--out", tmp_path / "r", *extra)
        assert refused.exit_code == 2, refused.output
        assert (
            said in refused.output
            and "a resumed run keeps its starting model, task and data" in refused.output
        )
    assert (tmp_path / "r" / "last" / "model.safetensors").read_bytes() == before
    # the same command again, plus --resume, continues
    again = ["--ckpt", pretrained, order_data, "--task", "classify", "--eval-interval", "10"]
    result = run("finetune", "--resume", "--out", tmp_path / "r", *again, "--max-iters", "30")
    assert result.exit_code == 0, result.output
    assert "resumed at 20" in result.output and "step 30/30" in result.output
    not_lora = ["--max-iters", "31", "--base", tmp_path / "x"]  # --base: said to be unused
    longer = run("finetune", "--resume", "--out", tmp_path / "r", *not_lora)
    assert longer.exit_code == 0 and "--base is not used: " in longer.output, longer.output


def test_block_size_can_shrink_but_not_grow(pretrained, order_data, tmp_path):
    meta, _ = finetune(
        pretrained,
        order_data,
        tmp_path / "short",
        "--task",
        "classify",
        "--block-size",
        "24",
        "--max-iters",
        "2",
    )
    assert meta["model"]["block_size"] == 24
    assert_usage_error(
        run(
            "finetune",
            "--ckpt",
            pretrained,
            order_data,
            "--task",
            "classify",
            "--block-size",
            "64",
            "--out",
            tmp_path / "x",
        ),
        "larger than the checkpoint's 32",
    )


def test_bad_data_names_the_file_and_line(pretrained, tmp_path):
    def bad(name: str, text: str, *args: str) -> str:
        path = tmp_path / name
        path.write_text(text)
        result = run("finetune", "--ckpt", pretrained, path, "--out", tmp_path / f"out-{name}", *args)
        assert_usage_error(result)
        assert not (tmp_path / f"out-{name}").exists()
        return result.output

    assert "missing.jsonl:2: 'label' is missing" in bad(
        "missing.jsonl", '{"text": "the cat", "label": "a"}\n{"text": "the dog"}\n', "--task", "classify"
    )
    assert "empty.jsonl: no records" in bad("empty.jsonl", "\n\n", "--task", "classify")
    assert "one.jsonl: every record has label 'cat'" in bad(
        "one.jsonl", '{"text": "a", "label": "cat"}\n{"text": "b", "label": "cat"}\n', "--task", "classify"
    )
    (tmp_path / "val.jsonl").write_text('{"text": "x", "label": "cat"}\n{"text": "y", "label": "emu"}\n')
    assert "val.jsonl:2: label 'emu' is not one of the training labels" in bad(
        "train.jsonl", '{"text": "a", "label": "cat"}\n{"text": "b", "label": "dog"}\n',
        "--task", "classify", "--val-data", str(tmp_path / "val.jsonl"),
    )  # fmt: skip
    assert "both.jsonl:2: has 'text' and 'text_a'/'text_b'; give one text or a pair" in bad(
        "both.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", "text_b": "c", "label": "y"}\n' * 3,
        "--task", "classify",
    )  # fmt: skip
    assert "pairs.jsonl:1: 'text_b' is missing" in bad(
        "pairs.jsonl",
        '{"text_a": "a", "label": "x"}\n{"text": "b", "label": "y"}\n' * 3,
        "--task",
        "classify",
    )
    assert "mc.jsonl:1: label 2 must be the index" in bad(
        "mc.jsonl", '{"context": "a", "choices": ["b", "c"], "label": 2}\n' * 2, "--task", "choice"
    )
    assert "sft.jsonl:1: 'completion' is missing" in bad(
        "sft.jsonl", '{"prompt": "a"}\n' * 2, "--task", "sft"
    )
    assert "broken.jsonl:1: not valid JSON" in bad("broken.jsonl", "{oops\n", "--task", "sft")
    assert "--task 'regress'" in bad("any.jsonl", "{}\n", "--task", "regress")


def test_csv_pairs_with_both_orders(pretrained, tmp_path):
    rng = random.Random(4)
    lines = ["text_a,text_b,label"]
    for _ in range(200):
        x, s = sentence(rng)
        y = rng.choice([n for n in NOUNS if n != x])
        lines.append(f"{s},the {x},same" if rng.random() < 0.5 else f"{s},the {y},other")
    data = tmp_path / "pairs.csv"
    data.write_text("\n".join(lines) + "\n")
    meta, _ = finetune(
        pretrained, data, tmp_path / "pairs", "--task", "classify", "--both-orders", "--max-iters", "5"
    )
    assert meta["both_orders"] is True and meta["labels"] == ["other", "same"] and meta["pairs"] is True
    pair = run("classify", "--ckpt", tmp_path / "pairs", "the cat ate", "--text-b", "the cat", "--json")
    assert pair.exit_code == 0
    assert set(json.loads(pair.stdout)["predictions"][0]["probs"]) == {"other", "same"}
    assert_usage_error(
        run("classify", "--ckpt", tmp_path / "pairs", "the cat ate"),
        "this classifier was trained on pairs of texts; give a pair (the second text with --text-b",
    )
    (tmp_path / "mixed.jsonl").write_text('{"text_a": "a", "text_b": "b"}\n{"text": "c"}\n')
    assert_usage_error(
        run("classify", "--ckpt", tmp_path / "pairs", "--file", tmp_path / "mixed.jsonl"), "mixed.jsonl:2: "
    )
    single = tmp_path / "single.csv"
    single.write_text("text,label\n" + "".join(f"{line.split(',')[0]},x\n" for line in lines[1:]))
    refused = run(
        "finetune",
        "--ckpt",
        pretrained,
        single,
        "--task",
        "classify",
        "--both-orders",
        "--out",
        tmp_path / "s",
    )
    assert_usage_error(refused, "--both-orders trains on pairs of texts both ways round")
    assert not (tmp_path / "s").exists()


def test_read_records_multiline_csv_and_jsonl_line_separators(tmp_path):
    csv_file = tmp_path / "rows.csv"
    csv_file.write_text('text,label\n"two\nlines",a\n\nplain,b\n"x,y",c,extra\n')
    with pytest.raises(UsageError, match=r"rows.csv:6: 3 columns, but the header has 2"):
        read_records(csv_file)
    csv_file.write_text('text,label\n"two\nlines",a\n\nplain,b\n')
    records = read_records(csv_file)
    assert [r.fields for r in records] == [
        {"text": "two\nlines", "label": "a"},
        {"text": "plain", "label": "b"},
    ]
    assert [r.source.rsplit(":", 1)[1] for r in records] == ["2", "5"]  # where each row starts

    jsonl = tmp_path / "rows.jsonl"  # U+2028 is a line separator to str.splitlines, not to JSONL
    jsonl.write_text(json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\r\n\n[1]\n", encoding="utf-8")
    with pytest.raises(UsageError, match=r"rows.jsonl:3: list, not an object"):
        read_records(jsonl)
    jsonl.write_text(json.dumps({"text": "a\u2028b"}, ensure_ascii=False) + "\r\n", encoding="utf-8")
    assert [r.fields for r in read_records(jsonl)] == [{"text": "a\u2028b"}]


def test_every_finetune_task_has_a_builder():
    from gptcli import tasks
    from gptcli.config import FINETUNE_TASKS

    assert ("lm", *tasks.FINETUNE) == FINETUNE_TASKS


def test_each_verb_resumes_its_own_runs_only(pretrained, order_data, tmp_path, monkeypatch):
    """pretrain --resume on a finetuning run would save it as a pretraining run, dropping
    its base, data and task: refused before anything is loaded, as the other way round."""
    finetune(pretrained, order_data, tmp_path / "ft", "--max-iters", "2")
    meta_file = tmp_path / "ft" / "last" / "checkpoint.json"
    before = meta_file.read_bytes()
    assert_usage_error(
        run("pretrain", "--resume", "--out", tmp_path / "ft", "--max-iters", "4"),
        f"{tmp_path / 'ft'} is a finetuning run; resume it with gptcli finetune --resume --out",
    )
    assert meta_file.read_bytes() == before
    assert_usage_error(
        run("finetune", "--resume", "--out", tmp_path / "ft", "--new-data", "--max-iters", "4"),
        "--new-data continues on the data given with it",
    )
    assert_usage_error(
        run("finetune", "--resume", "--out", pretrained, "--max-iters", "4"),
        "is a pretraining run; resume it with gptcli pretrain --resume --out",
    )
    # without --out: the newest run of the verb's own kind, though a finetuning run is newer
    shutil.copytree(pretrained, tmp_path / "runs" / "pre")
    shutil.copytree(tmp_path / "ft", tmp_path / "runs" / "ft")
    later = (tmp_path / "runs" / "pre" / "last" / "checkpoint.json").stat().st_mtime + 10
    os.utime(tmp_path / "runs" / "ft" / "last" / "checkpoint.json", (later, later))
    monkeypatch.chdir(tmp_path)
    resumed = run("pretrain", "--resume", "--max-iters", "151")
    assert resumed.exit_code == 0 and "resuming the newest run: runs/pre" in resumed.output, resumed.output


def test_runs_resume_from_another_working_directory(pretrained, order_data, tmp_path, monkeypatch):
    """A run records the paths it was given absolute: resumed from elsewhere, it finds its
    data (it said "the run's data (data/t) is gone")."""
    from tests.helpers import TINY, make_corpus

    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    make_corpus(work / "c.txt")
    assert run("tokenize", "c.txt", "--out", "data/t").exit_code == 0
    assert run("pretrain", "data/t", "--out", "runs/p", *TINY).exit_code == 0
    (work / "d.jsonl").write_bytes(order_data.read_bytes())
    finetune(pretrained, Path("d.jsonl"), Path("runs/ft"), "--max-iters", "2")
    monkeypatch.chdir(tmp_path)
    resumed = run("pretrain", "--resume", "--out", "work/runs/p", "--max-iters", "40")
    assert resumed.exit_code == 0, resumed.output
    meta = json.loads((work / "runs/p/last/checkpoint.json").read_text())
    assert meta["data_dir"] == os.path.abspath(work / "data/t")
    resumed = run("finetune", "--resume", "--out", "work/runs/ft", "--max-iters", "4")
    assert resumed.exit_code == 0, resumed.output
    meta = json.loads((work / "runs/ft/last/checkpoint.json").read_text())
    assert meta["step"] == 4 and meta["data"] == [os.path.abspath(work / "d.jsonl")]
    assert meta["base"] == os.path.abspath(pretrained)


def test_without_ckpt_the_newest_classifier_of_the_input_s_kind_is_taken(
    pretrained, order_data, tmp_path, monkeypatch
):
    rng = random.Random(5)
    pairs = tmp_path / "pairs.jsonl"
    rows = [
        {"text_a": sentence(rng)[1], "text_b": f"the {rng.choice(NOUNS)}", "label": rng.choice("ab")}
        for _ in range(60)
    ]
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    finetune(pretrained, pairs, tmp_path / "runs" / "pair", "--task", "classify", "--max-iters", "1")
    finetune(pretrained, order_data, tmp_path / "runs" / "single", "--task", "classify", "--max-iters", "1")
    monkeypatch.chdir(tmp_path)  # runs/single is the newer: it takes single texts only
    assert "using the newest classifier: runs/single" in run("classify", "the dog fed the cat").output
    paired = run("classify", "the dog fed the cat", "--text-b", "the dog", "--json")
    assert paired.exit_code == 0 and "using the newest classifier: runs/pair" in paired.output
    scored = run("eval", "pairs.jsonl", "--json")
    assert scored.exit_code == 0 and "runs/pair" in scored.output
