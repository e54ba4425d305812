"""Files from elsewhere are data, never a way in: sizes come from the weights, nothing is
written through a link or over a file not meant to be replaced, the attention page stays a
page, plot labels are literal, malformed files and numbers are one-line errors, and
terminals and inputs of any kind are handled."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gptcli import files
from gptcli.store.loading import load
from tests.helpers import (
    TINY,
    assert_refused_cold,
    assert_usage_error,
    chromium,
    dead_pid,
    digest,
    edit_json,
    gptcli,
    make_corpus,
    rendered_dom,
    run,
)

# --- sizes come from the weights -----------------------------------------------------------------


# runs a command and writes, last on stderr, the largest resident size (KB) of its only child
_RSS_OF_ONE_CHILD = (
    "import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
    "sys.exit(done.returncode)"
)


def peak_rss_mb(args: list[str], cwd: Path) -> tuple[subprocess.CompletedProcess, float]:
    """Run gptcli in a child and return its result and its largest resident size (MB):
    enough to show gigabytes were never allocated. Measured by a process of its own, whose
    only child gptcli is (this process's RUSAGE_CHILDREN would be the largest of every child
    any earlier test in this worker ran)."""
    result = gptcli(args, cwd, through=[sys.executable, "-c", _RSS_OF_ONE_CHILD])
    *lines, rss_kb = result.stderr.rstrip("\n").split("\n")
    result.stderr = "\n".join(lines) + "\n" if lines else ""
    return result, int(rss_kb) / 1024


@pytest.mark.parametrize("where", ["gptcli-layers", "gptcli-width", "hf"])
def test_a_config_claiming_a_huge_model_is_refused_before_allocating(trained, tmp_path, where):
    # about 200 billion parameters, 800 GB to build: 1,024 layers of 4,096 dims, or 1 of 131,072
    huge = {"n_layer": 1024, "n_embd": 4096} if where != "gptcli-width" else {"n_embd": 131072}
    if where.startswith("gptcli"):
        shutil.copytree(trained / "best", tmp_path / "m")
        edit_json(tmp_path / "m" / "checkpoint.json", **{f"model.{k}": v for k, v in huge.items()})
    else:
        run("export", trained, tmp_path / "m")
        edit_json(tmp_path / "m" / "config.json", **huge)
    result, rss = peak_rss_mb(["sample", "--ckpt", "m", "-n", "2"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert "the weights do not match the config" in result.stderr
    assert rss < 2000


# --- links and files nobody asked to replace ------------------------------------------------------


@pytest.fixture
def outside(tmp_path) -> Path:
    """A file outside the run that a planted link points to."""
    target = tmp_path / "precious.txt"
    target.write_text("not yours\n")
    return target


@pytest.mark.parametrize("name", ["config.yaml", "loss.png"])
def test_resume_never_writes_through_a_link_planted_in_the_run(trained, tmp_path, outside, name):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    if (run_dir / name).exists():
        shutil.copy(run_dir / name, tmp_path / "copy")  # keep the run's content where the link points
        outside.write_bytes((tmp_path / "copy").read_bytes())
    (run_dir / name).unlink(missing_ok=True)
    (run_dir / name).symlink_to(outside)
    before = digest(outside)
    make_corpus(tmp_path / "animals.txt", n_sentences=300)
    result = run("pretrain", tmp_path / "animals.txt", "--resume", "--out", run_dir, "--max-iters", "125")
    assert result.exit_code == 0, result.output
    assert digest(outside) == before  # the link was replaced by the run's own file, never followed
    assert not (run_dir / name).is_symlink()


def test_force_never_replaces_a_pipe_or_a_device(trained, tmp_path):
    """--force replaces a file (or a link), never a named pipe or a device: refused in one line."""
    pipe = tmp_path / "out.json"
    os.mkfifo(pipe)
    for args in (["inspect-attn", "The fox", "--ckpt", trained, "--save", pipe, "--force"],
                 ["export", trained, "/dev/null", "--to", "gguf", "--force"]):  # fmt: skip
        message = assert_usage_error(run(*args), "not a file; give a file name")
        assert "--force" not in message
    assert stat.S_ISFIFO(os.lstat(pipe).st_mode) and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_an_export_killed_midway_leaves_nothing_in_the_way(trained, tmp_path):
    """A Hugging Face export is moved into place whole: one killed midway leaves only its
    temporary directory (as a dead process's, made here), which the next export of that name
    removes, as a GGUF export's; the same command then works."""
    tag = f"{files._host()}-{dead_pid()}-abcdef"
    for left in (f".hf.{tag}.tmpdir", f".m.gguf.{tag}.tmpdir"):
        (tmp_path / left).mkdir()
        (tmp_path / left / "model.safetensors").write_bytes(b"half")
    assert run("export", trained, tmp_path / "hf").exit_code == 0
    assert {p.name for p in tmp_path.iterdir()} == {"hf", f".m.gguf.{tag}.tmpdir"}
    assert load(tmp_path / "hf").tokenizer.name == "char"
    with files.writing_path(tmp_path / "m.gguf") as path:  # as a GGUF export writes its file
        path.write_bytes(b"GGUF")
    assert {p.name for p in tmp_path.iterdir()} == {"hf", "m.gguf"}


def test_a_log_that_is_a_link_is_refused(trained, tmp_path, outside):
    """metrics.jsonl as a link is refused, not read: its lines would be copied into the run."""
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "metrics.jsonl").symlink_to(outside)
    before = digest(outside)
    result = run("pretrain", "--resume", "--out", run_dir, "--max-iters", "125")
    assert_usage_error(result, "metrics.jsonl is a symbolic link; gptcli does not write through links")
    assert digest(outside) == before and (run_dir / "metrics.jsonl").is_symlink()
    assert not (run_dir / "metrics.jsonl.damaged").exists()


