"""Typed configuration: the knobs of a run as dataclasses, YAML in and out, clear validation.

A run's config has three sections, each a dataclass: `model` (ModelConfig), `data`
(DataConfig) and `train` (TrainConfig). Values come from the defaults, then a YAML file,
then command-line flags, each overriding the one before. YAML is read with safe_load only:
a config is data, never code.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from gptcli.errors import UsageError

# config keys that have a command-line flag of the same name (--block-size for block_size)
_FLAGGED = {
    "model": {"block_size", "n_layer", "n_head", "n_embd", "dropout"},
    "train": {
        "batch_size", "grad_accum", "lr", "min_lr", "warmup_iters", "max_iters", "max_time",
        "weight_decay", "grad_clip", "eval_interval", "eval_iters", "log_interval", "device",
        "dtype", "seed",
    },
}  # fmt: skip


SEED_MAX = 2**63 - 1  # torch.manual_seed takes up to this


def key_name(section: str, name: str) -> str:
    """How an error names a setting: its YAML key, and its flag where there is one."""
    flag = f" (--{name.replace('_', '-')})" if name in _FLAGGED.get(section, ()) else ""
    return f"{section}.{name}{flag}"


@dataclass
class ModelConfig:
    """Shape of a GPT-2 style model (GPT-2 124M: 12 layers, 12 heads, 768 dims, block 1024).

    vocab_size is taken from the tokenizer when left unset; a larger value pads the
    embedding (e.g. 50304 for GPU-friendly shapes) and the extra ids are never sampled."""

    vocab_size: int | None = None
    block_size: int = 256
    n_layer: int = 6
    n_head: int = 6
    n_embd: int = 384
    dropout: float = 0.0
    bias: bool = True
    n_classes: int = 0  # > 0: a classification head on the last token (set by finetune)

    def validate(self) -> None:
        if self.n_classes < 0:
            raise UsageError(f"{key_name('model', 'n_classes')} must be >= 0, got {self.n_classes}")
        for name in ("block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"{key_name('model', name)} must be a positive integer, got {getattr(self, name)}"
                )
        if self.vocab_size is not None and self.vocab_size < 1:
            raise UsageError(
                f"{key_name('model', 'vocab_size')} must be a positive integer, got {self.vocab_size}"
            )
        if self.n_embd % self.n_head:
            raise UsageError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head}); "
                f"try n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"{key_name('model', 'dropout')} must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass
class DataConfig:
    """How raw text becomes tokens (ignored for a directory made by `gptcli tokenize`)."""

    tokenizer: str = "char"
    val_fraction: float = 0.1

    def validate(self) -> None:
        from gptcli.tokenizer import parse_spec

        parse_spec(self.tokenizer)
        if not 0.0 < self.val_fraction < 1.0:
            raise UsageError(f"{key_name('data', 'val_fraction')} must be in (0, 1), got {self.val_fraction}")


@dataclass
class TrainConfig:
    """The optimisation loop: batches, AdamW, LR schedule, evaluation, hardware."""

    batch_size: int = 12  # sequences per micro-step (per process under torchrun)
    grad_accum: int = 1  # micro-steps per optimizer step
    lr: float = 1e-3  # peak learning rate, after warmup
    min_lr: float = 1e-4  # where the cosine decay ends
    warmup_iters: int = 100
    max_iters: int = 2000  # optimizer steps
    max_time: float | None = None  # wall-clock budget in seconds; the LR schedule fits it too
    weight_decay: float = 0.1  # on matrices and embeddings; never on biases or LayerNorm gains
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 disables
    eval_interval: int = 250  # steps between evaluations (and checkpoints)
    eval_iters: int = 20  # batches averaged per evaluation
    log_interval: int = 10  # steps between log lines / metrics records
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    dtype: str = "auto"  # auto | fp32 | bf16 | fp16
    compile: bool = False  # torch.compile the model
    fsdp: bool = False  # under torchrun: shard weights, gradients and AdamW state (FSDP), not replicate
    seed: int = 1337

    def validate(self) -> None:
        for name in ("batch_size", "grad_accum", "max_iters", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"{key_name('train', name)} must be a positive integer, got {getattr(self, name)}"
                )
        if self.warmup_iters < 0:
            raise UsageError(f"{key_name('train', 'warmup_iters')} must be >= 0, got {self.warmup_iters}")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0 or (name == "lr" and value == 0):
                raise UsageError(
                    f"{key_name('train', name)} must be {'> 0' if name == 'lr' else '>= 0'}, got {value}"
                )
        if self.min_lr > self.lr:
            raise UsageError(
                f"{key_name('train', 'min_lr')} = {self.min_lr} must not exceed "
                f"{key_name('train', 'lr')} = {self.lr}"
            )
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UsageError(f"{key_name('train', name)} must be in [0, 1), got {getattr(self, name)}")
        if not 0 <= self.seed <= SEED_MAX:
            raise UsageError(f"{key_name('train', 'seed')} must be between 0 and {SEED_MAX}, got {self.seed}")
        if self.max_time is not None and self.max_time <= 0:
            raise UsageError(f"{key_name('train', 'max_time')} must be > 0 seconds, got {self.max_time}")
        if self.dtype not in ("auto", "fp32", "bf16", "fp16"):
            raise UsageError(
                f"{key_name('train', 'dtype')} must be auto, fp32, bf16 or fp16, got {self.dtype!r}"
            )
        if self.device.split(":")[0] not in ("auto", "cpu", "cuda", "mps"):
            raise UsageError(
                f"{key_name('train', 'device')} must be auto, cpu, cuda, cuda:N or mps, got {self.device!r}"
            )


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
        return yaml.safe_dump(self.to_dict(), sort_keys=False)


SECTIONS: dict[str, type] = {"model": ModelConfig, "data": DataConfig, "train": TrainConfig}

# what --resume may change: budgets, reporting and hardware, nothing that alters the maths
CONFIG_CHANGES_ON_RESUME = (
    "max_iters", "max_time", "eval_interval", "eval_iters", "log_interval", "device", "dtype", "compile",
    "fsdp",
)  # fmt: skip


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
        raise UsageError(f"bad duration {value!r}; use seconds or e.g. 90s, 15m, 1.5h") from None


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
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        if value is None and type(None) in args:
            return None
        (tp,) = [a for a in args if a is not type(None)]
    if where.endswith("max_time") and isinstance(value, str):
        return parse_duration(value)
    if _ACCEPTS[tp](value):
        return float(value) if tp is float else value
    raise UsageError(f"{where} must be {_type_name(tp)}, got {value!r}")


def _apply(section: Any, name: str, values: dict[str, Any], source: str) -> None:
    known = {f.name: f for f in fields(section)}
    hints = typing.get_type_hints(type(section))
    for key, value in values.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else f"; valid keys: {', '.join(known)}"
            raise UsageError(f"unknown key '{name}.{key}' in {source}{hint}")
        setattr(section, key, _coerce(f"{name}.{key}", value, hints[key]))


def merge(config: Config, values: dict[str, Any], source: str) -> Config:
    """Apply a nested dict {section: {key: value}} onto config, checking names and types."""
    if not isinstance(values, dict):
        raise UsageError(f"{source} must be a mapping of sections ({', '.join(SECTIONS)})")
    for name, section_values in values.items():
        if name not in SECTIONS:
            close = difflib.get_close_matches(str(name), list(SECTIONS), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise UsageError(f"unknown section '{name}' in {source}{hint} (sections: {', '.join(SECTIONS)})")
        if section_values is None:
            continue
        if not isinstance(section_values, dict):
            raise UsageError(f"section '{name}' in {source} must be a mapping of keys to values")
        _apply(getattr(config, name), name, section_values, source)
    return config


def read_yaml(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"config file {path} does not exist")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from e
    return data or {}


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
