"""Starting and continuing training runs: what `gptcli pretrain` and `gptcli finetune` do
before the loop, callable from Python without the CLI.

    from gptcli.train.recipes import pretrain_trainer
    trainer = pretrain_trainer(["corpus.txt"], flags={"model": {"n_layer": 2}}, out="runs/x")
    summary = trainer.run()

Each function builds the run's config (defaults < YAML < flags), finds or makes its data,
builds or loads the model and returns a Trainer; `resume_*` check that what is given again
matches the run (its config by field, its data by content hash). Under torchrun the set-up
runs once per machine and every process gets its result. What is worth saying on the way
goes to a gptcli.reports.Notes.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

from gptcli import lora
from gptcli.config import (
    CONFIG_CHANGES_ON_RESUME,
    FINETUNE_DEFAULTS,
    SAVED_BEFORE,
    Config,
    FinetuneSettings,
    TrainConfig,
    load_config,
    merge,
    read_yaml,
    resume_config,
)
from gptcli.data.corpus import (
    TokenizeReport,
    cached_corpus,
    collect_files,
    is_tokenized_dir,
    load_data_tokenizer,
    load_split,
    read_meta,
)
from gptcli.data.inputs import what_is
from gptcli.data.records import content_sha256
from gptcli.data.sources import Reader
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.messages import command_line, printable
from gptcli.model import GPT
from gptcli.paths import RUNS_DIR
from gptcli.reports import Notes
from gptcli.runtime import broadcast_from_main, dist_from_env, seed_everything, shared_setup
from gptcli.store import loading
from gptcli.store.checkpoint import LAST, STABLE, Loaded, checkpoint_in, newest_run
from gptcli.store.checkpoint import read_meta as read_checkpoint_meta
from gptcli.store.layout import refuse_inside_checkpoints
from gptcli.tasks import LMTask, Task, supervised_task
from gptcli.train.state import DAMAGED, METRICS_FILE, MetricsLog
from gptcli.train.trainer import CONFIG_FILE, Trainer

Flags = dict[str, dict[str, Any]]  # {section: {key: value}}, as config.flag_overrides makes


# --- pretraining ---------------------------------------------------------------------------


def pretrain_trainer(
    corpus: list[str | Path],
    *,
    config_path: str | Path | None = None,
    out: str | Path | None = None,
    flags: Flags | None = None,
    notes: Notes | None = None,
) -> Trainer:
    """A new run that trains a GPT from scratch on corpus (text files, directories of them,
    or a directory made by `gptcli tokenize`) in out (default runs/<corpus>-<time>)."""
    notes, flags = notes or Notes(), flags or {}
    corpus = [Path(c) for c in corpus]
    if not corpus:
        raise UsageError("give the text to train on: gptcli pretrain CORPUS... (files or directories)")
    config = load_config(config_path, flags)
    if config.model.n_classes:
        raise UsageError(
            f"model.n_classes {config.model.n_classes}: pretraining trains a language model; a "
            "classifier's head comes from finetuning one (gptcli finetune --task classify)"
        )
    for text in config.train.unused(flags.get("train", {})):
        notes.warning(text)
    explicit_tokenizer = "tokenizer" in flags.get("data", {}) or (
        config_path is not None and "tokenizer" in (read_yaml(config_path).get("data") or {})
    )

    def prepare() -> tuple[Path, Path, TokenizeReport]:
        run_dir = new_run_dir(out, corpus[0].resolve().stem)
        tokenizer, fraction = config.data.tokenizer, config.data.val_fraction
        reader = Reader(config.data.text_column)
        return (run_dir, *prepare_text(corpus, tokenizer, fraction, notes, explicit_tokenizer, reader))

    run_dir, data_dir, report = shared_setup(config.train.device, prepare, config.train.dist_timeout)
    run_dir = broadcast_from_main(run_dir)  # the same run dir for every process of a torchrun job
    config.data.tokenizer = report.tokenizer
    tok, task = _lm_task(data_dir, config)
    seed_everything(config.train.seed)
    model = GPT(config.model)
    data = {
        "data_dir": recorded(data_dir),
        "sources": list(report.files),
        "data_sha256": report.source_sha256,
    }
    return Trainer(model, tok, task, config, run_dir, meta={"task": "lm", **data})


def resume_pretraining(
    out: str | Path | None = None,
    *,
    corpus: list[str | Path] | None = None,
    config_path: str | Path | None = None,
    flags: Flags | None = None,
    new_data: bool = False,
    notes: Notes | None = None,
) -> Trainer:
    """The run in out (default: the newest under ./runs), continued exactly from last/: on
    its own tokens, or on corpus when given again (which must be the same text, unless
    new_data)."""
    notes = notes or Notes()
    loaded, config = load_for_resume(out, flags or {}, config_path, notes, finetuning=False)
    run_dir, meta = loaded.path.parent, loaded.meta
    if "data_dir" not in meta:
        raise UsageError(
            f"{loaded.path}/checkpoint.json does not say where the run's data is; it cannot be resumed"
        )
    data_dir, sources = Path(meta["data_dir"]), meta.get("sources", [])
    steps_left_for_new_data(meta, config.train.max_iters, new_data)
    if corpus:  # text encoded by the run's own tokenizer (a bpe:N one is not trained anew on it)
        paths = [Path(c) for c in corpus]
        tokenizer, fraction = loaded.tokenizer, config.data.val_fraction
        data_dir, report = shared_setup(
            config.train.device,
            lambda: prepare_text(
                paths, tokenizer, fraction, notes, True, Reader(config.data.text_column), owner=run_dir
            ),
            config.train.dist_timeout,
        )
        what, sources = " ".join(map(str, paths)), list(report.files)
    elif what_is(data_dir) != "a directory":
        raise UsageError(
            f"the run's data ({printable(str(data_dir), 300)}) is gone; pass the corpus again: "
            f"{command_line('pretrain', 'CORPUS', '--resume', '--out', run_dir)}"
        )
    else:
        report, what = read_meta(data_dir), f"the tokens in {data_dir}"
    check_tokenized_with(data_dir, loaded.tokenizer, run_dir)
    _, task = _lm_task(data_dir, config)
    data = {"data_dir": recorded(data_dir), "sources": sources}
    data |= same_data(meta, report.source_sha256, new_data, what, notes)
    meta = {"task": "lm", **data}
    return Trainer(loaded.model, loaded.tokenizer, task, config, run_dir, meta, _resume_point(loaded))


def _lm_task(data_dir: Path, config: Config) -> tuple[Tokenizer, LMTask]:
    """The tokenizer and next-token task of a tokenized directory; sets the model's
    vocab_size from the tokenizer when the config leaves it unset."""
    tok = load_data_tokenizer(data_dir)
    if config.model.vocab_size is None:
        config.model.vocab_size = tok.vocab_size
    elif config.model.vocab_size < tok.vocab_size:
        raise UsageError(
            f"model.vocab_size {config.model.vocab_size} is smaller than the tokenizer's {tok.vocab_size}"
        )
    train, val = load_split(data_dir, "train"), load_split(data_dir, "val")
    return tok, LMTask(train, val, config.model.block_size, config.model.vocab_size, tok.byte_lengths())


# --- finetuning ----------------------------------------------------------------------------


def finetune_trainer(
    settings: FinetuneSettings,
    *,
    config_path: str | Path | None = None,
    out: str | Path | None = None,
    flags: Flags | None = None,
    notes: Notes | None = None,
) -> Trainer:
    """A new run that finetunes settings.base (a run, checkpoint, Hugging Face directory or
    hub name) on settings.data for settings.task, in out (default runs/<data>-<task>-<time>)."""
    notes, settings = notes or Notes(), settings.validate()
    loaded = loading.load(settings.base)
    base_block = loaded.model.config.block_size
    tokenizer, added = loaded.tokenizer, []
    if settings.task == "chat" and not tokenizer.has_chat:  # the template's tokens join the vocabulary
        tokenizer = tokenizer.with_chat_tokens()
        added = list(range(loaded.tokenizer.vocab_size, tokenizer.vocab_size))
        loaded.model.add_token_rows(added)
    config = _finetune_config(loaded, config_path, flags or {})
    for text in config.train.unused((flags or {}).get("train", {})):
        notes.warning(text)
    if settings.lora_rank and config.train.optimizer == "muon":  # Muon's matrices are LoRA's frozen base
        raise UsageError(
            "--optimizer muon trains the blocks' weight matrices, which LoRA keeps frozen; "
            "use --optimizer adamw with --lora-rank (AdamW trains the adapters)"
        )
    if config.model.block_size > base_block:
        raise UsageError(
            f"--block-size {config.model.block_size} is larger than the checkpoint's {base_block}; "
            "its position embeddings stop there"
        )

    def prepare() -> tuple[Path, Task, dict[str, Any]]:
        run_dir = new_run_dir(out, f"{Path(settings.data[0]).stem}-{settings.task}")
        return (run_dir, *_finetune_task(settings, tokenizer, config, notes))

    run_dir, task, extra = shared_setup(config.train.device, prepare, config.train.dist_timeout)
    run_dir = broadcast_from_main(run_dir)  # the same run dir for every process of a torchrun job
    if added:
        notes.info(f"chat: {describe_added(tokenizer, added)}")
    seed_everything(config.train.seed)
    model = GPT(config.model)
    loaded.model.crop_block_size(config.model.block_size)
    state = {k: v for k, v in loaded.model.state_dict().items() if not k.startswith("classifier.")}
    model.load_state_dict(state, strict=False)  # a new classification head, if the task has one
    meta = {**settings_meta(settings), **extra}
    adapters = lora.LoRASettings.of(meta)
    if adapters is not None:  # the run saves its adapters and refers to this base, by path and hash
        lora.add_adapters(model, adapters)
        if added:  # rows the base has no trained value for learn beside the adapters
            lora.train_token_rows(model, added)
            meta["added_tokens"] = [added[0], len(added)]
        meta |= {"base_checkpoint": str(loaded.path.resolve()), "base_sha256": loading.weights_sha256(loaded)}
        notes.info(f"LoRA: {lora.describe(model, adapters)}")
    return Trainer(model, tokenizer, task, config, run_dir, meta=meta)


def describe_added(tokenizer: Tokenizer, ids: list[int]) -> str:
    """One line: the tokens the chat template added, and where."""
    shown = ", ".join(f"{tokenizer.special_text(i) or repr(tokenizer.decode([i]))} = {i}" for i in ids)
    where = f"the {tokenizer.name} vocabulary"
    return f"{len(ids)} token(s) added to {where} ({shown}), rows set to the mean embedding"


def _finetune_config(loaded: Loaded, config_path: str | Path | None, flags: Flags) -> Config:
    """Finetuning defaults < --config < flags for training; the model comes from the checkpoint."""
    config = Config(train=TrainConfig(**asdict(FINETUNE_DEFAULTS)))
    config.model = type(loaded.model.config)(**vars(loaded.model.config))
    config.data.tokenizer = loaded.tokenizer.name
    if config_path is not None:
        values = read_yaml(config_path)
        model_keys = set(values.get("model") or {}) - {"dropout", "block_size"}
        if model_keys or "data" in values:
            raise UsageError(
                f"{config_path}: the model's shape and tokenizer come from the checkpoint; "
                "only model.dropout, model.block_size and train.* can be set"
            )
        merge(config, values, str(config_path))
    merge(config, flags, "the command line")
    config.model.n_classes = 0
    return config.validate()


def resume_finetuning(
    out: str | Path | None = None,
    *,
    given: dict[str, Any] | None = None,
    config_path: str | Path | None = None,
    flags: Flags | None = None,
    new_data: bool = False,
    notes: Notes | None = None,
) -> Trainer:
    """The finetuning run in out (default: the newest under ./runs), continued exactly.
    given: FinetuneSettings fields the command repeats (None where not given), which must
    be the run's; its data is compared by content, and may change only with new_data."""
    notes = notes or Notes()
    given = {k: v for k, v in (given or {}).items() if v is not None}
    moved_base = given.pop("base_checkpoint", None)  # --base: where a LoRA run's base is now
    loaded, config = load_for_resume(out, flags or {}, config_path, notes, finetuning=True, base=moved_base)
    meta = loaded.meta
    names = [f.name for f in fields(FinetuneSettings)]
    required = ["task", "data", "base"]  # what every finetuning run has saved
    missing = [k for k in required if k not in meta]
    if missing:
        raise UsageError(f"{loaded.path}/checkpoint.json lacks {', '.join(missing)}; it cannot be resumed")
    settings = FinetuneSettings(**{k: meta[k] for k in names if k in meta})  # older runs: defaults
    _check_same_settings(settings, given)
    steps_left_for_new_data(meta, config.train.max_iters, new_data)
    if given.get("data"):  # the same data, perhaps by another path (checked by content below)
        settings.data = [str(p) for p in given["data"]]
    if given.get("val_data") is not None:
        settings.val_data = str(given["val_data"])
    task, extra = shared_setup(
        config.train.device,
        lambda: _finetune_task(
            settings, loaded.tokenizer, config, notes, labels=meta.get("labels"), split=meta.get("split")
        ),
        config.train.dist_timeout,
    )
    extra |= same_data(meta, extra["data_sha256"], new_data, " ".join(settings.data), notes)
    if settings.lora_rank:  # the same base (checked by hash on loading), perhaps in a new place
        where = Path(moved_base).resolve() if moved_base is not None else meta["base_checkpoint"]
        extra |= {"base_checkpoint": str(where), "base_sha256": meta["base_sha256"]}
        if "added_tokens" in meta:  # and the same tokens added to it
            extra["added_tokens"] = meta["added_tokens"]
    meta = {**settings_meta(settings), **extra}
    run_dir = loaded.path.parent
    return Trainer(loaded.model, loaded.tokenizer, task, config, run_dir, meta, _resume_point(loaded))