def test_a_lock_file_that_is_a_link_is_refused(trained, tmp_path, outside):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    (run_dir / ".lock").symlink_to(outside)
    before = digest(outside)
    result = run("pretrain", "--resume", "--out", run_dir, "--max-iters", "125")
    assert_usage_error(result, ".lock is a symbolic link; gptcli does not write through links")
    assert digest(outside) == before


def test_inspect_attn_save_replaces_only_with_force(trained, tmp_path, outside):
    page = tmp_path / "attn.html"
    page.write_text("mine")
    assert_usage_error(
        run("inspect-attn", "The fox", "--ckpt", trained, "--save", page), "attn.html already exists"
    )
    assert page.read_text() == "mine"
    assert run("inspect-attn", "The fox", "--ckpt", trained, "--save", page, "--force").exit_code == 0
    assert page.read_text().startswith("<!DOCTYPE html>")
    link = tmp_path / "link.json"  # --force replaces a link itself, never the file behind it
    link.symlink_to(outside)
    before = digest(outside)
    assert run("inspect-attn", "The fox", "--ckpt", trained, "--save", link, "--force").exit_code == 0
    assert digest(outside) == before and not link.is_symlink()


def contents(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("into", ["run", "best", "best/sub"])
def test_export_never_writes_into_a_run_or_checkpoint(trained, tmp_path, into):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    target = run_dir if into == "run" else run_dir / into
    before = contents(run_dir)
    said = {"run": "is a gptcli run;", "best": "is a gptcli checkpoint;"}.get(into)
    said = said or f"is inside the gptcli checkpoint {run_dir / 'best'};"
    assert_usage_error(run("export", trained, target, "--force"), said)
    assert contents(run_dir) == before


@pytest.mark.parametrize("name", ["best/model.safetensors", "best/model.gguf", "config.yaml", "R.gguf"])
def test_a_gguf_export_never_goes_into_a_run_even_forced(trained, tmp_path, name):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    before = contents(run_dir)
    args = ("--to", "gguf", "--force")
    assert_usage_error(run("export", run_dir, run_dir / name, *args), "write the .gguf file outside it")
    assert contents(run_dir) == before
    assert run("sample", "--ckpt", run_dir, "-n", "2").exit_code == 0


def test_save_never_replaces_a_checkpoints_files(trained, tmp_path):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    before = contents(run_dir)
    for name in ("best/checkpoint.json", "last/new.html"):
        result = run("inspect-lens", "The fox", "--ckpt", run_dir, "--save", run_dir / name, "--force")
        assert_usage_error(result, f"is inside the gptcli checkpoint {run_dir / name.split('/')[0]}")
    assert contents(run_dir) == before
    # beside the checkpoints, in the run's own directory, a figure may go
    assert run("inspect-lens", "The fox", "--ckpt", run_dir, "--save", run_dir / "lens.json").exit_code == 0
    assert json.loads((run_dir / "lens.json").read_text())


def test_tokenize_never_writes_into_a_checkpoint_or_over_a_run(trained, tmp_path):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    make_corpus(tmp_path / "c.txt")
    before = contents(run_dir)
    for name in ("best", "last/tokens", "best/a/b/tokens", "."):
        result = run("tokenize", tmp_path / "c.txt", "--out", run_dir / name, "--force")
        assert_usage_error(result, "is a gptcli run" if name == "." else "gptcli checkpoint", "of its own")
    assert contents(run_dir) == before
    # a directory of its own under the run is one
    assert run("tokenize", tmp_path / "c.txt", "--out", run_dir / "data" / "tokens").exit_code == 0
    assert (run_dir / "data" / "tokens" / "train.bin").is_file()


def test_paths_are_judged_where_they_land(trained, tmp_path, monkeypatch):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    monkeypatch.chdir(run_dir / "best")
    # ../x from inside a checkpoint lands in the run's own directory, where a figure may go
    assert run("inspect-lens", "The fox", "--ckpt", ".", "--save", "../lens.json").exit_code == 0
    assert (run_dir / "lens.json").is_file()
    result = run("inspect-lens", "The fox", "--ckpt", ".", "--save", "x.json")
    assert_usage_error(result, f"x.json is inside the gptcli checkpoint {run_dir / 'best'}")
    # and ../../x beside the run, where an export may go
    assert run("export", ".", "../../hf").exit_code == 0 and (tmp_path / "hf" / "config.json").is_file()
    assert_usage_error(run("export", ".", "../hf"), f"is inside the gptcli run {run_dir}")


def test_a_run_never_starts_inside_a_checkpoint(tmp_path):
    make_corpus(tmp_path / "c.txt")
    ckpt = tmp_path / "R" / "best"
    ckpt.mkdir(parents=True)
    (ckpt / "checkpoint.json").write_text("{}")
    result = run("pretrain", tmp_path / "c.txt", "--out", ckpt / "sub", "--max-iters", "1")
    assert_usage_error(result, f"is inside the gptcli checkpoint {ckpt}; choose an --out outside it")
    assert sorted(p.name for p in ckpt.iterdir()) == ["checkpoint.json"]


def test_tokenize_force_replaces_a_planted_link_not_its_target(tmp_path, outside):
    make_corpus(tmp_path / "c.txt")
    out = tmp_path / "tok"
    out.mkdir()
    (out / "train.bin").symlink_to(outside)
    before = digest(outside)
    assert_usage_error(run("tokenize", tmp_path / "c.txt", "--out", out), "is not empty")
    assert run("tokenize", tmp_path / "c.txt", "--out", out, "--force").exit_code == 0
    assert digest(outside) == before and not (out / "train.bin").is_symlink()


# --- the attention page stays a page ------------------------------------------------------------

HOSTILE = [
    "</script><script>document.body.dataset.pwned='1'</script>",
    "<!--<script>",
    '<img src=x onerror="document.body.dataset.pwned=1">',
    "</SCRIPT ><b>bold</b>",
    "&amp; &lt; ]]> \u2028\u2029 ${x} `tick` \"quote\" 'single'",
]


@pytest.fixture(scope="module")
def gpt2_run(tmp_path_factory) -> Path:
    """A tiny model on GPT-2's byte-level BPE: any text is a prompt it can read."""
    from gptcli.config import ModelConfig
    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.model import GPT
    from gptcli.store.checkpoint import save_checkpoint

    torch.manual_seed(0)
    run_dir = tmp_path_factory.mktemp("gpt2") / "run"
    model = GPT(ModelConfig(vocab_size=50257, block_size=128, n_layer=1, n_head=2, n_embd=8))
    save_checkpoint(run_dir, "best", model, gpt2_tokenizer(), {"task": "lm"})
    return run_dir


def page_for(gpt2_run: Path, tmp_path: Path, prompt: str) -> tuple[str, dict]:
    page = tmp_path / "attn.html"
    result = run("inspect-attn", prompt, "--ckpt", gpt2_run, "--save", page, "--force")
    assert result.exit_code == 0, result.output
    data = json.loads(run("inspect-attn", prompt, "--ckpt", gpt2_run, "--json").stdout)
    return page.read_text(encoding="utf-8"), data


@pytest.mark.parametrize("prompt", HOSTILE)
def test_the_page_parses_as_written_whatever_the_prompt(gpt2_run, tmp_path, prompt):
    html5lib = pytest.importorskip("html5lib")
    html, data = page_for(gpt2_run, tmp_path, prompt)
    doc = html5lib.parse(html, namespaceHTMLElements=False)
    scripts = doc.findall(".//script")
    assert [s.get("id") for s in scripts] == ["data", None]  # the data, then the page's code
    assert json.loads(scripts[0].text) == data  # the prompt came through whole, as data
    assert data["prompt"] == prompt
    assert doc.findall(".//img") == [] and doc.findall(".//b") == []  # none of it became markup
    for ch in "<>&":
        assert ch not in scripts[0].text


@pytest.mark.skipif(chromium() is None, reason="no chromium (.ci/run installs it)")
def test_the_page_shows_every_token_and_runs_nothing_from_the_prompt(gpt2_run, tmp_path):
    html5lib = pytest.importorskip("html5lib")
    prompt = "".join(HOSTILE)
    _, data = page_for(gpt2_run, tmp_path, prompt)
    dom = rendered_dom(tmp_path / "attn.html", tmp_path / "profile")
    body = html5lib.parse(dom, namespaceHTMLElements=False).find(".//body")
    assert body.get("data-ready") == "1" and body.get("data-pwned") is None
    shown = [span.text or "" for span in body.iter("span") if span.get("class") == "tok"]
    visible = {" ": "\u00b7", "\n": "\u21b5", "\t": "\u2192"}
    assert shown == ["".join(visible.get(c, c) for c in t) for t in data["tokens"]]


# --- plot labels are literal ----------------------------------------------------------------------


def test_png_token_labels_are_drawn_as_written():
    pytest.importorskip("matplotlib")
    from gptcli.cli import figures

    plt = figures._pyplot()
    tokens = ["$x^2$", "$", "\\frac{1}{", "a_b", "50%", "$$"]
    T = len(tokens)
    attention = [[[[1.0 / (q + 1) if k <= q else 0.0 for k in range(T)] for q in range(T)]]]
    fig = figures.attention_figure(plt, tokens, attention, [0], ["0"])
    try:
        ax = fig.axes[0]
        for labels in (ax.get_xticklabels(), ax.get_yticklabels()):
            assert [t.get_text() for t in labels] == tokens
            assert not any(t.get_parse_math() for t in labels)
        fig.savefig(io.BytesIO(), format="png")  # draws without a mathtext parse error
    finally:
        plt.close(fig)


# --- malformed files: exit 2, one line --------------------------------------------------------------


def _tensors(path: Path, change) -> None:
    tensors = load_file(path)
    change(tensors)
    save_file(tensors, path)


def _nan_weight(t: dict) -> None:
    t["transformer.h.0.mlp.c_fc.weight"][0, 0] = float("nan")


def _int_weight(t: dict) -> None:
    t["transformer.ln_f.weight"] = t["transformer.ln_f.weight"].long()


def _wrong_moment(t: dict) -> None:
    key = next(k for k in t if k.endswith("exp_avg"))
    t[key] = torch.zeros(3, 3)


def _drop_tensor(t: dict) -> None:
    del t[next(k for k in t if k.endswith("exp_avg_sq"))]


MALFORMED = [
    # (id, file to change, how, verb, what the line says)
    ("version is a string", "best/checkpoint.json", {"version": "1"}, "sample",
     "'version' must be an integer, got \"1\""),
    ("version is a list", "best/checkpoint.json", {"version": [1]}, "sample", "'version' must be an integer"),
    ("step is text", "best/checkpoint.json", {"step": "ten"}, "sample", "'step' must be an integer"),
    ("labels of objects", "best/checkpoint.json", {"task": "classify", "labels": [{}, {}]}, "classify",
     "'labels' holds values of the wrong type"),
    ("n_embd is text", "best/checkpoint.json", {"model.n_embd": "32"}, "sample",
     "model.n_embd must be an integer"),
    ("tokenizer version", "best/tokenizer.json", {"version": "x"}, "sample", "'version' must be an integer"),
    ("NaN weight", "best/model.safetensors", _nan_weight, "sample",
     "transformer.h.0.mlp.c_fc.weight holds NaN or inf"),
    ("integer weight", "best/model.safetensors", _int_weight, "sample",
     "transformer.ln_f.weight is I64, not floating point"),
    ("moment of another shape", "last/train_state.safetensors", _wrong_moment, "resume",
     "do not fit this run (adamw exp_avg"),
    ("tensor missing", "last/train_state.safetensors", _drop_tensor, "resume",
     "train_state.json names tensor"),
    ("state field of wrong type", "last/train_state.json", {"state.step": "12"}, "resume",
     "'step' must be an integer"),
    ("state field unknown", "last/train_state.json", {"state.epoch": 3}, "resume",
     "its state part holds unknown fields"),
    ("schedule empty", "last/train_state.json", {"state.schedule": []}, "resume",
     "its schedule [] is not [max_iters, max_time or null]"),
    ("schedule of text", "last/train_state.json", {"state.schedule": ["a", None]}, "resume", "its schedule"),
    ("decay of one number", "last/train_state.json", {"state.decay_from": [1]}, "resume",
     "its decay_from [1] is not three numbers"),
    ("elapsed NaN", "last/train_state.json", {"state.elapsed": float("nan")}, "resume", "not finite"),
    ("labels and head disagree", "best/checkpoint.json", {"task": "classify", "labels": ["a"]}, "classify",
     "1 labels for a head of 0 classes"),
    ("duplicate labels", "best/checkpoint.json", {"task": "classify", "labels": ["a", "a"]}, "classify",
     "'labels' is [\"a\", \"a\"], which cannot be"),
    ("a layer count beyond the weights", "best/checkpoint.json", {"model.n_layer": 200_000}, "sample",
     "holds 1 blocks but the config says n_layer = 200000"),
    ("an integer too big for a float", "best/checkpoint.json", {"model.n_embd": 10**400}, "sample",
     "model.n_embd (--n-embd) must be in [1, 2147483647], got 1000"),
]  # fmt: skip

VERBS = {
    "sample": ["sample", "--ckpt", "{run}", "-n", "2"],
    "classify": ["classify", "--ckpt", "{run}", "some text"],
    "resume": ["pretrain", "--resume", "--out", "{run}", "--max-iters", "200"],
}


@pytest.mark.parametrize(("file", "change", "verb", "message"), [c[1:] for c in MALFORMED],
                         ids=[c[0] for c in MALFORMED])  # fmt: skip
def test_a_malformed_file_is_one_line_and_exit_2(trained, tmp_path, file, change, verb, message):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    if callable(change):
        _tensors(run_dir / file, change)
    else:
        edit_json(run_dir / file, **change)
    assert_usage_error(run(*[a.format(run=run_dir) for a in VERBS[verb]]), message)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_embd": "32"}, "'n_embd' must be an integer, got \"32\""),
        ({"layer_norm_epsilon": "1e-5"}, "'layer_norm_epsilon' must be a number"),
        ({"n_layer": True}, "'n_layer' must be an integer, got true"),
        ({"scale_attn_weights": "yes"}, "'scale_attn_weights' must be true or false"),
        ({"model_type": ["gpt2"]}, "model_type is ['gpt2']; only GPT-2 models can be loaded"),
    ],
)
def test_a_malformed_hugging_face_config_is_one_line_and_exit_2(trained, tmp_path, change, message):
    run("export", trained, tmp_path / "hf")
    edit_json(tmp_path / "hf" / "config.json", **change)
    assert_usage_error(run("sample", "--ckpt", tmp_path / "hf", "-n", "2"), message)


