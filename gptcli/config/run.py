"""A training run's config: three sections, each a dataclass, `model` (ModelConfig), `data`
(DataConfig) and `train` (TrainConfig), with finetuning's own settings (FinetuneSettings).
Values come from the defaults, then a YAML file, then command-line flags, each overriding
the one before; a resumed run takes the saved config, and only what --resume may change.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from gptcli.config.knobs import (
    FLOAT32_MAX,
    FRACTION,
    GREATER_THAN_ZERO,
    NON_NEGATIVE,
    OPEN_FRACTION,
    POSITIVE,
    SEED_MAX,
    SIZE,
    Range,
    check_fields,
    knob,
)
from gptcli.config.yaml_input import read_yaml
from gptcli.errors import UsageError
from gptcli.messages import command_line, quote

OPTIMIZERS = ("adamw", "muon")  # gptcli/train/optim.py
SCHEDULES = ("cosine", "wsd")
# the panels of --help
MODEL, TRAIN, HARDWARE, RUN, TASK = "Model", "Training", "Hardware", "Run", "Task"
LORA = "LoRA (train small adapters, keep the base frozen)"


@dataclass
class ModelConfig:
    """Shape of a GPT-2 style model (GPT-2 124M: 12 layers, 12 heads, 768 dims, block 1024).

    vocab_size is taken from the tokenizer when left unset; a larger value pads the
    embedding (e.g. 50304 for GPU-friendly shapes) and the extra ids are never sampled."""

    vocab_size: int | None = knob(None, check=SIZE)
    block_size: int = knob(256, check=SIZE, flag="--block-size", help="Context length in tokens", panel=MODEL)
    n_layer: int = knob(6, check=SIZE, flag="--n-layer", help="Transformer blocks", panel=MODEL)
    n_head: int = knob(6, check=SIZE, flag="--n-head", help="Attention heads per block", panel=MODEL)
    n_embd: int = knob(384, check=SIZE, flag="--n-embd", help="Model width", panel=MODEL)
    dropout: float = knob(0.0, check=FRACTION, flag="--dropout", help="Dropout probability", panel=MODEL)
    bias: bool = knob(True, flag="--bias/--no-bias", help="Biases in Linear and LayerNorm", panel=MODEL)
    n_classes: int = knob(0, check=Range(0, 2**31 - 1))  # > 0: a classification head (set by finetune)

    def validate(self) -> None:
        check_fields(self, "model")
        if self.n_embd % self.n_head:
            hint = (
                f"try n_embd={self.n_head * max(1, (self.n_embd + self.n_head // 2) // self.n_head)}"
                if self.n_head <= self.n_embd
                else "a head needs at least one dimension"
            )
            raise UsageError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head}); {hint}"
            )

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class DataConfig:
    """How raw text becomes tokens (ignored for a directory made by `gptcli tokenize`)."""

    tokenizer: str = knob("char", flag="--tokenizer", short="-t", help="char, gpt2 or bpe:N", panel=RUN)
    val_fraction: float = knob(0.1, check=OPEN_FRACTION)
    text_column: str = knob(
        "text", flag="--text-column", help="The column of Parquet files that holds the text", panel=RUN
    )

    def validate(self) -> None:
        from gptcli.data.tokenizer import parse_spec

        check_fields(self, "data")
        parse_spec(self.tokenizer)


@dataclass
class TrainConfig:
    """The optimisation loop: batches, optimizers, LR schedule, evaluation, hardware."""

    batch_size: int = knob(
        12, check=POSITIVE, flag="--batch-size", help="Sequences per micro-step (per process under torchrun)"
    )
    grad_accum: int | None = knob(
        None,
        check=POSITIVE,
        flag="--grad-accum",
        help="Micro-steps per optimizer step, shared by the processes",
        shown="one per process",
    )
    lr: float = knob(1e-3, check=GREATER_THAN_ZERO, flag="--lr", help="Peak learning rate")
    min_lr: float = knob(
        1e-4, check=NON_NEGATIVE, flag="--min-lr", help="Learning rate at the end of the cosine"
    )
    warmup_iters: int = knob(100, check=NON_NEGATIVE, flag="--warmup-iters", help="Linear warmup steps")
    max_iters: int = knob(2000, check=POSITIVE, flag="--max-iters", help="Optimizer steps", on_resume=True)
    max_time: float | None = knob(
        None,
        check=GREATER_THAN_ZERO,
        flag="--max-time",
        given_as=str,
        on_resume=True,
        help="Wall-clock budget, e.g. 90s, 15m, 2h; the LR schedule fits it",
    )
    weight_decay: float = knob(
        0.1, check=NON_NEGATIVE, flag="--weight-decay", help="AdamW weight decay on matrices"
    )
    beta1: float = knob(0.9, check=FRACTION)
    beta2: float = knob(0.99, check=FRACTION)
    # None: pretraining's default, resolved by validate(). Muon won the bench's char and
    # GPT-2 BPE cases on every seed (bench/RESULTS.md, "muon"); FSDP splits the matrices Muon
    # orthogonalizes, so under --fsdp the default is AdamW. Finetuning keeps AdamW.
    optimizer: str | None = knob(
        None,
        choices=OPTIMIZERS,
        flag="--optimizer",
        help="muon: Muon for the blocks' weight matrices and AdamW (--lr) for the rest; or adamw for all",
        shown="muon, or adamw under --fsdp",
    )
    muon_lr: float = knob(
        0.03,
        check=GREATER_THAN_ZERO,
        flag="--muon-lr",
        help="Muon's peak learning rate (--optimizer muon)",
    )
    muon_momentum: float = knob(
        0.95, check=FRACTION, flag="--muon-momentum", help="Muon's (Nesterov) momentum (--optimizer muon)"
    )
    # 4, where torch's default is 5: cheaper steps and the same loss (gptcli/optim.py). Runs
    # saved before this key existed iterated 5 times and resume so (SAVED_BEFORE).
    muon_ns_steps: int = knob(4, check=Range(1, 99))  # Newton-Schulz iterations per Muon step
    # Muon's own warmup steps: none, it starts at its peak while AdamW warms up (gptcli/optim.py,
    # rates_at). None: Muon's rate follows AdamW's warmup, as runs saved before this key
    # existed trained and resume (SAVED_BEFORE).
    muon_warmup_iters: int | None = knob(0, check=NON_NEGATIVE)
    schedule: str = knob(
        "cosine",
        choices=SCHEDULES,
        flag="--schedule",
        help="After warmup: cosine decay, or wsd: constant, then a linear decay over the last "
        "--decay-fraction of the run",
    )
    decay_fraction: float = knob(
        0.2,
        check=Range(0, 1, lo_open=True),
        flag="--decay-fraction",
        help="The share of the run a wsd schedule spends decaying (--schedule wsd)",
    )
    grad_clip: float = knob(1.0, check=NON_NEGATIVE, flag="--grad-clip", help="Max gradient norm, 0 = off")
    eval_interval: int = knob(
        250,
        check=POSITIVE,
        flag="--eval-interval",
        on_resume=True,
        help="Steps between evaluations and checkpoints",
    )
    eval_iters: int = knob(
        20, check=POSITIVE, flag="--eval-iters", help="Batches per evaluation", on_resume=True
    )
    log_interval: int = knob(
        10, check=POSITIVE, flag="--log-interval", help="Steps between log lines", on_resume=True
    )
    device: str = knob(
        "auto", flag="--device", help="auto | cpu | cuda | cuda:N | mps", on_resume=True, panel=HARDWARE
    )
    dtype: str = knob(
        "auto",
        choices=("auto", "fp32", "bf16", "fp16"),
        flag="--dtype",
        help="auto | fp32 | bf16 | fp16",
        panel=HARDWARE,
    )
    compile: bool = knob(
        False, flag="--compile/--no-compile", help="torch.compile the model", on_resume=True, panel=HARDWARE
    )
    fsdp: bool = knob(
        False,
        flag="--fsdp/--no-fsdp",
        on_resume=True,
        help="Under torchrun, shard weights, gradients and AdamW state (FSDP)",
        panel=HARDWARE,
    )
    dist_timeout: float = knob(
        7200.0,
        check=GREATER_THAN_ZERO,
        flag="--dist-timeout",
        given_as=str,
        on_resume=True,
        help="Under torchrun, how long a process waits for the others (e.g. while the first "
        "tokenizes the corpus), e.g. 90s, 30m, 2h",
    )
    seed: int = knob(1337, check=Range(0, SEED_MAX), flag="--seed", help="Random seed", panel=HARDWARE)
    sample_every: int = knob(
        0,
        check=NON_NEGATIVE,
        flag="--sample-every",
        on_resume=True,
        help="Show a sample every N steps while training",
        shown="off",
    )
    sample_prompt: str = knob(
        "",
        flag="--sample-prompt",
        on_resume=True,
        help="The text samples continue",
        shown="the start of a document",
    )
    sample_tokens: int = knob(
        32, check=Range(1, 4096), flag="--sample-tokens", on_resume=True, help="Tokens per sample"
    )
    trackers: list[str] = knob(
        [],
        flag="--tracker",
        on_resume=True,
        help="Send metrics to a tracker: tensorboard, mlflow or wandb; repeat for more",
        shown="none",
    )
    eval_files: list[str] = knob(
        [],
        flag="--eval-file",
        on_resume=True,
        help="Score this file as gptcli eval does at every evaluation; repeat for more",
        shown="none",
    )

    def validate(self) -> None:
        from gptcli.trackers import check_names

        check_fields(self, "train")
        check_names(self.trackers)
        for key in ("lr", "min_lr", "muon_lr", "weight_decay", "grad_clip"):  # the optimizers hold float32
            if getattr(self, key) > FLOAT32_MAX:
                raise UsageError(
                    f"{key_name('train', key)} must be at most {FLOAT32_MAX:.3g}, got {getattr(self, key):g}"
                )
        if self.min_lr > self.lr:
            raise UsageError(
                f"{key_name('train', 'min_lr')} = {self.min_lr} must not exceed "
                f"{key_name('train', 'lr')} = {self.lr}"
            )
        if self.optimizer is None:
            self.optimizer = "adamw" if self.fsdp else "muon"
        if self.fsdp and self.optimizer == "muon":
            raise UsageError(
                "--optimizer muon does not run under --fsdp: Muon orthogonalizes each whole weight "
                "matrix, which FSDP splits across the processes; drop --fsdp (DDP) or use --optimizer adamw"
            )
        if self.device.split(":")[0] not in ("auto", "cpu", "cuda", "mps"):
            raise UsageError(
                f"{key_name('train', 'device')} must be auto, cpu, cuda, cuda:N or mps, "
                f"got {quote(self.device)}"
            )

    def unused(self, given: Iterable[str]) -> list[str]:
        """A warning for each flag given that this run's other settings leave unused (such as
        --muon-lr in an AdamW run)."""
        flag = {f.name: f.metadata.get("flag") for f in fields(self)}
        return [
            f"{flag[key]} is not used: it goes with {flag[other]} {wanted}, and this run has "
            f"{flag[other]} {getattr(self, other)}"
            for key, (other, wanted) in USED_WITH.items()
            if key in given and getattr(self, other) != wanted
        ]


# settings that only one value of another setting uses: {key: (other key, its value)}
USED_WITH = {
    "muon_lr": ("optimizer", "muon"),
    "muon_momentum": ("optimizer", "muon"),
    "decay_fraction": ("schedule", "wsd"),
}


# finetuning starts from a trained model: smaller steps, shorter runs, than pretraining
FINETUNE_DEFAULTS = TrainConfig(
    batch_size=16,
    lr=1e-4,
    min_lr=1e-5,
    warmup_iters=20,
    max_iters=300,
    eval_interval=50,
    weight_decay=0.01,
    optimizer="adamw",
)
# what a key missing from a saved run's config meant when the run was saved: runs made before
# --optimizer existed trained with AdamW, and Muon runs made before muon_ns_steps and
# muon_warmup_iters existed iterated torch's 5 times and warmed Muon's rate up with AdamW's
# (checkpoint.json keeps every key from then on)
SAVED_BEFORE = TrainConfig(optimizer="adamw", muon_ns_steps=5, muon_warmup_iters=None)
FINETUNE_TASKS = ("lm", "classify", "choice", "sft", "chat")
TEXT_TASKS = ("lm", "sft", "chat")  # runs whose model writes text; classify and choice runs score options
LORA_TARGETS = ("attn", "proj", "mlp")  # attn.c_attn; attn.c_proj; mlp.c_fc and mlp.c_proj (gptcli/lora.py)


@dataclass
class FinetuneSettings:
    """What a finetuning run learns, from what: saved with the run, fixed on --resume."""

    data: list[str]  # lm: text files/dirs or a tokenized dir; otherwise one JSONL (or CSV) file
    base: str  # the checkpoint it starts from (--ckpt)
    task: str = knob("lm", flag="--task", help="lm | classify | choice | sft | chat", panel=TASK)
    val_data: str | None = knob(
        None,
        flag="--val-data",
        help="Validation records",
        shown="hold out --val-fraction",
        panel=TASK,
        given_as=Path,
    )
    val_fraction: float = knob(
        0.1, check=OPEN_FRACTION, flag="--val-fraction", help="Share held out for validation", panel=TASK
    )
    aux_lm_weight: float = knob(
        0.5,
        check=NON_NEGATIVE,
        flag="--aux-lm-weight",
        help="lambda in L2 + lambda * L1, the auxiliary LM loss",
        panel=TASK,
    )
    delimiter: str = knob(
        "\n",
        flag="--delimiter",
        help="Text between a pair's parts, or context and choice",
        shown="newline",
        panel=TASK,
    )
    both_orders: bool = knob(
        False,
        flag="--both-orders",
        help="Pairs: score both orders and add them (GPT-1's similarity)",
        panel=TASK,
    )
    # LoRA (gptcli/lora.py): rank > 0 trains low-rank adapters (and a task's head) beside
    # the frozen base, whose checkpoint a LoRA run refers to rather than copies
    lora_rank: int = knob(
        0,
        check=Range(0, 2**16),
        flag="--lora-rank",
        help="Train LoRA adapters of this rank; the base stays frozen",
        shown="off",
        panel=LORA,
    )
    lora_alpha: float | None = knob(
        None,
        check=GREATER_THAN_ZERO,
        flag="--lora-alpha",
        help="The adapters' update is scaled by alpha / rank",
        shown="2 x rank",
        panel=LORA,
    )
    lora_dropout: float = knob(
        0.0, check=FRACTION, flag="--lora-dropout", help="Dropout on the adapters' input", panel=LORA
    )
    lora_targets: list[str] = knob(
        list(LORA_TARGETS),
        flag="--lora-targets",
        help="Which Linears get adapters: attn,proj,mlp or a subset",
        shown="all",
        panel=LORA,
        given_as=str,
    )

    def validate(self) -> FinetuneSettings:
        check_fields(self)
        if self.lora_rank:
            unknown = [t for t in self.lora_targets if t not in LORA_TARGETS]
            if unknown or not self.lora_targets:
                raise UsageError(
                    f"--lora-targets {','.join(self.lora_targets) or '(none)'}: use a comma-separated "
                    f"list of {', '.join(LORA_TARGETS)}"
                )
            self.lora_targets = [t for t in LORA_TARGETS if t in self.lora_targets]  # once each, in order
            if self.lora_alpha is None:
                self.lora_alpha = 2.0 * self.lora_rank
        elif self.lora_alpha is not None or self.lora_dropout or self.lora_targets != list(LORA_TARGETS):
            raise UsageError("--lora-alpha, --lora-dropout and --lora-targets go with --lora-rank R")
        if self.task not in FINETUNE_TASKS:
            raise UsageError(f"--task {quote(self.task)}: use one of {', '.join(FINETUNE_TASKS)}")
        if not self.data:
            again = command_line("finetune", "--ckpt", self.base, "DATA", "--task", self.task)
            raise UsageError(f"give the data to finetune on: {again}")
        if self.task != "lm" and len(self.data) != 1:
            raise UsageError(f"--task {self.task} takes one data file (and --val-data for validation)")
        return self


@dataclass
class Config:
    """Everything a training run needs, as saved to <run>/config.yaml."""

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> Config:
        self.model.validate()
        self.data.validate()
        self.train.validate()
        return self

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_yaml(self) -> str:
        import yaml  # here, not at the top: `gptcli --help` never needs it

        return yaml.safe_dump(self.to_dict(), sort_keys=False)


SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}

# what --resume may change: budgets, reporting and hardware, nothing that alters the maths
CONFIG_CHANGES_ON_RESUME = tuple(
    f.name for cls in SECTIONS.values() for f in fields(cls) if f.metadata.get("on_resume")
)


def parse_duration(value: str | float | int) -> float:
    """Seconds from 90, '90', '90s', '15m', '1.5h'."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower()
    scale = {"s": 1, "m": 60, "h": 3600}.get(text[-1:])
    number = text[:-1] if scale else text
    try:
        return float(number) * (scale or 1)
    except ValueError:
        raise UsageError(f"bad duration {quote(value)}; use seconds or e.g. 90s, 15m, 1.5h") from None