def recorded(path: str | Path) -> str:
    """How a run records a path it was given: absolute, so that resuming it from another
    working directory finds it (a hub name, which is no path here, as it came). Links are
    kept as links: the path the user gave, not where it pointed then."""
    return os.path.abspath(path) if Path(path).exists() else str(path)


def settings_meta(settings: FinetuneSettings) -> dict[str, Any]:
    """A finetuning run's settings as its checkpoint records them (its paths absolute)."""
    meta = asdict(settings)
    meta["data"] = [recorded(p) for p in settings.data]
    meta["base"] = recorded(settings.base)
    if settings.val_data is not None:
        meta["val_data"] = recorded(settings.val_data)
    return meta


def _check_same_settings(settings: FinetuneSettings, given: dict[str, Any]) -> None:
    """A resumed finetune keeps its starting model, task and data: what the command gives
    again must be what the run has (the data is compared by content, later)."""
    conflicts = []
    for key, value in given.items():
        if key == "data":
            continue
        saved = getattr(settings, key)
        flag = "--ckpt" if key == "base" else "--" + key.replace("_", "-")
        if key in ("base", "val_data"):
            same = saved is not None and (str(value) == saved or _same_file(Path(value), Path(saved)))
        elif key == "lora_targets":
            same = set(value) == set(saved)
        else:
            same = value == saved
        if not same:
            conflicts.append(f"{flag} is {str(value)!r}, the run's is {saved!r}")
    if conflicts:
        raise UsageError(
            f"{'; '.join(conflicts)}: a resumed run keeps its starting model, task and data; "
            "give the run's values or drop them, or start a new run"
        )


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _finetune_task(
    settings: FinetuneSettings,
    tok: Tokenizer,
    config: Config,
    notes: Notes,
    labels: list | None = None,
    split: str | None = "stratified",
) -> tuple[Task, dict[str, Any]]:
    """The task, and what the checkpoint must remember about it (labels, data dir, the
    data's content hash, how validation was held out); sets config.model.n_classes for the
    head the task needs. split: None for runs made before validation was stratified."""
    block = config.model.block_size
    if settings.task == "lm":
        config.model.n_classes = 0
        paths = [Path(p) for p in settings.data]
        data_dir, report = prepare_text(
            paths,
            tok,
            settings.val_fraction,
            notes,
            reader=Reader(config.data.text_column),
            owner=settings.base,
        )
        train, val = load_split(data_dir, "train"), load_split(data_dir, "val")
        task = LMTask(train, val, block, config.model.vocab_size, tok.byte_lengths())
        return task, {"data_dir": recorded(data_dir), "data_sha256": report.source_sha256}
    seed = config.train.seed
    task, config.model.n_classes, extra = supervised_task(asdict(settings), tok, block, seed, labels, split)
    extra["data_sha256"] = content_sha256([settings.data[0], settings.val_data])
    if extra.get("chat_cut"):
        notes.warning(
            f"chat: {extra['chat_cut']} conversation(s) longer than the block of {block} tokens lost "
            f"their {extra['chat_turns_dropped']} oldest turn(s) (system messages kept)"
        )
    if settings.task == "classify":
        notes.info(
            f"classify: {task.num_examples('train')} training and {task.num_examples('val')} "
            f"validation examples, labels {extra['labels']}"
        )
    return task, extra


