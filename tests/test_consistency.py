"""Runs and data stay consistent: resume checks the data, labels are one type and every class
is trained, crashes and full disks leave nothing in the way, CSV errors point at the cause."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gptcli import files
from tests.helpers import ROOT, TINY, assert_usage_error, checkpoint_meta, dead_pid, make_corpus, run

SHORT = [*TINY, "--max-iters", "10", "--eval-interval", "5"]
FT = ["--max-iters", "10", "--eval-interval", "5", "--eval-iters", "2", "--batch-size", "4",
      "--log-interval", "5", "--device", "cpu", "--dtype", "fp32"]  # fmt: skip


def meta(run_dir: Path) -> dict:
    return json.loads((run_dir / "last" / "checkpoint.json").read_text())


# --- resume checks the data -------------------------------------------------------------------------


@pytest.fixture
def lm_run(tmp_path) -> Path:
    make_corpus(tmp_path / "corpus.txt", seed=0)
    make_corpus(tmp_path / "other.txt", seed=1)  # the same kind of text, other sentences
    assert run("pretrain", tmp_path / "corpus.txt", "--out", tmp_path / "R", *SHORT).exit_code == 0
    return tmp_path


def test_resume_refuses_other_text_unless_asked(lm_run):
    saved = checkpoint_meta(lm_run / "R")["data_sha256"]
    refused = run("pretrain", lm_run / "other.txt", "--resume", "--out", lm_run / "R", "--max-iters", "15")
    assert_usage_error(refused, "is not the data this run was trained on")
    assert "--new-data" in refused.output and checkpoint_meta(lm_run / "R")["step"] == 10
    # the same text by another path is the same data
    shutil.copy(lm_run / "corpus.txt", lm_run / "copy.txt")
    same = run("pretrain", lm_run / "copy.txt", "--resume", "--out", lm_run / "R", "--max-iters", "12")
    assert same.exit_code == 0, same.output
    nothing = run("pretrain", "--resume", "--out", lm_run / "R", "--max-iters", "15", "--new-data")
    assert_usage_error(nothing, "--new-data continues on the data given with it")
    done = run("pretrain", lm_run / "other.txt", "--resume", "--out", lm_run / "R", "--new-data")
    assert_usage_error(done, "has reached its max_iters 12, so it would not train on new data", "above 12")
    on_purpose = run(
        "pretrain", lm_run / "other.txt", "--resume", "--out", lm_run / "R", "--max-iters", "15", "--new-data"
    )
    assert on_purpose.exit_code == 0, on_purpose.output
    assert "continuing on new data" in on_purpose.output
    after = checkpoint_meta(lm_run / "R")
    assert after["data_sha256"] != saved
    assert after["data_changes"] == [{"step": 12, "data_sha256": after["data_sha256"], "previous": saved}]


def test_resume_notices_a_tokenized_dir_that_was_redone_with_other_text(tmp_path):
    make_corpus(tmp_path / "a.txt", seed=0)
    make_corpus(tmp_path / "b.txt", seed=1)
    assert run("tokenize", tmp_path / "a.txt", "--out", tmp_path / "tok").exit_code == 0
    assert run("pretrain", tmp_path / "tok", "--out", tmp_path / "R", *SHORT).exit_code == 0
    assert run("tokenize", tmp_path / "b.txt", "--out", tmp_path / "tok", "--force").exit_code == 0
    refused = run("pretrain", "--resume", "--out", tmp_path / "R", "--max-iters", "15")
    assert_usage_error(refused, "the tokens in")


def test_resume_on_new_text_encodes_it_with_the_runs_own_bpe(tmp_path):
    """A bpe:N run resumed on new raw text keeps its tokenizer (the text is not given a BPE of
    its own); a directory tokenized by another BPE of the same size is refused, naming the
    command that tokenizes with the run's."""
    make_corpus(tmp_path / "corpus.txt", seed=0)
    (tmp_path / "other.txt").write_text(
        "The owl sat in a tall tree at night.\n" * 40
    )  # too few merges for bpe:300
    assert (
        run("pretrain", tmp_path / "corpus.txt", "-t", "bpe:300", "--out", tmp_path / "R", *SHORT).exit_code
        == 0
    )
    tokenizer = (tmp_path / "R" / "last" / "tokenizer.json").read_bytes()
    on_new = run(
        "pretrain",
        tmp_path / "other.txt",
        "--resume",
        "--new-data",
        "--out",
        tmp_path / "R",
        "--max-iters",
        "12",
    )
    assert on_new.exit_code == 0, on_new.output
    assert checkpoint_meta(tmp_path / "R")["step"] == 12
    assert (tmp_path / "R" / "last" / "tokenizer.json").read_bytes() == tokenizer
    make_corpus(tmp_path / "third.txt", seed=2)
    assert run("tokenize", tmp_path / "third.txt", "--out", tmp_path / "tok", "-t", "bpe:300").exit_code == 0
    refused = run(
        "pretrain", tmp_path / "tok", "--resume", "--new-data", "--out", tmp_path / "R", "--max-iters", "14"
    )
    assert_usage_error(refused, "is tokenized with another bpe:300 than the model's")
    assert f"gptcli tokenize TEXT --out DIR -t {tmp_path / 'R'}" in refused.output
    assert checkpoint_meta(tmp_path / "R")["step"] == 12