_ACCEPTS = {
    bool: lambda v: isinstance(v, bool),
    int: lambda v: isinstance(v, int) and not isinstance(v, bool),
    float: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    str: lambda v: isinstance(v, str),
}


def _type_name(tp: Any) -> str:
    return {int: "an integer", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))


def _coerce(where: str, value: Any, tp: Any) -> Any:
    """Check value against a dataclass field type (int, float, bool, str, or Optional of one)."""
    args = typing.get_args(tp)
    if typing.get_origin(tp) is list:
        if not isinstance(value, list):
            value = [value] if isinstance(value, str) else value
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UsageError(f"{where} must be a list of strings, got {quote(value)}")
        return list(value)
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
    if where.endswith(("max_time", "dist_timeout")) and isinstance(value, str):
        return parse_duration(value)
    if where.endswith("tokenizer") and isinstance(value, str):
        return value.strip().lower()
    if _ACCEPTS[tp](value):
        return float(value) if tp is float else value
    raise UsageError(f"{where} must be {_type_name(tp)}, got {quote(value)}")


def _apply(section: Any, name: str, values: dict[str, Any], source: str) -> None:
    known = {f.name: f for f in fields(section)}
    hints = typing.get_type_hints(type(section))
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(known)}"
            raise UsageError(f"unknown key {quote(f'{name}.{key}')} in {source}{hint}")
        setattr(section, key, _coerce(f"{name}.{key}", value, hints[key]))


