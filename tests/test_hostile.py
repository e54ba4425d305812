"""Hostile input, third round, class by class: sizes a file claims are checked before
anything of that size exists; nothing from outside reaches the terminal raw; no exception
class name is ever shown; errors say what a path is; the compiled training step is one
graph in a real run."""

from __future__ import annotations

import gzip
import json
import os
import random
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import CLASS_NAME, ROOT, TINY, assert_usage_error, edit_json, make_corpus, run

# what a terminal acts on instead of showing: C0 (but newline and tab), DEL, C1
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
ESC_NAME = "evil\x1b]0;TITLE\x07\x1b[2J"  # retitles and clears a terminal that prints it


@pytest.fixture(scope="module")
def ws(tmp_path_factory, trained) -> Path:
    w = tmp_path_factory.mktemp("hostile")
    make_corpus(w / "corpus.txt")
    shutil.copytree(trained, w / "run")
    assert run("export", w / "run", "--to", "hf", w / "hf").exit_code == 0
    return w


def _variant(ws: Path, name: str, source: str, file: str, **changes) -> Path:
    """A copy of ws/source (a run or an HF directory) with keys of one JSON file changed."""
    dst = ws / name
    if not dst.exists():
        shutil.copytree(ws / source, dst)
        edit_json(dst / file, **changes)
    return dst


# --- memory is bounded by what is checked ----------------------------------------------------

