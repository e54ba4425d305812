"""`gptcli finetune`: continue training a checkpoint on new text (lm), on labelled examples
(classify, choice: GPT-1's recipe), or on prompt/completion pairs (sft)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptcli.cli import render
from gptcli.cli.common import command
from gptcli.cli.training import (
    MODEL,
    RUN,
    Config,
    JsonSummary,
    NewData,
    Resume,
    load_for_resume,
    new_run_dir,
    opt,
    prepare_text,
    run_trainer,
    same_data,
    train_flags,
    training_options,
)
from gptcli.config import NON_NEGATIVE, TrainConfig
from gptcli.errors import UsageError

if TYPE_CHECKING:
    from gptcli.config import Config as RunConfig
    from gptcli.model import GPT
    from gptcli.tasks import Task
    from gptcli.tokenizer import Tokenizer
    from gptcli.train import Trainer

TASKS = ("lm", "classify", "choice", "sft")
TASK = "Task"

# finetuning starts from a trained model: smaller steps, shorter runs, than pretraining
FINETUNE_DEFAULTS = TrainConfig(
    batch_size=16, lr=1e-4, min_lr=1e-5, warmup_iters=20, max_iters=300, eval_interval=50, weight_decay=0.01
)
T = training_options(FINETUNE_DEFAULTS)


def finetune(
    data: Annotated[
        list[Path] | None,
        typer.Argument(
            help="--task lm: text files/dirs (or a `gptcli tokenize` dir); otherwise a JSONL file "
            "(classify also takes CSV).",
            show_default=False,
        ),
    ] = None,
    ckpt: Annotated[
        str | None,
        opt(
            "--ckpt", help="The model to start from: a run, checkpoint dir, GPT-2 dir or hub name.", panel=RUN
        ),
    ] = None,
    task: Annotated[
        str | None, opt("--task", help="lm | classify | choice | sft (default: lm).", panel=TASK)
    ] = None,
    val_data: Annotated[
        Path | None,
        opt("--val-data", help="Validation records (default: hold out --val-fraction).", panel=TASK),
    ] = None,
    val_fraction: Annotated[
        float | None, opt("--val-fraction", help="Share held out for validation (default: 0.1).", panel=TASK)
    ] = None,
    aux_lm_weight: Annotated[
        float | None,
        opt(
            "--aux-lm-weight",
            help="lambda in L2 + lambda * L1, the auxiliary LM loss (default: 0.5).",
            panel=TASK,
        ),
    ] = None,
    delimiter: Annotated[
        str | None,
        opt(
            "--delimiter",
            help="Text between a pair's parts, or context and choice (default: newline).",
            panel=TASK,
        ),
    ] = None,
    both_orders: Annotated[
        bool,
        opt("--both-orders", help="Pairs: score both orders and add them (GPT-1's similarity).", panel=TASK),
    ] = False,
    config: Config = None,
    out: Annotated[
        Path | None, opt("--out", "-o", help="Run directory (default: runs/<data>-<task>-<time>).", panel=RUN)
    ] = None,
    resume: Resume = False,
    new_data: NewData = False,
    dropout: Annotated[
        float | None, opt("--dropout", help="Dropout probability (default: the checkpoint's).", panel=MODEL)
    ] = None,
    block_size: Annotated[
        int | None,
        opt("--block-size", help="A shorter context than the checkpoint's (default: its own).", panel=MODEL),
    ] = None,
    batch_size: T.batch_size = None,
    grad_accum: T.grad_accum = None,
    lr: T.lr = None,
    min_lr: T.min_lr = None,
    warmup_iters: T.warmup_iters = None,
    max_iters: T.max_iters = None,
    max_time: T.max_time = None,
    weight_decay: T.weight_decay = None,
    grad_clip: T.grad_clip = None,
    eval_interval: T.eval_interval = None,
    eval_iters: T.eval_iters = None,
    log_interval: T.log_interval = None,
    device: T.device = None,
    dtype: T.dtype = None,
    compile: T.compile = None,
    fsdp: T.fsdp = None,
    seed: T.seed = None,
    json_out: JsonSummary = False,
) -> None:
    """Finetune a model: domain text, classification, multiple choice or instructions.

    gptcli finetune --ckpt runs/demo more_stories.txt                    continue next-token training
    gptcli finetune --ckpt runs/demo reviews.jsonl --task classify      {"text": ..., "label": ...}
    gptcli finetune --ckpt gpt2 pairs.csv --task classify --both-orders  text_a,text_b,label
    gptcli finetune --ckpt runs/demo stories.jsonl --task choice         {"context", "choices", "label"}
    gptcli finetune --ckpt runs/demo qa.jsonl --task sft                 {"prompt", "completion"}
    """
    from gptcli.config import flag_overrides

    flags = flag_overrides(dropout=dropout, block_size=block_size, **train_flags(locals()))
    if resume:
        given = {
            "data": data, "base": ckpt, "task": task, "val_data": val_data, "val_fraction": val_fraction,
            "aux_lm_weight": aux_lm_weight, "delimiter": delimiter, "both_orders": both_orders or None,
        }  # fmt: skip
        trainer = _resume(out, flags, config, given, new_data)
    else:
        if new_data:
            raise UsageError(
                "--new-data goes with --resume (a new run simply trains on the data it is given)"
            )
        task = task or "lm"
        val_fraction = 0.1 if val_fraction is None else val_fraction
        aux_lm_weight = 0.5 if aux_lm_weight is None else aux_lm_weight
        delimiter = "\n" if delimiter is None else delimiter
        if task not in TASKS:
            raise UsageError(f"--task {task!r}: use one of {', '.join(TASKS)}")
        if ckpt is None:
            raise UsageError("give the model to start from: gptcli finetune --ckpt RUN_DIR DATA")
        if not data:
            raise UsageError(
                f"give the data to finetune on: {command('finetune', '--ckpt', ckpt, 'DATA', '--task', task)}"
            )
        if task != "lm" and len(data) != 1:
            raise UsageError(f"--task {task} takes one data file (and --val-data for validation)")
        if not 0.0 < val_fraction < 1.0:
            raise UsageError(f"--val-fraction must be in (0, 1), got {val_fraction}")
        if not NON_NEGATIVE.admits(aux_lm_weight):
            raise UsageError(f"--aux-lm-weight must be >= 0, got {aux_lm_weight}")
        settings = {
            "task": task,
            "data": [str(p) for p in data],
            "val_data": str(val_data) if val_data else None,
            "val_fraction": val_fraction,
            "aux_lm_weight": aux_lm_weight,
            "delimiter": delimiter,
            "both_orders": both_orders,
            "base": ckpt,
        }
        trainer = _fresh(ckpt, settings, config, out, flags)
    run_trainer(trainer, resume=resume, verb="finetune", json_out=json_out)


def _base_config(loaded: Any, config_path: Path | None, flags: dict) -> RunConfig:
    """Finetuning defaults < --config < flags for training; the model comes from the checkpoint."""
    from dataclasses import asdict

    from gptcli.config import Config as RunConfig
    from gptcli.config import merge, read_yaml

    config = RunConfig(train=TrainConfig(**asdict(FINETUNE_DEFAULTS)))
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


def _fresh(ckpt: str, settings: dict, config_path: Path | None, out: Path | None, flags: dict) -> Trainer:
    from gptcli import loading
    from gptcli.model import GPT
    from gptcli.runtime import broadcast_from_main, seed_everything, shared_setup

    loaded = loading.load(ckpt)
    base_block = loaded.model.config.block_size
    config = _base_config(loaded, config_path, flags)
    if config.model.block_size > base_block:
        raise UsageError(
            f"--block-size {config.model.block_size} is larger than the checkpoint's {base_block}; "
            "its position embeddings stop there"
        )

    def prepare() -> tuple[Path, Any, dict]:
        run_dir = new_run_dir(out, f"{Path(settings['data'][0]).stem}-{settings['task']}")
        return (run_dir, *_build_task(settings, loaded.tokenizer, config, seed=config.train.seed))

    run_dir, task, extra = shared_setup(config.train.device, prepare)
    run_dir = broadcast_from_main(run_dir)  # the same run dir for every process of a torchrun job
    seed_everything(config.train.seed)
    model = GPT(config.model)
    state = {k: v for k, v in loaded.model.state_dict().items() if not k.startswith("classifier.")}
    if config.model.block_size < base_block:
        state["transformer.wpe.weight"] = state["transformer.wpe.weight"][: config.model.block_size]
    model.load_state_dict(state, strict=False)
    return _trainer(model, loaded.tokenizer, task, config, run_dir, {**settings, **extra})


SETTINGS = ("task", "data", "val_data", "val_fraction", "aux_lm_weight", "delimiter", "both_orders", "base")


def _resume(out: Path | None, flags: dict, config_path: Path | None, given: dict, new_data: bool) -> Trainer:
    from gptcli.runtime import shared_setup

    loaded, config = load_for_resume(out, flags, config_path)
    meta = loaded.meta
    if "base" not in meta:
        raise UsageError(
            f"{loaded.path.parent} is a pretraining run; resume it with gptcli pretrain --resume"
        )
    missing = [k for k in SETTINGS if k not in meta]
    if missing:
        raise UsageError(f"{loaded.path}/checkpoint.json lacks {', '.join(missing)}; it cannot be resumed")
    settings = {k: meta[k] for k in SETTINGS}
    _check_resumed_settings(settings, given)
    if given["data"]:  # the same data, perhaps by another path (checked by content below)
        settings["data"] = [str(p) for p in given["data"]]
    if given["val_data"] is not None:
        settings["val_data"] = str(given["val_data"])
    task, extra = shared_setup(
        config.train.device,
        lambda: _build_task(
            settings, loaded.tokenizer, config, seed=config.train.seed, labels=meta.get("labels"),
            split=meta.get("split"),
        ),
    )  # fmt: skip
    extra |= same_data(meta, extra["data_sha256"], new_data, " ".join(settings["data"]))
    return _trainer(loaded.model, loaded.tokenizer, task, config, loaded.path.parent, {**settings, **extra})


def _check_resumed_settings(settings: dict, given: dict) -> None:
    """A resumed finetune keeps its starting model, task and data: what the command gives
    again must be what the run has (the data is compared by content, later)."""
    conflicts = []
    for key, value in given.items():
        if value is None or key == "data":
            continue
        saved = settings[key]
        flag = "--ckpt" if key == "base" else "--" + key.replace("_", "-")
        if key in ("base", "val_data"):
            same = saved is not None and (str(value) == saved or _same_file(Path(value), Path(saved)))
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


def _build_task(
    settings: dict,
    tok: Any,
    config: RunConfig,
    seed: int,
    labels: list | None = None,
    split: str | None = "stratified",
) -> tuple[Any, dict]:
    """The task, and what the checkpoint must remember about it (labels, data dir, the
    data's content hash, how validation was held out); sets config.model.n_classes for the
    head the task needs. split: None for runs made before validation was stratified."""
    from gptcli.data import content_sha256, load_split
    from gptcli.tasks import LMTask, supervised_task

    block = config.model.block_size
    if settings["task"] == "lm":
        config.model.n_classes = 0
        data_dir, report = prepare_text([Path(p) for p in settings["data"]], tok, settings["val_fraction"])
        task = LMTask(
            load_split(data_dir, "train"), load_split(data_dir, "val"), block, config.model.vocab_size
        )
        return task, {"data_dir": str(data_dir), "data_sha256": report.source_sha256}
    task, config.model.n_classes, extra = supervised_task(settings, tok, block, seed, labels, split)
    extra["data_sha256"] = content_sha256([settings["data"][0], settings["val_data"]])
    if settings["task"] == "classify":
        render.info(
            f"classify: {task.num_examples('train')} training and {task.num_examples('val')} "
            f"validation examples, labels {extra['labels']}"
        )
    return task, extra


def _trainer(model: GPT, tok: Tokenizer, task: Task, config: RunConfig, run_dir: Path, meta: dict) -> Trainer:
    from gptcli.train import Trainer

    return Trainer(model, tok, task, config, run_dir, meta=meta)