def _top_level_hint(name: str) -> str:
    """What a key misplaced at the top level of a YAML file was probably meant to be: a
    section, or the closest section.key."""
    close = difflib.get_close_matches(name, list(SECTIONS), n=1, cutoff=0.75)
    if close:
        return f"; did you mean the section '{close[0]}:'?"
    keys = {f.name: f"{sec}.{f.name}" for sec, cls in SECTIONS.items() for f in fields(cls)}
    close = difflib.get_close_matches(name, list(keys), n=1)
    if close:
        section, key = keys[close[0]].split(".")
        return f"; did you mean '{keys[close[0]]}' (written as '{key}:' under '{section}:')?"
    return f" (the sections are {', '.join(SECTIONS)})"


def merge(config: Config, values: dict[str, Any], source: str) -> Config:
    """Apply a nested dict {section: {key: value}} onto config, checking names and types."""
    if not isinstance(values, dict):
        raise UsageError(f"{source} must be a mapping of sections ({', '.join(SECTIONS)})")
    for name, section_values in values.items():
        if name not in SECTIONS:
            hint = _top_level_hint(str(name))
            raise UsageError(f"unknown key {quote(str(name))} at the top of {source}{hint}")
        if section_values is None:
            continue
        if not isinstance(section_values, dict):
            raise UsageError(f"section '{name}' in {source} must be a mapping of keys to values")
        _apply(getattr(config, name), name, section_values, source)
    return config