BIG = 10**9
CLAIMS = [
    # (id, source, file, changes, what the one line says)
    ("layers", "run", "best/checkpoint.json", {"model.n_layer": BIG}, "holds 1 blocks but the config says n_layer = 1000000000"),
    ("width", "run", "best/checkpoint.json", {"model.n_embd": BIG}, "transformer.wte.weight has shape"),
    ("vocabulary", "run", "best/checkpoint.json", {"model.vocab_size": BIG}, "transformer.wte.weight has shape"),
    ("context", "run", "best/checkpoint.json", {"model.block_size": BIG}, "transformer.wpe.weight has shape"),
    ("classes", "run", "best/checkpoint.json", {"model.n_classes": BIG}, "lacks classifier.weight"),
    ("heads", "run", "best/checkpoint.json", {"model.n_head": BIG}, "a head needs at least one dimension"),
    ("hf layers", "hf", "config.json", {"n_layer": BIG}, "holds 1 blocks but the config says n_layer = 1000000000"),
    ("hf width", "hf", "config.json", {"n_embd": BIG, "n_head": 1}, "transformer.wte.weight has shape"),
    ("hf context", "hf", "config.json", {"n_positions": BIG}, "transformer.wpe.weight has shape"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("source", "file", "changes", "message"), [c[1:] for c in CLAIMS], ids=[c[0] for c in CLAIMS]
)
def test_sizes_a_file_claims_are_checked_before_a_model_of_that_size_is_laid_out(
    ws, monkeypatch, source, file, changes, message
):
    """No GPT is built, not even on the meta device, with a size the weights do not hold."""
    from gptcli import model

    built = []
    init = model.GPT.__init__
    monkeypatch.setattr(model.GPT, "__init__", lambda self, c: (built.append(c), init(self, c))[1])
    ckpt = _variant(ws, f"claim-{source}-{'-'.join(changes)}", source, file, **changes)
    assert_usage_error(run("sample", "--ckpt", ckpt, "-n", "2"), message)
    assert all(max(c.n_layer, c.n_embd, c.block_size, c.vocab_size or 0) < 1000 for c in built), built


def test_a_lora_checkpoint_claiming_a_huge_rank_or_head_is_refused_before_building_it(ws, monkeypatch):
    from gptcli import lora

    lora_run = ws / "lora"
    if not lora_run.exists():
        data = ws / "sft.jsonl"
        data.write_text(
            "".join(json.dumps({"prompt": "The fox", "completion": " dug"}) + "\n" for _ in range(20))
        )
        args = [
            "finetune",
            "--ckpt",
            ws / "run",
            data,
            "--task",
            "sft",
            "--lora-rank",
            "2",
            "--out",
            lora_run,
        ]
        assert run(*args, "--max-iters", "2", "--eval-iters", "1", "--dtype", "fp32").exit_code == 0
    monkeypatch.setattr(lora, "add_adapters", lambda *a: pytest.fail("adapters built before the check"))
    for name, changes, message in [
        ("rank", {"lora_rank": 2**16}, "lora_A has shape (2, 32) but the config needs (65536, 32)"),
        ("head", {"model.n_classes": BIG}, "lacks classifier.weight"),
    ]:
        ckpt = _variant(ws, f"lora-{name}", "lora", "best/checkpoint.json", **changes)
        assert_usage_error(run("sample", "--ckpt", ckpt), message)


def test_memory_stays_bounded_in_a_process_whose_address_space_is_capped(ws):
    """The end-to-end check: under a 4 GB address space (a billion-layer model would need
    terabytes), every claim is one line and exit 2, not an allocation failure."""
    claims = [
        _variant(ws, f"capped-{i}", "run", "best/checkpoint.json", **c[3]) for i, c in enumerate(CLAIMS[:4])
    ]

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = (
        "import sys; from gptcli.cli.app import app\n"
        "for c in sys.argv[1:]:\n"
        "    print(app(['sample', '--ckpt', c], standalone_mode=False), flush=True)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, *map(str, claims)], env=env, capture_output=True, text=True,
        preexec_fn=cap, timeout=300, check=False,
    )  # fmt: skip
    assert proc.stdout.split() == ["2"] * len(claims), proc.stdout + proc.stderr
    assert "out of memory" not in proc.stderr and proc.stderr.count("do not match the config") == len(claims)


# --- configs: aliases, depth, duplicate keys ----------------------------------------------------


def _bomb(key: str, levels: int) -> str:
    """A YAML alias bomb under train.KEY: 9**levels values once expanded."""
    text = "train:\n  " + key + ": [&a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]"
    for i in range(1, levels):
        text += f", &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]"
    return text + "]\n"


YAML = [
    # (id, file content, what the one line says)
    ("bomb under a number", _bomb("batch_size", 9), "expands to more than 100,000 values"),
    ("bomb under a list", _bomb("trackers", 9), "expands to more than 100,000 values"),
    ("bomb under a string", _bomb("device", 9), "expands to more than 100,000 values"),
    ("small bomb quoted", _bomb("batch_size", 4), "train.batch_size must be an integer, got a list of 4 items"),
    ("deep", "train: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 32 levels deep"),
    ("deep mapping", "train:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 60)), "nested more than 32 levels"),
    ("duplicate key", "train:\n  lr: 0.001\n  lr: 0.5\n", "'lr' is given twice (lines 2 and 3); keep one"),
    ("duplicate section", "train: {lr: 0.1}\nmodel: {n_layer: 2}\ntrain:\n  lr: 0.2\n", "'train' is given twice (lines 1 and 3)"),
    ("a long value", "train:\n  device: " + "x" * 500_000 + "\n", "characters cut]"),
    ("a 2 MB file", "# " + "x" * 2**21 + "\n", "is 2,097,155 bytes; a config is a few hundred"),
    ("not a mapping key", "train: {[a, b]: 1}\n", "is not valid YAML"),
]  # fmt: skip


@pytest.mark.parametrize(("content", "message"), [c[1:] for c in YAML], ids=[c[0] for c in YAML])
def test_a_hostile_config_is_one_short_line(tmp_path, content, message):
    (tmp_path / "c.yaml").write_text(content)
    line = assert_usage_error(
        run("pretrain", make_corpus(tmp_path / "c.txt"), "-c", tmp_path / "c.yaml"), message
    )
    assert len(line) < 2200, len(line)
    assert not (tmp_path / "runs").exists()


def test_yaml_merge_keys_and_anchors_a_person_writes_still_work(tmp_path):
    from gptcli.config import load_config

    (tmp_path / "c.yaml").write_text("train:\n  <<: {lr: 0.1, max_iters: 3}\n  lr: 0.2\n")
    config = load_config(tmp_path / "c.yaml")
    assert (config.train.lr, config.train.max_iters) == (0.2, 3)
    (tmp_path / "d.yaml").write_text("train:\n  lr: &rate 0.002\n  min_lr: *rate\n")
    assert load_config(tmp_path / "d.yaml").train.min_lr == 0.002


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("cdir", "config file cdir is a directory, not a file"),
        ("/dev/zero", "is a character device, not a file"),
    ],
)
def test_a_config_path_that_is_not_a_file_says_what_it_is(tmp_path, monkeypatch, path, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cdir").mkdir()
    assert_usage_error(run("pretrain", make_corpus(tmp_path / "c.txt"), "-c", path), message)


# --- nothing from outside reaches the terminal raw ----------------------------------------------


def _no_raw_control(output: str) -> None:
    assert not RAW_CONTROL.search(output), repr(output[:500])
    assert "\ud800" not in output
    assert max(map(len, output.splitlines()), default=0) < 2200


def test_file_names_paths_and_prompts_are_shown_escaped(ws, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(ws / "corpus.txt", corpus / "a.txt")
    name = os.fsencode(ESC_NAME) + b"\xe9.txt"  # Latin-1 bytes in the name, too
    with open(os.fsencode(corpus) + b"/" + name, "wb") as f:
        f.write(b"\xff\xfe not UTF-8")
    result = run("pretrain", corpus, "--out", "r")
    line = assert_usage_error(result, "invalid UTF-8")
    assert "evil\\x1b]0;TITLE\\x07\\x1b[2J\\xe9.txt" in line
    _no_raw_control(result.output)
    # a line break in a name is shown escaped too: the error stays one line
    line = assert_usage_error(run("sample", "--ckpt", "two\nlines\u2028three", "-p", "hi"), "no such file")
    assert "--ckpt two\\nlines\\u2028three:" in line

    for args in (
        ["sample", "--ckpt", ws / "run", "-p", "\x1b[2JThe fox"],  # a character the model does not know
        ["eval", "--ckpt", ws / "run", f"{ESC_NAME}.jsonl"],
        ["classify", "--ckpt", ws / "run", "--file", f"{ESC_NAME}.csv"],
        ["inspect-attn", "The", "--ckpt", ws / "run", "--save", f"{ESC_NAME}/a.html"],
        ["tokenize", "\x1b[2J\x9b31m hello\u202e", "-t", "gpt2"],
    ):
        _no_raw_control(run(*args).output)


def test_a_megabyte_path_in_a_checkpoint_is_cut(ws, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(ws / "run", run_dir)
    edit_json(run_dir / "last" / "checkpoint.json", data_dir="\x1b[2J" + "d" * 2**20)
    result = run("pretrain", "--resume", "--out", run_dir)
    line = assert_usage_error(result, "the run's data", "characters cut]")
    _no_raw_control(result.output)
    assert len(line) < 2200


def test_generated_text_and_labels_from_a_model_are_escaped(tmp_path, monkeypatch):
    """A model trained on text full of escape sequences writes them; on screen they are
    escaped, in --json they are JSON escapes that parse back to the very characters."""
    monkeypatch.chdir(tmp_path)
    rng = random.Random(0)
    text = "".join(rng.choice(["\x1b[2J", "\x9b", "ab", "\x07", "\u202e", "c "]) for _ in range(4000))
    (tmp_path / "esc.txt").write_text(text)
    assert run("pretrain", "esc.txt", "--out", "esc", *TINY, "--max-iters", "40").exit_code == 0
    plain = run("sample", "--ckpt", "esc", "-n", "60", "--seed", "1")
    assert plain.exit_code == 0
    _no_raw_control(plain.output)
    assert "\\x1b" in plain.output or "\\x9b" in plain.output or "\\x07" in plain.output
    as_json = run("sample", "--ckpt", "esc", "-n", "60", "--seed", "1", "--json")
    _no_raw_control(as_json.output)
    sample = json.loads(as_json.output)["samples"][0]["text"]
    assert set(sample) & set("\x1b\x9b\x07\u202e")  # the characters themselves, after parsing
    shown = run("sample", "--ckpt", "esc", "-p", "ab", "-n", "3", "--show-probs", "5", "--seed", "1")
    _no_raw_control(shown.output)

    records = [{"text": t, "label": lab} for t, lab in [("ab c", "\x1b[31mred"), ("c ab", "blue\x07")] * 20]
    (tmp_path / "labels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    args = [
        "finetune",
        "--ckpt",
        "esc",
        "labels.jsonl",
        "--task",
        "classify",
        "--out",
        "cls",
        "--max-iters",
        "3",
    ]
    trained = run(*args, "--eval-iters", "1", "--dtype", "fp32")
    assert trained.exit_code == 0, trained.output
    _no_raw_control(trained.output)
    scored = run("classify", "--ckpt", "cls", "--file", "labels.jsonl")
    _no_raw_control(scored.output)
    assert "\\x1b[31mred" in scored.output


def test_printable_escapes_what_a_terminal_acts_on_and_quote_is_bounded():
    from gptcli.messages import printable, quote

    assert printable("a\tb\nc") == "a\tb\nc"
    assert (
        printable("\x1b[2J\r\x00\x7f\x9b\u202e\udce9\ud800") == "\\x1b[2J\\r\\0\\x7f\\x9b\\u202e\\xe9\\ud800"
    )
    assert printable("[bold]x[/]") == "[bold]x[/]"  # Rich markup is the render layer's to keep literal
    long = printable("x" * 10**6, 300)
    assert len(long) < 340 and "999,700 characters cut" in long
    nested: list = []
    nested.append(nested)
    bomb: list = ["lol"] * 9
    for _ in range(30):  # 9**30 strings once expanded: only ever walked a few levels deep
        bomb = [bomb] * 9
    for value in (nested, bomb, {"k": bomb}, "y" * 10**6, 3.5, None):
        assert len(quote(value)) < 200


# --- no exception class on screen ---------------------------------------------------------------


@pytest.fixture
def gz_corpus(tmp_path) -> Path:
    data = bytearray(gzip.compress(make_corpus(tmp_path / "c.txt").read_bytes() * 5))
    rng = random.Random(1)
    for i in range(40, 60):
        data[i] = rng.randrange(256)
    path = tmp_path / "damaged.txt.gz"
    path.write_bytes(bytes(data))
    return path


@pytest.mark.parametrize("isal", [True, False], ids=["with isal", "standard library"])
def test_a_damaged_gzip_file_is_named_with_what_is_wrong(gz_corpus, monkeypatch, isal):
    if not isal:
        monkeypatch.setitem(sys.modules, "isal.igzip", None)  # the gzip extra absent
    line = assert_usage_error(
        run("pretrain", gz_corpus, "--out", gz_corpus.parent / "r"),
        "damaged.txt.gz: the gzip data is damaged",
    )
    assert "error: error" not in line


def test_a_bpe_tokenizer_whose_pattern_cannot_split_text_is_refused(tmp_path):
    make_corpus(tmp_path / "c.txt")
    assert run("tokenize", tmp_path / "c.txt", "--out", tmp_path / "d", "-t", "bpe:300").exit_code == 0
    for pattern, message in [("", "its pattern is not a regular expression"), ("(?:)", "its pattern cannot split text"),
                             ("a", "its pattern leaves some text out"), ("(", "corrupted (")]:  # fmt: skip
        edit_json(tmp_path / "d" / "tokenizer.json", pattern=pattern)
        assert_usage_error(
            run("pretrain", tmp_path / "d", "--out", tmp_path / "r"), "tokenizer.json is corrupted", message
        )


@pytest.mark.parametrize(
    ("verb", "record"),
    [
        (["eval", "--ckpt", "{run}", "--task", "text"], {"text": "ab\ud800cd"}),
        (["finetune", "--ckpt", "{run}", "--task", "sft"], {"prompt": "The \ud800", "completion": "fox"}),
        (["finetune", "--ckpt", "{run}", "--task", "classify"], {"text": "x", "label": "\udcff"}),
        (["tokenize", "--out", "o", "-t", "gpt2"], {"text": "\ud83d"}),
    ],
    ids=["eval", "sft", "a label", "tokenize"],
)
def test_a_lone_surrogate_in_a_record_is_named_by_file_and_line(ws, tmp_path, monkeypatch, verb, record):
    monkeypatch.chdir(tmp_path)
    lines = [json.dumps({"text": "fine", "prompt": "a", "completion": "b", "label": "x"})] * 3 + [
        json.dumps(record)
    ]
    (tmp_path / "r.jsonl").write_text("\n".join(lines) + "\n")
    args = [a.format(run=ws / "run") for a in verb]
    assert_usage_error(run(*args[:1], "r.jsonl", *args[1:]), "r.jsonl:4: the text holds", "not a character")


def test_random_bytes_in_metrics_are_set_aside_and_the_run_resumes(ws, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(ws / "run", run_dir)
    metrics = run_dir / "metrics.jsonl"
    good = metrics.read_bytes().splitlines()
    bad = [os.urandom(64).replace(b"\n", b"") for _ in range(2)] + [b'{"step": "no"}']
    metrics.write_bytes(b"\n".join(good[:3] + bad[:1] + good[3:] + bad[1:]) + b"\n")
    result = run("pretrain", "--resume", "--out", run_dir, "--max-iters", "150")
    assert result.exit_code == 0, result.output
    assert (
        "warning: " + str(metrics) + ": 3 damaged lines set aside in metrics.jsonl.damaged" in result.output
    )
    assert (run_dir / "metrics.jsonl.damaged").read_bytes() == b"".join(b + b"\n" for b in bad)
    assert all(isinstance(json.loads(ln), dict) for ln in metrics.read_text().splitlines())
    assert not CLASS_NAME.search(result.output)


def test_a_file_size_limit_reads_like_a_full_disk(ws, tmp_path):
    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 10, 16 << 10))

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for args in (["export", ws / "run", "--to", "hf", tmp_path / "hf"], ["pretrain", ws / "corpus.txt", "--out", tmp_path / "r", *TINY, "--n-embd", "64"]):  # fmt: skip
        proc = subprocess.run([sys.executable, "-m", "gptcli", *map(str, args)], env=env, capture_output=True,
                              text=True, preexec_fn=cap, timeout=300, check=False)  # fmt: skip
        last = proc.stderr.strip().splitlines()[-1]
        assert proc.returncode == 1 and last.startswith(
            "error: the file size limit (ulimit -f) is too small to write"
        ), proc.stderr
        assert not CLASS_NAME.search(proc.stderr)
    # no half-written export left behind: not its directory, nor its temporary one
    assert not any(p.name == "hf" or p.name.startswith(".hf.") for p in tmp_path.iterdir())


def test_a_tracking_server_that_is_down_fails_at_once_naming_it(ws, tmp_path, monkeypatch):
    pytest.importorskip("mlflow")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{port}")
    result = run("pretrain", ws / "corpus.txt", "--out", tmp_path / "r", *TINY, "--tracker", "mlflow")
    assert_usage_error(
        result, f"--tracker mlflow: the MLflow server at http://127.0.0.1:{port} cannot be reached"
    )
    assert not (tmp_path / "r").exists()


def test_an_unforeseen_failure_says_what_gptcli_was_doing_with_which_file(ws, monkeypatch):
    from gptcli.data import sources

    def fail(self, buffer):
        raise RuntimeError("the disk controller went away")

    monkeypatch.setattr(sources._Counting, "readinto", fail)
    line = assert_usage_error(run("tokenize", ws / "corpus.txt", "--out", ws / "never"), code=1)
    assert line.startswith(
        f"error: reading {ws / 'corpus.txt'} failed unexpectedly: the disk controller went away"
    )


def test_an_error_whose_first_line_ends_in_a_colon_says_the_next(ws, monkeypatch):
    """torch's 'backend='inductor' raised:', then the error on the next line: both said."""
    from gptcli.errors import reason

    assert reason(RuntimeError("backend='inductor' raised:\nImportError: x.so: file too short\n\nSet")) == (
        "backend='inductor' raised: x.so: file too short"
    )


def test_torchs_compiler_failing_names_its_cache(trained, monkeypatch):
    """A damaged TorchInductor cache (a run killed while compiling) fails every compiled run
    the same way: the one line names the cache to delete and --no-compile."""
    from gptcli.infer import completion

    class BackendCompilerFailed(Exception):  # (torch._dynamo.exc's, recognised by its name)
        def __init__(self) -> None:
            super().__init__("backend='inductor' raised:")
            self.inner_exception = ImportError("/tmp/ind/zy/c.main.so: file too short")

    def fail(*args, **kwargs):
        raise BackendCompilerFailed()

    monkeypatch.setattr(completion, "generate", fail)
    result = run("sample", "--ckpt", trained, "-n", "2", "--compile")
    assert result.exit_code == 1 and "Traceback" not in result.output
    said, line = result.output.strip().splitlines()  # it said it was compiling, then why it stopped
    assert said.startswith("compiling the decoding step (torch.compile")
    assert line.startswith("error: ") and not CLASS_NAME.search(line)
    assert "torch's compiler failed (/tmp/ind/zy/c.main.so: file too short)" in line
    assert "and run again; --no-compile runs without it" in line


def test_every_verbs_failure_paths_name_no_exception_class(ws, tmp_path, monkeypatch):
    """A sweep of bad input over every verb: whatever the message, never a class name."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.jsonl").write_text('{"text": 1}\n[1]\n')
    (tmp_path / "bad.csv").write_text('text,label\n"open quote,x\n')
    (tmp_path / "bin.txt").write_bytes(b"\x00\x01")
    (tmp_path / "dir").mkdir()
    r = str(ws / "run")
    sweeps = [
        ["tokenize", "bin.txt", "--out", "o"], ["tokenize", "x", "-t", "bpe:3"], ["tokenize", "/dev/zero", "--out", "o"],
        ["pretrain", "bin.txt"], ["pretrain", "dir"], ["pretrain", "corpus.txt", "--n-embd", "0"],
        ["finetune", "--ckpt", r, "bad.jsonl", "--task", "classify"], ["finetune", "--ckpt", r, "bad.csv", "--task", "classify"],
        ["finetune", "--ckpt", "dir", "bad.jsonl"], ["sample", "--ckpt", r, "--prompt-file", "dir"],
        ["sample", "--ckpt", r, "--temp", "nan"], ["beam", "Zz~", "--ckpt", r], ["inspect-attn", "", "--ckpt", r],
        ["inspect-lens", "The", "--ckpt", r, "--track", "Zzz"], ["classify", "--ckpt", r, "x"],
        ["eval", "--ckpt", r, "bad.jsonl"], ["eval", "--ckpt", r, "/dev/urandom"],
        ["export", r, "--to", "hf", "/dev/null/x"], ["export", "dir", "out"],
    ]  # fmt: skip
    for args in sweeps:
        result = run(*args)
        assert result.exit_code != 0, (args, result.output)
        assert not CLASS_NAME.search(result.output), (args, result.output)
        assert "Traceback" not in result.output


# --- errors that say what a path is ------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["pretrain", "/dev/zero"], "the corpus /dev/zero is a character device, not a file or a directory"),
        (["tokenize", "/dev/urandom", "--out", "o"], "/dev/urandom is a character device"),
        (["classify", "--ckpt", "{run}", "--file", "dir"], "dir is a directory, not a file"),
        (["classify", "--ckpt", "{run}", "--file", "/dev/zero"], "/dev/zero is a character device"),
        (["eval", "--ckpt", "{run}", "/dev/zero"], "/dev/zero is a character device"),
        (
            ["finetune", "--ckpt", "{run}", "/dev/zero", "--task", "classify"],
            "/dev/zero is a character device",
        ),
        (
            ["pretrain", "corpus.txt", "--eval-file", "/dev/zero"],
            "--eval-file /dev/zero is a character device",
        ),
        (["pretrain", "withpipe"], "withpipe/pipe.txt in the corpus is a named pipe, not a file of text"),
    ],
)
def test_a_device_pipe_or_directory_where_a_file_goes_is_named_for_what_it_is(
    ws, tmp_path, monkeypatch, args, message
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir").mkdir()
    (tmp_path / "withpipe").mkdir()
    shutil.copy(ws / "corpus.txt", tmp_path / "withpipe" / "a.txt")
    os.mkfifo(tmp_path / "withpipe" / "pipe.txt")
    shutil.copy(ws / "corpus.txt", tmp_path / "corpus.txt")
    assert_usage_error(run(*[a.format(run=ws / "run") for a in args]), message)


def test_a_csv_saved_with_a_byte_order_mark_is_read(tmp_path):
    from gptcli.data.records import read_records

    rows = "".join(f"the {w} ran,{w}\n" for w in ("fox", "owl") * 4)
    (tmp_path / "excel.csv").write_bytes(b"\xef\xbb\xbf" + f"text,label\n{rows}".encode())
    (tmp_path / "bom.jsonl").write_bytes(b"\xef\xbb\xbf" + b'{"text": "a", "label": "b"}\n')
    assert read_records(tmp_path / "excel.csv")[0].fields == {"text": "the fox ran", "label": "fox"}
    assert read_records(tmp_path / "bom.jsonl")[0].fields == {"text": "a", "label": "b"}


# --- the compiled training step is one graph in a real run -------------------------------------


@pytest.mark.parametrize("task", ["lm", "classify", "choice", "sft"])
def test_a_compiled_run_breaks_no_graph(ws, tmp_path, task):
    """The path a run takes (the CLI, the trainer, the compiled task loss), counted by
    dynamo itself: no graph break at any step, evaluation included."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    rows = {
        "classify": [{"text": f"the {w} dug", "label": w} for w in ("fox", "owl") * 8],
        "choice": [{"context": "The fox", "choices": [" dug", " ran"], "label": i % 2} for i in range(16)],
        "sft": [{"prompt": "The fox", "completion": " dug a den."} for _ in range(16)],
    }
    if task == "lm":
        args = ["pretrain", ws / "corpus.txt", *TINY]
    else:
        (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[task]))
        args = ["finetune", "--ckpt", ws / "run", tmp_path / "d.jsonl", "--task", task, "--dtype", "fp32"]
        args += ["--batch-size", "4", "--device", "cpu"]
    torch._dynamo.reset()
    counters.clear()
    result = run(
        *args,
        "--out",
        tmp_path / "r",
        "--compile",
        "--max-iters",
        "3",
        "--eval-interval",
        "2",
        "--eval-iters",
        "1",
    )
    assert result.exit_code == 0, result.output
    assert counters["stats"]["unique_graphs"] >= 1  # it did compile
    assert dict(counters["graph_break"]) == {}, dict(counters["graph_break"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--grad-accum", str(2**63)],
            "out of memory on this machine: --grad-accum 9223372036854775808 with",
        ),
        (
            ["--grad-accum", str(2**31 - 1)],
            "out of memory on this machine: --grad-accum 2147483647 with --batch-size",
        ),
        (["--muon-lr", "1e308"], "train.muon_lr (--muon-lr) must be at most 3.4e+38, got 1e+308"),
    ],
)
def test_numbers_a_run_cannot_hold_are_refused_before_it_starts(ws, tmp_path, flags, message):
    assert_usage_error(run("pretrain", ws / "corpus.txt", "--out", tmp_path / "r", *TINY, *flags), message)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"amsgrad": True}, "its adamw setting amsgrad is True, not a value adamw takes"),
        ({"eps": "\x1b[2J"}, "its adamw setting eps is '\\x1b[2J'"),
        ({"betas": [0.9]}, "its adamw setting betas is a list of 1 item"),
        ({"weight_decay": 1e308}, "its adamw setting weight_decay is 1e+308"),
        ({"params": [0]}, "its adamw has other parameter groups than this model"),
    ],
)
def test_optimizer_settings_in_a_training_state_are_checked_before_resuming(ws, tmp_path, change, message):
    run_dir = tmp_path / "run"
    shutil.copytree(ws / "run", run_dir)
    state = json.loads((run_dir / "last" / "train_state.json").read_text())
    state["optimizer"]["param_groups"][0].update(change)
    (run_dir / "last" / "train_state.json").write_text(json.dumps(state))
    result = run("pretrain", "--resume", "--out", run_dir, "--max-iters", "150")
    _no_raw_control(result.output)
    assert_usage_error(result, "the training state is damaged", message)