def test_a_tokenized_dir_with_a_bad_meta_is_refused(tmp_path):
    make_corpus(tmp_path / "c.txt")
    assert run("tokenize", tmp_path / "c.txt", "--out", tmp_path / "tok").exit_code == 0
    edit_json(tmp_path / "tok" / "meta.json", dtype="object")
    assert_usage_error(
        run("pretrain", tmp_path / "tok", "--out", tmp_path / "R"), "'dtype' must be uint16 or uint32"
    )


# --- numbers: finite and in range, for every verb ----------------------------------------------------

NUMBERS = [
    (["pretrain", "{corpus}", "--max-time", "nan"], "(--max-time) must be a finite number > 0, got nan"),
    (["pretrain", "{corpus}", "--lr", "inf"], "train.lr (--lr) must be a finite number > 0, got inf"),
    (["pretrain", "{corpus}", "--dropout", "nan"], "(--dropout) must be a finite number in [0, 1), got nan"),
    (["pretrain", "{corpus}", "--grad-clip", "-inf"], "(--grad-clip) must be a finite number >= 0, got -inf"),
    (["pretrain", "{corpus}", "--grad-accum", "0"], "train.grad_accum (--grad-accum) must be >= 1, got 0"),
    (["finetune", "--ckpt", "{run}", "{corpus}", "--aux-lm-weight", "nan"], "weight must be a finite"),
    (
        ["finetune", "--ckpt", "{run}", "{corpus}", "--val-fraction", "nan"],
        "--val-fraction must be a finite number in (0, 1)",
    ),
    (["finetune", "--ckpt", "{run}", "{corpus}", "--weight-decay", "inf"], "a finite number >= 0, got inf"),
    (["sample", "--ckpt", "{run}", "--temp", "inf"], "--temp must be a finite number >= 0, got inf"),
    (["sample", "--ckpt", "{run}", "--top-p", "nan"], "--top-p must be a finite number in (0, 1], got nan"),
    (["sample", "--ckpt", "{run}", "--top-k", "0"], "--top-k must be >= 1, got 0"),
    (["sample", "--ckpt", "{run}", "--show-probs", "-1"], "--show-probs must be >= 0, got -1"),
    (
        ["beam", "The", "--ckpt", "{run}", "--length-penalty", "nan"],
        "--length-penalty must be a finite number",
    ),
    (["beam", "The", "--ckpt", "{run}", "--no-repeat-ngram", "-2"], "--no-repeat-ngram must be >= 0"),
    (["inspect-attn", "The", "--ckpt", "{run}", "--top-k", "0"], "--top-k must be >= 1"),
    (["tokenize", "{corpus}", "--out", "o", "--val-fraction", "nan"], "fraction must be a finite"),
    (["sample", "--ckpt", "{run}", "--num-samples", "9" * 400], "needs at least more than a billion GB"),
    (["beam", "The", "--ckpt", "{run}", "--beams", "-" + "9" * 400], "--beams must be >= 1, got -999"),
]


