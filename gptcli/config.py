"""Typed configuration: the knobs of the model, with validation that explains itself."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from gptcli.errors import UsageError


@dataclass
class ModelConfig:
    """Shape of a GPT-2 style model (GPT-2 124M: 12 layers, 12 heads, 768 dims, block 1024)."""

    vocab_size: int = 50257
    block_size: int = 1024
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    dropout: float = 0.0
    bias: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            if getattr(self, name) < 1:
                raise UsageError(f"model.{name} must be a positive integer, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise UsageError(
                f"model.n_embd ({self.n_embd}) must be divisible by model.n_head ({self.n_head}); "
                f"try n_embd={self.n_head * max(1, round(self.n_embd / self.n_head))}"
            )
        if not 0.0 <= self.dropout < 1.0:
            raise UsageError(f"model.dropout must be in [0, 1), got {self.dropout}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    def to_dict(self) -> dict:
        return asdict(self)