def test_a_run_refused_at_its_start_leaves_no_run_behind(tmp_path):
    """A new run refused once its directory is made (fp16 on the CPU: when the device is set
    up) takes it away again, so the same --out then starts afresh; an empty directory the
    user made stays. A binary --eval-file is refused before anything is made."""
    make_corpus(tmp_path / "corpus.txt")
    (tmp_path / "bin.dat").write_bytes(b"text\x00\x01binary")
    out, mine = tmp_path / "R", tmp_path / "mine"
    assert_usage_error(
        run("pretrain", tmp_path / "corpus.txt", "--out", out, *SHORT, "--dtype", "fp16"), "fp16"
    )
    assert not out.exists()
    mine.mkdir()
    assert_usage_error(
        run("pretrain", tmp_path / "corpus.txt", "--out", mine, *SHORT, "--dtype", "fp16"), "fp16"
    )
    assert mine.is_dir() and not any(mine.iterdir())
    bad = run("pretrain", tmp_path / "corpus.txt", "--out", out, "--eval-file", tmp_path / "bin.dat", *SHORT)
    assert_usage_error(bad, "bin.dat: NUL byte (binary data) at byte offset 4; the file must be UTF-8 text")
    assert not out.exists()
    good = run("pretrain", tmp_path / "corpus.txt", "--out", out, *SHORT)
    assert good.exit_code == 0, good.output


def test_resume_refuses_fewer_steps_than_reached_and_an_edited_config_copy(lm_run):
    """--max-iters below the run's step, and RUN/config.yaml with its maths edited by hand
    (which resuming would rewrite), are refused before anything is written; what a resume may
    change (max_iters) differing there is what a cut session leaves, and goes."""
    run_dir = lm_run / "R"
    written = (run_dir / "config.yaml").read_text()
    assert_usage_error(
        run("pretrain", "--resume", "--out", run_dir, "--max-iters", "5"),
        "--max-iters 5 is below step 10, which the run has reached; give --max-iters 10 or more",
    )
    assert (run_dir / "config.yaml").read_text() == written
    (lm_run / "short.yaml").write_text("train:\n  max_iters: 4\n")  # the number came from a file
    assert_usage_error(
        run("pretrain", "--resume", "--out", run_dir, "-c", lm_run / "short.yaml"),
        f"max_iters in {lm_run / 'short.yaml'} 4 is below step 10",
        "give --max-iters 10 or more",
    )
    (run_dir / "config.yaml").write_text(written.replace("lr: 0.003", "lr: 0.01"))
    refused = run("pretrain", "--resume", "--out", run_dir, "--max-iters", "12")
    assert_usage_error(refused, "config.yaml was edited (train.lr: 0.01, not 0.003)", "-c")
    assert "lr: 0.01" in (run_dir / "config.yaml").read_text() and checkpoint_meta(run_dir)["step"] == 10
    (run_dir / "config.yaml").write_text(written.replace("max_iters: 10", "max_iters: 99"))
    resumed = run("pretrain", "--resume", "--out", run_dir, "--max-iters", "12")
    assert resumed.exit_code == 0, resumed.output
    assert checkpoint_meta(run_dir)["step"] == 12 and "max_iters: 12" in (run_dir / "config.yaml").read_text()
    assert "config.yaml says max_iters: 99, which this session does not take" in resumed.output
    assert f"-c {run_dir / 'config.yaml'}" in " ".join(resumed.output.split())
    (run_dir / "config.yaml").write_text("- not a config\n")  # no mapping: not compared, rewritten
    assert run("pretrain", "--resume", "--out", run_dir, "--max-iters", "14").exit_code == 0
    assert "max_iters: 14" in (run_dir / "config.yaml").read_text()