# --- what both share -------------------------------------------------------------------------


def new_run_dir(out: str | Path | None, stem: str) -> Path:
    """out, or runs/<stem>-<timestamp>; never a directory that already holds something."""
    path = RUNS_DIR / f"{stem or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}" if out is None else Path(out)
    refuse_inside_checkpoints(path, "choose an --out outside it")
    if path.exists() and not path.is_dir():
        raise UsageError(f"{path} is a file; a run is a directory: choose another --out")
    if path.exists() and any(path.iterdir()):
        if checkpoint_in(path, LAST) is None:
            raise UsageError(f"{path} already holds other files (not a run); choose another --out")
        raise UsageError(f"{path} already holds a run; pass --resume to continue it, or choose another --out")
    return path


def prepare_text(
    corpus: list[Path],
    tokenizer: str | Tokenizer,
    val_fraction: float,
    notes: Notes | None = None,
    explicit_tokenizer: bool = False,
    reader: Reader = Reader(),
    owner: str | Path = "CKPT",
) -> tuple[Path, TokenizeReport]:
    """A tokenized directory for the corpus, and its report: the directory given (made by
    `gptcli tokenize`), or raw text tokenized into the cache, reused when the same text and
    tokenizer come again. tokenizer: a spec (char, gpt2, bpe:N), or a model's Tokenizer
    (owner: the run or checkpoint it comes from, which a tokenized directory must match)."""
    notes = notes or Notes()
    if len(corpus) == 1 and corpus[0].is_dir() and is_tokenized_dir(corpus[0]):
        report = read_meta(corpus[0])
        if isinstance(tokenizer, str):
            if explicit_tokenizer and report.tokenizer != tokenizer.lower():
                raise UsageError(
                    f"{corpus[0]} is tokenized with {report.tokenizer}, not {tokenizer}; drop --tokenizer "
                    "(or the config's data.tokenizer), or tokenize the text again with: "
                    f"{command_line('tokenize', 'TEXT', '--out', 'DIR', '-t', tokenizer)}"
                )
        else:
            check_tokenized_with(corpus[0], tokenizer, owner)
        return corpus[0], report
    total = sum(f.stat().st_size for f in collect_files(corpus))
    with notes.progress("tokenizing", total) as update:
        data_dir, report = cached_corpus(corpus, tokenizer, val_fraction, update, reader)
    verb = "reusing the cached tokens of" if report.reused else "tokenized"
    notes.note(
        f"{verb} {len(report.files)} file(s): {report.tokens:,} {report.tokenizer} tokens ({data_dir})"
    )
    return data_dir, report


