"""What a --ckpt names, loaded: a gptcli run or checkpoint directory, a Hugging Face GPT-2
directory, or a hub name (gpt2, gpt2-medium, ...) from the local Hugging Face cache.

The one place that knows all three: checkpoint.py reads gptcli's own format and hf.py
Hugging Face's, and neither knows the other.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from gptcli import hf
from gptcli.checkpoint import Loaded, is_checkpoint_dir, load_checkpoint
from gptcli.errors import UsageError
from gptcli.tokenizer import gpt2_tokenizer, load_tokenizer


def load(spec: str | os.PathLike, device: torch.device | str = "cpu") -> Loaded:
    """The model (eval mode, on device), its tokenizer and metadata, for any --ckpt."""
    path = Path(spec)
    if not path.exists():
        if str(spec) not in hf.HUB_MODELS:
            raise UsageError(
                f"--ckpt {path}: no such file or directory (nor a Hugging Face hub name: gpt2, ...)"
            )
        path = hf.resolve_hub_name(str(spec))
    if path.is_dir() and not is_checkpoint_dir(path) and hf.is_hf_dir(path):
        return _load_hf(path, device)
    return load_checkpoint(path, device)


def _load_hf(path: Path, device: torch.device | str) -> Loaded:
    model, meta = hf.load_hf(path, device)
    # a model exported by gptcli with its own tokenizer keeps it beside the weights
    own = path / hf.GPTCLI_TOKENIZER
    tokenizer = load_tokenizer(own) if own.is_file() else gpt2_tokenizer()
    if tokenizer.vocab_size > model.config.vocab_size:
        raise UsageError(
            f"{path}: the model has {model.config.vocab_size} token embeddings, fewer than the "
            f"{tokenizer.vocab_size} tokens of its tokenizer ({tokenizer.name})"
        )
    return Loaded(path, model, tokenizer, meta)