def test_new_data_only_goes_with_resume(tmp_path):
    make_corpus(tmp_path / "c.txt")
    assert_usage_error(run("pretrain", tmp_path / "c.txt", "--new-data"), "--new-data goes with --resume")


# --- labels are one type, every class trained --------------------------------------------------------


ANIMALS = ["fox", "mole", "otter", "badger"]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ([0, "0", 1, "1"], ':2: label "0" is a string, but'),
        (["a", "b", None, "a"], ":3: label null is not a string or an integer"),
        (["a", True, "b", "a"], ":2: label true is not a string or an integer"),
        ([0, 1, 0.5, 1], ":3: label 0.5 is not a string or an integer"),
        ([0, 1, [1], 0], ":3: label [1] is not a string or an integer"),
        (["cat", "dog"], "too few records to hold some out for validation"),  # one record per class
    ],
    ids=["int-and-str", "null", "bool", "float", "list", "two-records"],
)
def test_classification_labels_are_checked(trained, tmp_path, monkeypatch, labels, message):
    monkeypatch.chdir(tmp_path)
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": f"The {ANIMALS[i % 4]} dug a den.", "label": x}
                                               for i, x in enumerate(labels)])  # fmt: skip
    assert_usage_error(run("finetune", "--ckpt", trained, data, "--task", "classify", *FT), message)
    assert not (tmp_path / "runs").exists()


def test_a_validation_class_with_no_training_record_is_refused(trained, tmp_path):
    train = write_jsonl(tmp_path / "t.jsonl", [{"text": "The fox dug.", "label": x} for x in "abab"])
    val = write_jsonl(tmp_path / "v.jsonl", [{"text": "The mole dug.", "label": x} for x in "ac"])
    assert_usage_error(
        run("finetune", "--ckpt", trained, train, "--task", "classify", "--val-data", val, *FT),
        "v.jsonl:2: label 'c' is not one of the training labels",
    )


def test_the_held_out_split_keeps_every_class_in_training():
    from gptcli.tasks import stratified_holdout

    classes = [0] * 40 + [1] * 9 + [2] * 2 + [3]  # a rare class, and one seen once
    train, val = stratified_holdout(classes, 0.25, seed=1, source="d.jsonl")
    assert sorted(train + val) == list(range(len(classes)))
    assert {classes[i] for i in train} == {0, 1, 2, 3}
    assert len(val) == 13  # as many as the plain holdout: a quarter of 52
    assert [sum(classes[i] == c for i in val) for c in range(4)] == [10, 2, 1, 0]
    # 12 records of 4 classes at 10%: one held out, not none
    train, val = stratified_holdout([0, 1, 2, 3] * 3, 0.1, seed=1, source="d.jsonl")
    assert len(val) == 1 and {c for c in [0, 1, 2, 3] * 3} == {([0, 1, 2, 3] * 3)[i] for i in train}