def check_tokenized_with(data_dir: Path, tokenizer: Tokenizer, owner: str | Path) -> None:
    """A tokenized directory must hold the model's very tokenizer (a bpe:N: the same merges);
    else one line with the command that tokenizes the text with it (owner: the run or
    checkpoint the tokenizer comes from)."""
    theirs = load_data_tokenizer(data_dir)
    if theirs.to_dict() == tokenizer.to_dict():
        return
    same_name = theirs.name.lower() == tokenizer.name.lower()
    other = (
        f"another {theirs.name} than the model's"
        if same_name
        else f"{theirs.name}, not the model's {tokenizer.name}"
    )
    raise UsageError(
        f"{data_dir} is tokenized with {other}; tokenize the text with the model's own: "
        f"{command_line('tokenize', 'TEXT', '--out', 'DIR', '-t', owner)}"
    )


def load_for_resume(
    out: str | Path | None,
    flags: Flags,
    config_path: str | Path | None,
    notes: Notes,
    *,
    finetuning: bool,
    base: str | Path | None = None,
) -> tuple[Loaded, Config]:
    """The last/ checkpoint of the run to resume, and its config: the saved one, where the
    --config file and the flags may repeat its values, and change only what a resumed run
    may change. A LoRA run's adapters come on top of its base (base: where it is now, if it
    moved), kept apart from the weights to train on. finetuning: which verb resumes it (a
    finetuning run names its base; the other verb's run is refused before it is loaded)."""
    if out is None:  # the newest run this verb resumes
        found_run = newest_run(finetuned=finetuning)
        if found_run is None:
            kind = "finetuning" if finetuning else "pretraining"
            raise UsageError(f"--resume: no {kind} run under ./runs to continue; pass --out RUN_DIR")
        notes.info(f"resuming the newest run: {found_run}")
        run = found_run
    else:
        run = Path(out)
        if run.name in (LAST, "best") and run.parent.is_dir():
            run = run.parent  # --out RUN/last means the run
    found = checkpoint_in(run, LAST)
    if found is None:
        raise UsageError(f"--resume: {run} has no last/ checkpoint to continue from")
    if ("base" in read_checkpoint_meta(found)) != finetuning:  # (pretraining would drop its finetuning)
        kind, verb = ("pretraining", "pretrain") if finetuning else ("finetuning", "finetune")
        raise UsageError(
            f"{run} is a {kind} run; resume it with {command_line(verb, '--resume', '--out', run)}"
        )
    if dist_from_env().is_main:  # one process repairs the log; the trainer's rank 0 writes it
        damaged = MetricsLog(run / METRICS_FILE).set_aside_damaged()
        if damaged:
            notes.warning(
                f"{run / METRICS_FILE}: {damaged} damaged line{'s' if damaged > 1 else ''} set aside in "
                f"{METRICS_FILE}{DAMAGED}; the run continues with the readable ones"
            )
    loaded = loading.load(found, base=base, merge=False)
    if unused := loading.base_unused(loaded, base):
        notes.warning(unused)
    if not isinstance(loaded.meta.get("config"), dict):
        raise UsageError(f"{loaded.path}/checkpoint.json has no run config; it cannot be resumed")
    # keys the run was saved without mean what they meant then, whatever the default is now
    before = Config(train=TrainConfig(**asdict(SAVED_BEFORE)))
    saved = merge(before, loaded.meta["config"], f"{loaded.path}/checkpoint.json")
    given = [(read_yaml(config_path), str(config_path))] if config_path is not None else []
    in_copy: dict[tuple[str, str], Any] = {}  # what RUN/config.yaml says of what a resume may change
    if config_path is None or not _same_file(Path(config_path), run / CONFIG_FILE):
        in_copy = _check_config_copy(run / CONFIG_FILE, saved)
    config = resume_config(saved, [*given, (flags, "the command line")])
    now = config.to_dict()
    ignored = [f"{key}: {value!r}" for (section, key), value in in_copy.items() if now[section][key] != value]
    if ignored:  # (edited by hand, or written by a session cut before its first checkpoint)
        notes.warning(
            f"{run / CONFIG_FILE} says {', '.join(ignored)}, which this session does not take (the "
            f"checkpoint's and the flags' instead) and writes over; to take them, pass "
            f"-c {run / CONFIG_FILE}"
        )
    step = loaded.meta.get("step")
    if isinstance(step, int) and config.train.max_iters < step:
        from_flag = "max_iters" in (flags.get("train") or {})
        named = "--max-iters" if from_flag or config_path is None else f"max_iters in {config_path}"
        raise UsageError(
            f"{named} {config.train.max_iters} is below step {step}, which the run has reached; "
            f"give --max-iters {step} or more"
        )
    if config.train.eval_files == saved.train.eval_files:  # the run's own, not given again
        gone = [p for p in config.train.eval_files if not Path(p).is_file()]
        if gone:
            notes.warning(f"--eval-file {', '.join(gone)}: no longer there; not scored from now on")
            config.train.eval_files = [p for p in config.train.eval_files if p not in gone]
    stable = _longer_wsd_run(loaded, saved, config, run, notes)
    if stable is not None:
        loaded = loading.load(stable, base=base, merge=False)
    loaded.model.train()
    return loaded, config