NUMBER_IDS = [" ".join(a[:1] + a[-2:])[:40] for a, _ in NUMBERS]  # cut: one case is a 400-digit number


@pytest.mark.parametrize(("args", "message"), NUMBERS, ids=NUMBER_IDS)
def test_numbers_are_checked_for_every_verb(trained, tmp_path, monkeypatch, args, message):
    make_corpus(tmp_path / "c.txt")
    monkeypatch.chdir(tmp_path)
    result = run(*[a.format(run=trained, corpus=tmp_path / "c.txt") for a in args])
    assert_usage_error(result, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]  # nothing made: no run, no tokens


@pytest.mark.parametrize("temp", ["1e-300", "5e-324", "1e-40", "1e300"])
def test_sampling_is_safe_at_any_allowed_temperature(trained, temp):
    result = run("sample", "--ckpt", trained, "-p", "The fox", "-n", "8", "--temp", temp, "--seed", "1",
                 "--json", "--show-probs", "3")  # fmt: skip
    assert result.exit_code == 0, result.output
    sample = json.loads(result.stdout)["samples"][0]
    if float(temp) < 1e-30:  # the limit: the argmax, every time
        greedy = json.loads(run("sample", "--ckpt", trained, "-p", "The fox", "-n", "8", "--temp", "0",
                                "--json").stdout)  # fmt: skip
        assert sample["ids"] == greedy["samples"][0]["ids"]
    for step in sample["top_k"]:
        assert all(0.0 <= c["q"] <= 1.0 for c in step["candidates"] if "q" in c)