def test_a_new_classifier_run_records_its_split(trained, tmp_path):
    rows = [{"text": f"The {a} dug {t}.", "label": a} for t in ("a den", "a hole", "a nest") for a in ANIMALS]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    result = run("finetune", "--ckpt", trained, data, "--task", "classify", "--out", tmp_path / "C", *FT)
    assert result.exit_code == 0, result.output
    saved = checkpoint_meta(tmp_path / "C")
    assert (
        saved["split"] == "stratified"
        and saved["labels"] == sorted(ANIMALS)
        and len(saved["data_sha256"]) == 64
    )


# --- crashes and full disks leave nothing in the way ----------------------------------------------------


def test_temp_files_of_dead_processes_are_removed_on_the_next_start(trained, tmp_path):
    pid = dead_pid()
    make_corpus(tmp_path / "c.txt")
    out = tmp_path / "tok"
    out.mkdir()
    leftovers = [
        f".train.bin.{files._host()}-{pid}-abc123.tmp",  # this version's names
        f".meta.json.{files._host()}-{pid}-abc123.tmp",
        f".val.bin.{pid}-0a1b2c3d.tmp",  # an earlier version's
    ]
    for name in leftovers:
        (out / name).write_bytes(b"half")
    assert run("tokenize", tmp_path / "c.txt", "--out", out).exit_code == 0
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]

    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    for name in (f".last.tmp-{pid}", f".best.{files._host()}-{pid}-abc.tmpdir"):
        (run_dir / name).mkdir()
        (run_dir / name / "model.safetensors").write_bytes(b"half")
    (run_dir / f".config.yaml.{pid}.tmp").write_text("half")
    mine = run_dir / f".last.{files._host()}-{os.getpid()}-abc.tmpdir"  # a live process's: kept
    mine.mkdir()
    make_corpus(tmp_path / "animals.txt", n_sentences=300)
    result = run("pretrain", tmp_path / "animals.txt", "--resume", "--out", run_dir, "--max-iters", "122")
    assert result.exit_code == 0, result.output
    hidden = sorted(p.name for p in run_dir.iterdir() if p.name.startswith("."))
    assert hidden == [mine.name]