def _check_config_copy(path: Path, saved: Config) -> dict[tuple[str, str], Any]:
    """RUN/config.yaml is the run's config as gptcli wrote it, rewritten by every session; one
    whose maths was edited by hand (in the hope that the resumed run takes it) is refused
    rather than overwritten: a resumed run's settings are its checkpoint's, and -c or the flags.
    Returns what it says of the settings a resume may change, where they differ from saved's
    ({(section, key): value}: the caller says which it will not take)."""
    if not path.is_file() or path.is_symlink():
        return {}
    written = read_yaml(path)  # (not YAML: refused as read_yaml refuses it, the file kept)
    if not isinstance(written, dict):
        return {}
    ours = saved.to_dict()
    differ = {
        (section, key): value
        for section, keys in written.items()
        if isinstance(keys, dict) and isinstance(ours.get(section), dict)
        for key, value in keys.items()
        if key in ours[section] and value != ours[section][key]
    }
    changeable = {where: value for where, value in differ.items() if where[1] in CONFIG_CHANGES_ON_RESUME}
    edited = [
        f"{section}.{key}: {value!r}, not {ours[section][key]!r}"
        for (section, key), value in differ.items()
        if key not in CONFIG_CHANGES_ON_RESUME
    ]  # (what a resume may change, it changes: a session cut before its first checkpoint wrote those)
    if edited:
        raise UsageError(
            f"{path} was edited ({'; '.join(edited[:3])}), and resuming would rewrite it: a resumed "
            f"run's settings are its checkpoint's; give what may change as flags or with -c {path}, "
            "or undo the edit"
        )
    return changeable