# --- terminals that are not UTF-8 ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["tokenize", "naïve → 東京", "-t", "gpt2"],
        ["sample", "--ckpt", "{run}", "-p", "The fox", "-n", "3", "--show-probs", "3", "--seed", "1"],
        ["inspect-attn", "The fox", "--ckpt", "{run}"],
        ["beam", "The fox", "--ckpt", "{run}", "-n", "3"],
        ["tokenize", "--help"],
        ["sample", "--ckpt", "nowhere/東京"],
    ],
    ids=["tokenize", "sample", "inspect-attn", "beam", "help", "error"],
)
@pytest.mark.parametrize("encoding", ["ascii", "latin-1"])
def test_a_terminal_that_is_not_utf8_gets_replacements_not_a_traceback(trained, tmp_path, args, encoding):
    result = gptcli([a.format(run=trained) for a in args], tmp_path, PYTHONIOENCODING=encoding)
    assert "Traceback" not in result.stderr and "UnicodeEncodeError" not in result.stderr
    assert result.returncode == (2 if "nowhere/東京" in args else 0), result.stderr
    if args[0] == "tokenize" and "--help" not in args:
        assert "?" in result.stdout  # what the terminal cannot show


# --- unbounded inputs are bounded ------------------------------------------------------------------------


def test_a_prompt_file_reads_only_what_the_model_can_use(trained, tmp_path):
    big = tmp_path / "big.txt"
    big.write_text("The fox dug a den. " * 200_000)  # 3.8 MB
    result = run("sample", "--ckpt", trained, "--prompt-file", big, "-n", "3", "--json")
    assert result.exit_code == 0, result.output
    assert "read its last" in result.output
    assert json.loads(result.stdout)["prompt"] == ("The fox dug a den. " * 2)[-16:]