def test_the_same_tokenize_works_again_after_kill_9(tmp_path):
    big = tmp_path / "big.txt"
    line = "The rabbit dug a hole because winter was coming, and the fox watched it dig.\n"
    big.write_text(line * 200_000)  # 16 MB: long enough to kill halfway
    out = tmp_path / "tok"
    args = [sys.executable, "-m", "gptcli", "tokenize", str(big), "--out", str(out), "-t", "gpt2"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(args, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(out.glob(".train.bin.*.tmp")):
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "meta.json").exists()  # killed before it finished
    again = subprocess.run(
        args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    assert again.returncode == 0, again.stderr
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]


class _Full:
    """A file whose writes fail as on a full disk, after the first few bytes."""

    def __init__(self, f) -> None:
        self.f = f

    def write(self, data) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def test_a_full_disk_is_one_line_and_leaves_no_temp_files(tmp_path, monkeypatch):
    make_corpus(tmp_path / "c.txt")
    out = tmp_path / "tok"
    real_open = files.open_new
    monkeypatch.setattr(files, "open_new", lambda path, mode=0o666: _Full(real_open(path, mode)))
    for _ in range(2):  # failed retries do not pile up
        result = run("tokenize", tmp_path / "c.txt", "--out", out)
        line = assert_usage_error(result, "no space left on the device", code=1)
        assert str(out / "train.bin") in line and "free" in line
        needed = re.search(r"\(at least ([\d.]+) (bytes|kB|MB)", line)
        assert needed and float(needed[1]) > 0  # what the failed write itself asked for
        assert [p.name for p in out.iterdir()] == []


def test_a_write_cut_short_and_a_name_too_long_are_one_line(tmp_path):
    """numpy's words for a write cut short (a GGUF file under a file size limit) read as a
    full disk or the limit; a name the file system refuses as too long is bad input (2)."""
    short = OSError("3216448 requested and 69800 written")
    assert files.is_full(short)
    line = str(files.disk_full(tmp_path / "a.gguf", None, cause=short))
    assert line.startswith("the disk is full or the file size limit (ulimit -f) is reached: could not write")
    assert "free some space or raise the limit" in line
    line = assert_usage_error(run("sample", "--ckpt", "a" * 5000), "is too long for the file system")
    assert len(line) < 300


def test_a_path_through_a_file_is_one_line(tmp_path, monkeypatch):
    """--out notes.txt/run, or GPTCLI_CACHE_DIR naming a file: which part is a file, not the
    OS's bare 'Not a directory'."""
    from tests.helpers import TINY, make_corpus

    corpus = make_corpus(tmp_path / "c.txt")
    notes = tmp_path / "notes.txt"
    notes.write_text("mine\n")
    assert_usage_error(
        run("tokenize", corpus, "--out", notes / "d"),
        f"{notes} is a file, not a directory; give a path under",
    )
    assert_usage_error(
        run("pretrain", corpus, "--out", notes / "run", *TINY), f"{notes} is a file, not a directory"
    )
    monkeypatch.setenv("GPTCLI_CACHE_DIR", str(notes))
    assert_usage_error(
        run("pretrain", corpus, "--out", tmp_path / "r", *TINY), "not a directory (under GPTCLI_CACHE_DIR)"
    )
    monkeypatch.setenv("GPTCLI_CACHE_DIR", str(notes / "cache"))  # the file is above the cache
    assert_usage_error(
        run("pretrain", corpus, "--out", tmp_path / "r", *TINY), f"{notes} is a file", "(under GPTCLI_CACHE"
    )
    assert notes.read_text() == "mine\n" and not (tmp_path / "r").exists()
    monkeypatch.delenv("GPTCLI_CACHE_DIR")
    assert run("pretrain", corpus, "--out", tmp_path / "r", *TINY, "--max-iters", "1").exit_code == 0
    for args in (  # a file's path (--save, GGUF) or a directory's (a Hugging Face export)
        ["inspect-attn", "The fox", "--ckpt", tmp_path / "r", "--save", notes / "a.html"],
        ["export", tmp_path / "r", notes / "m.gguf"],
        ["export", tmp_path / "r", notes / "hf"],
    ):
        assert_usage_error(run(*args), f"{notes} is a file, not a directory; give a path under a directory")
    assert notes.read_text() == "mine\n"


def test_a_full_disk_while_saving_a_checkpoint_keeps_the_last_good_one(trained, tmp_path, monkeypatch):
    import gptcli.store.checkpoint as checkpoint

    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    before = checkpoint_meta(run_dir)["step"]

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "save_file", full)
    make_corpus(tmp_path / "animals.txt", n_sentences=300)
    result = run("pretrain", tmp_path / "animals.txt", "--resume", "--out", run_dir, "--max-iters", "130")
    assert result.exit_code == 1 and "Traceback" not in result.output
    line = result.output.strip().splitlines()[-1]  # after the progress lines
    assert line.startswith("error: no space left on the device to write") and str(run_dir / "last") in line
    assert checkpoint_meta(run_dir)["step"] == before
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".")]


# --- CSV errors point at the cause ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            'text,label\nhello,a\n"unclosed,b\nfine,a\nmore,b\n',
            'd.csv:3: a quote (") opened on this line is not closed',
        ),
        ('text,label\n"two\nlines",a\nx,"y\nz,b\n', 'd.csv:4: a quote (") opened on this line is not closed'),
        ("text,label\nhello,a\ntoo,many,cells\n", "d.csv:3: 3 columns, but the header has 2"),
        ('text,label\nhello,a\n"x""y",b,c\n', "d.csv:3: 3 columns, but the header has 2"),
        ("", "d.csv: empty file; it needs a header row"),
    ],
    ids=["unclosed", "unclosed-after-multiline", "columns", "escaped-quote", "empty"],
)
def test_csv_errors_point_at_the_line_that_causes_them(trained, tmp_path, text, message):
    (tmp_path / "d.csv").write_text(text)
    result = run("finetune", "--ckpt", trained, tmp_path / "d.csv", "--task", "classify", *FT)
    assert_usage_error(result, message)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('text,label\n"a\u2028b",x\nhello,a,extra\n', "d.csv:3: 3 columns"),  # not a line end to csv
        ('text,label\nhello\x0cworld,a\n"open,b\n', "d.csv:3: a quote"),
    ],
    ids=["line-separator", "form-feed"],
)
def test_csv_lines_are_counted_as_csv_counts_them(trained, tmp_path, text, message):
    (tmp_path / "d.csv").write_text(text, encoding="utf-8")
    result = run("finetune", "--ckpt", trained, tmp_path / "d.csv", "--task", "classify", *FT)
    assert_usage_error(result, message)