def _longer_wsd_run(loaded: Loaded, saved: Config, config: Config, run: Path, notes: Notes) -> Path | None:
    """The stable/ checkpoint to continue from when a WSD run whose decay has begun is
    given a longer budget: it goes on at the constant rate and decays at the new end."""
    began = loaded.meta.get("decay_started")
    old, new = saved.train, config.train
    longer = new.max_iters > old.max_iters or (
        old.max_time is not None and (new.max_time is None or new.max_time > old.max_time)
    )
    if new.schedule != "wsd" or began is None or not longer:
        return None
    stable = checkpoint_in(run, STABLE)
    if stable is None:
        notes.warning(
            f"the run's decay began at step {began} and its {STABLE}/ checkpoint is gone, so the "
            "longer run decays from the current rate to the new end"
        )
        return None
    notes.info(
        f"the run's decay began at step {began}: the longer run continues from {stable} at the "
        f"constant rate and decays over the last {new.decay_fraction:.0%} of the new budget; "
        f"{loaded.path} (step {loaded.meta.get('step')}) stays until the run's next checkpoint"
    )
    return stable


def _resume_point(loaded: Loaded) -> str:
    """Which of the run's checkpoints loaded is: stable/ (a longer WSD run) or last/."""
    return STABLE if loaded.path.name in (STABLE, f"{STABLE}.old") else LAST