def test_a_prompt_file_s_last_line_break_is_not_the_prompt_s_and_dash_is_stdin(trained, tmp_path):
    """What editors and `echo` end a file with is not part of the prompt (one line break);
    --prompt-file - reads stdin."""
    prompt = tmp_path / "p.txt"
    for written, read in (("The fox\n", "The fox"), ("The fox\n\n", "The fox\n"), ("The fox", "The fox"),
                          ("The fox\r\n", "The fox")):  # fmt: skip
        prompt.write_bytes(written.encode())
        result = run("sample", "--ckpt", trained, "--prompt-file", prompt, "-n", "2", "--json")
        assert result.exit_code == 0 and json.loads(result.stdout)["prompt"] == read, (written, result.output)
    result = run("sample", "--ckpt", trained, "--prompt-file", "-", "-n", "2", "--json", input="The fox\n")
    assert result.exit_code == 0 and json.loads(result.stdout)["prompt"] == "The fox", result.output
    prompt.write_bytes(b"\xef\xbb\xbfThe fox\r\n")  # a byte-order mark, as Windows editors write
    result = run("sample", "--ckpt", trained, "--prompt-file", prompt, "-n", "2", "--json")
    assert json.loads(result.stdout)["prompt"] == "The fox", result.output


def test_a_prompt_file_that_never_ends_is_bounded(trained, tmp_path):
    result = gptcli(["sample", "--ckpt", str(trained), "--prompt-file", "/dev/zero", "-n", "2"], tmp_path)
    assert result.returncode == 2  # the NUL characters are not in the vocabulary: the read ended
    assert "is not a plain file; read its first" in result.stderr and "'\\x00'" in result.stderr