def test_a_missing_or_empty_metrics_log_has_no_damaged_line(tmp_path):
    """A log deleted or emptied by hand holds no lines, not one damaged empty line."""
    from gptcli.train.state import DAMAGED, MetricsLog

    log = MetricsLog(tmp_path / "metrics.jsonl")
    assert log.set_aside_damaged() == 0
    log.path.write_bytes(b"")
    assert log.set_aside_damaged() == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert not (tmp_path / f"metrics.jsonl{DAMAGED}").exists()


def test_an_empty_path_is_refused_not_read_as_the_working_directory(tmp_path, monkeypatch):
    """Path("") is "." (an unset $OUT in a script): `export RUN "" --force` wrote the export
    into the working directory, over its config.json. Every path flag and argument refuses
    an empty one in a line, before anything is read or written."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text("mine")
    make_corpus(tmp_path / "c.txt", n_sentences=20)
    for args, name in [
        (["export", "runs/none", "", "--force"], "out"),
        (["tokenize", "c.txt", "--out", ""], "--out"),
        (["pretrain", "c.txt", "--out", "", *TINY], "--out"),
        (["eval", "--ckpt", "runs/none", "c.txt", ""], "files"),
        (["sample", "--prompt-file", ""], "--prompt-file"),
    ]:
        line = assert_usage_error(run(*args), "is empty; give a path")
        assert name in line.lower(), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "config.json"]
    assert (tmp_path / "config.json").read_text() == "mine"