def steps_left_for_new_data(meta: dict[str, Any], max_iters: int, new_data: bool) -> None:
    """--new-data on a run already at its max_iters would train nothing on the new data (and
    record nothing): refused before the data is read."""
    step = meta.get("step")
    if new_data and isinstance(step, int) and step >= max_iters:
        raise UsageError(
            f"the run has reached its max_iters {max_iters}, so it would not train on new data; give "
            f"--max-iters above {step}"
        )


def same_data(meta: dict[str, Any], sha256: str, new_data: bool, what: str, notes: Notes) -> dict[str, Any]:
    """Check that a resumed run gets the data it was trained on (by content hash), or, with
    new_data, record the change; returns the metadata to save with the run."""
    saved = meta.get("data_sha256")
    if saved is None or saved == sha256:  # runs made before the hash was kept: take it as given
        return {"data_sha256": sha256}
    if not new_data:
        raise UsageError(
            f"{what} is not the data this run was trained on (content sha256 {sha256[:12]}, the run's "
            f"{saved[:12]}); give the run's data, or add --new-data to continue on this on purpose"
        )
    notes.warning(f"continuing on new data ({what}); the run records the change at step {meta.get('step')}")
    change = {"step": meta.get("step"), "data_sha256": sha256, "previous": saved}
    return {"data_sha256": sha256, "data_changes": [*meta.get("data_changes", []), change]}