def test_only_gptcli_s_own_leftovers_are_removed(tmp_path):
    """A directory that is not gptcli's keeps every file, whatever its name looks like."""
    pid = dead_pid()
    make_corpus(tmp_path / "c.txt")
    user = tmp_path / "userdir"
    (user / f".draft.tmp-{pid}").mkdir(parents=True)
    (user / f".draft.tmp-{pid}" / "chapter.txt").write_text("mine")
    (user / f".notes.txt.{pid}.tmp").write_text("mine")
    (user / f".train.bin.{pid}.tmp").mkdir()  # a directory where tokenize only leaves files
    before = sorted(str(p.relative_to(user)) for p in user.rglob("*"))
    assert_usage_error(run("tokenize", tmp_path / "c.txt", "--out", user), "is not empty")
    assert sorted(str(p.relative_to(user)) for p in user.rglob("*")) == before


def test_a_tokenized_dir_from_elsewhere_is_checked(trained, tmp_path):
    make_corpus(tmp_path / "c.txt")
    good = tmp_path / "tok"
    assert run("tokenize", tmp_path / "c.txt", "--out", good).exit_code == 0
    for name, change, message in (
        ("files", lambda d: _edit(d / "meta.json", files=[1, 2]), "'files' must be a list of paths"),
        ("odd size", lambda d: (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:-1]),
         "not a whole number of uint16 ids; tokenize the corpus again (gptcli tokenize CORPUS --out"),
        ("beyond vocab", lambda d: (d / "val.bin").write_bytes(b"\xff" * (d / "val.bin").stat().st_size),
         "the val tokens hold id 65535, beyond the vocabulary of"),
    ):  # fmt: skip
        shutil.copytree(good, tmp_path / name)
        change(tmp_path / name)
        result = run("pretrain", tmp_path / name, "--out", tmp_path / f"R-{name}", *SHORT)
        assert result.exit_code == 2 and "Traceback" not in result.output, result.output
        assert message in result.output.strip().splitlines()[-1]


def _edit(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_bpe_tokenizer_missing_a_byte_is_refused(tmp_path):
    from gptcli.data.tokenizer import train_bpe

    data = json.loads(train_bpe(["the rabbit dug a hole, the fox dug a den. " * 40], 270).dumps())
    data["ranks"], data["vocab_size"] = data["ranks"][1:], data["vocab_size"] - 1  # no token for byte 0x00
    (tmp_path / "tok.json").write_text(json.dumps(data))
    assert_usage_error(run("tokenize", "hello", "-t", tmp_path / "tok.json"), "byte 0x00 has no token")


def test_a_prompt_file_behind_a_link_is_read_from_its_end(trained, tmp_path):
    (tmp_path / "long.txt").write_text("The mole dug a den. " * 200 + "The fox dug a hole.")
    (tmp_path / "link.txt").symlink_to(tmp_path / "long.txt")
    result = run("sample", "--ckpt", trained, "--prompt-file", tmp_path / "link.txt", "-n", "2", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["prompt"].endswith("dug a hole.")  # the file's last words, not its first


def test_a_foreign_line_in_metrics_jsonl_does_not_stop_a_resume(trained, tmp_path):
    run_dir = tmp_path / "R"
    shutil.copytree(trained, run_dir)
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('[1]\n{"step": "x"}\n')
    make_corpus(tmp_path / "animals.txt", n_sentences=300)
    result = run("pretrain", tmp_path / "animals.txt", "--resume", "--out", run_dir, "--max-iters", "125")
    assert result.exit_code == 0, result.output