def test_decoding_refused_on_its_input_starts_nothing(trained, tmp_path):
    """A decoding verb refused for its input says one line and builds no kernel, even where the
    check comes late (beam's --eos; chat's message: tests/test_chat.py)."""
    args = ["beam", "The", "--ckpt", str(trained), "--eos", "ab"]
    assert_refused_cold(args, "error: --eos 'ab' is 2 tokens", tmp_path)


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (
            ["sample", "--ckpt", "{run}", "--num-samples", "1000000000000"],
            "--num-samples 1000000000000 needs",
        ),
        (["beam", "The", "--ckpt", "{run}", "--beams", "1000000000000"], "--beams 1000000000000 needs"),
        (
            ["pretrain", "{corpus}", *TINY, "--batch-size", "1000000000000"],
            "--batch-size 1000000000000 needs",
        ),
    ],
    ids=["num-samples", "beams", "batch-size"],
)
def test_what_cannot_fit_is_refused_before_allocating(trained, tmp_path, args, flag):
    """...in one line, before anything starts: on a machine with no decoding kernel built yet
    (an empty kernel cache), nothing is built and nothing is said about one."""
    make_corpus(tmp_path / "c.txt")
    cold = tmp_path / "kernels"
    args = [a.format(run=trained, corpus=tmp_path / "c.txt") for a in args]
    result = gptcli(args, tmp_path, GPTCLI_KERNELS_DIR=str(cold))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip()
    assert line.startswith("error: out of memory on this machine: ") and flag in line and "\n" not in line
    assert not cold.exists() or not any(cold.iterdir())