def resume_config(saved: Config, given: list[tuple[dict[str, Any], str]]) -> Config:
    """The config a resumed run continues with: the saved one, with the values given again
    (a YAML file's, then the flags', each as {section: {key: value}} with where it came
    from). A value equal to the saved one is fine; a different one is taken only for keys
    that --resume may change (CONFIG_CHANGES_ON_RESUME), and refused, naming each key with
    both values, for the rest."""
    import copy

    config, conflicts = copy.deepcopy(saved), []
    for values, source in given:
        candidate = merge(copy.deepcopy(config), values, source)
        for section, keys in values.items():
            for key in keys or {}:
                old, new = getattr(getattr(saved, section), key), getattr(getattr(candidate, section), key)
                if old != new and key not in CONFIG_CHANGES_ON_RESUME:
                    where = "" if source == "the command line" else f" in {source}"
                    conflicts.append(
                        f"{key_name(section, key)}{where} is {quote(new)}, the run's is {quote(old)}"
                    )
        config = candidate
    if config.train.fsdp and saved.train.optimizer == "muon" and not conflicts:
        raise UsageError(
            "this run trains with Muon, which does not run under --fsdp (FSDP splits the matrices "
            "Muon orthogonalizes whole): resume it without --fsdp"
        )
    if conflicts:
        allowed = ", ".join(
            SECTIONS[s].__dataclass_fields__[k].metadata["flag"].split("/")[0]
            for s in SECTIONS
            for k in CONFIG_CHANGES_ON_RESUME
            if k in SECTIONS[s].__dataclass_fields__
        )
        raise UsageError(
            f"{'; '.join(conflicts)}: a resumed run continues exactly, so only {allowed} can change; "
            "give the run's values or drop them, or start a new run"
        )
    return config.validate()


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Config:
    """Defaults, then the YAML file at path, then overrides (flags), validated."""
    config = Config()
    if path is not None:
        merge(config, read_yaml(path), str(path))
    if overrides:
        merge(config, overrides, "the command line")
    return config.validate()


def flag_overrides(**flags: Any) -> dict[str, dict[str, Any]]:
    """Map flags given on the command line (None = not given) onto config sections."""
    owner = {f.name: name for name, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    out: dict[str, dict[str, Any]] = {}
    for key, value in flags.items():
        if value is not None:
            out.setdefault(owner[key], {})[key] = value
    return out


def key_name(section: str, name: str) -> str:
    """How an error names a setting: its YAML key, and its flag where there is one."""
    flag = SECTIONS[section].__dataclass_fields__[name].metadata.get("flag") if section in SECTIONS else None
    return f"{section}.{name}" + (f" ({flag})" if flag else "")
