"""What a --ckpt names, loaded: a gptcli run or checkpoint directory, a Hugging Face GPT-2
directory, a GGUF file (gguf.py), or a hub name (gpt2, gpt2-medium, ...) from the local
Hugging Face cache.

The one place that knows all three: checkpoint.py reads gptcli's own format and hf.py
Hugging Face's, and neither knows the other. A LoRA run's checkpoint holds only adapters
(gptcli/lora.py) and names its base, by path and content hash: it is loaded on top of
that base, checked to be the very one it was trained on.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from gptcli.data.inputs import refuse_if_not_a_file
from gptcli.data.tokenizer import TOKENIZER_FILE, gpt2_tokenizer, load_tokenizer
from gptcli.errors import UsageError
from gptcli.store import hf
from gptcli.store.checkpoint import (
    META_FILE,
    MODEL_FILE,
    Loaded,
    is_checkpoint_dir,
    load_checkpoint,
    model_config,
    read_meta,
    resolve_checkpoint,
)
from gptcli.store.gguf import is_gguf
from gptcli.store.hf_tokenizer import chat_from_hf
from gptcli.store.validate import check_tensors, read_tensors


def load(
    spec: str | os.PathLike,
    device: torch.device | str = "cpu",
    *,
    base: str | os.PathLike | None = None,
    merge: bool = True,
) -> Loaded:
    """The model (eval mode, on device), its tokenizer and metadata, for any --ckpt.
    For a LoRA checkpoint: base, where its base checkpoint is now, if it moved; merge,
    whether the adapters are folded into the weights (for inference) or kept apart (to
    train on)."""
    kind, path = _locate(spec)
    if kind == "gguf":
        return _load_gguf(path, device)
    if kind == "hf":
        return _load_hf(path, device)
    meta = read_meta(path)
    if meta.get("lora_rank"):
        return _load_lora(path, meta, device, base, merge)
    return load_checkpoint(path, device)


def base_unused(loaded: Loaded, base: str | os.PathLike | None) -> str | None:
    """What to warn of when --base was given for a checkpoint that is not a LoRA run (it has
    no base to find), else None."""
    if base is None or loaded.meta.get("lora_rank"):
        return None
    return f"--base is not used: {loaded.path} is not a LoRA run (its weights are whole)"


def meta_of(spec: str | os.PathLike) -> dict[str, Any]:
    """What load(spec) would read of a checkpoint's kind (checkpoint.json: its task, ...;
    {} for a Hugging Face directory or a GGUF file, language models), and its errors for a
    --ckpt that is not there or not a model, without reading the weights."""
    kind, path = _locate(spec)
    return read_meta(path) if kind == "checkpoint" else {}


def _locate(spec: str | os.PathLike) -> tuple[str, Path]:
    """(gguf, the file), (hf, the directory) or (checkpoint, its directory) for a --ckpt."""
    path = Path(spec)
    if path.is_file() and (path.suffix.lower() == ".gguf" or is_gguf(path)):  # --to gguf names it anyhow
        return "gguf", path
    if not path.exists():
        if str(spec) not in hf.HUB_MODELS:
            raise UsageError(
                f"--ckpt {path}: no such file or directory (nor a Hugging Face hub name: gpt2, ...)"
            )
        path = hf.resolve_hub_name(str(spec))
    if path.is_dir() and not is_checkpoint_dir(path) and hf.is_hf_dir(path):
        return "hf", path
    try:
        return "checkpoint", resolve_checkpoint(path)
    except UsageError:
        hf.refuse_config_alone(path)  # (the clearer error, where it applies)
        raise


def weights_file(loaded: Loaded) -> Path:
    """The file that holds a loaded model's weights (a LoRA checkpoint's: its adapters; a
    GGUF model's: the file)."""
    if loaded.path.is_file():
        return loaded.path
    if is_checkpoint_dir(loaded.path):
        return loaded.path / MODEL_FILE
    return next(loaded.path / f for f in hf.WEIGHT_FILES if (loaded.path / f).is_file())


def weights_sha256(loaded: Loaded) -> str:
    """The content hash by which a LoRA run knows its base."""
    digest = hashlib.sha256()
    with open(weights_file(loaded), "rb") as f:
        while block := f.read(1 << 24):
            digest.update(block)
    return digest.hexdigest()


def _load_lora(
    ckpt: Path, meta: dict[str, Any], device: torch.device | str, base: str | os.PathLike | None, merge: bool
) -> Loaded:
    """A LoRA checkpoint on top of its base: the base loaded (and checked by hash), shaped
    as the run trained it (context, head, dropout), the adapters put on and loaded."""
    from gptcli import lora

    where = Path(base) if base is not None else Path(meta.get("base_checkpoint", ""))
    if not meta.get("base_checkpoint") or not meta.get("base_sha256"):
        raise UsageError(f"{ckpt / META_FILE} does not name the base of its LoRA adapters; it is damaged")
    run = ckpt.parent
    if not where.exists() and base is not None:
        raise UsageError(f"--base {where}: no such file or directory; give where the base of {run} is now")
    if not where.exists():
        raise UsageError(
            f"{run} holds LoRA adapters for the base checkpoint {where}, which is not there; "
            "if it moved, say where it is now with --base PATH"
        )
    loaded_base = load(where)
    found = weights_sha256(loaded_base)
    if found != meta["base_sha256"]:
        raise UsageError(
            f"{loaded_base.path} is not the base {run} was trained on (its weights' sha256 is "
            f"{found[:12]}, the run's base's {meta['base_sha256'][:12]}): it changed since; give the "
            "original with --base PATH"
        )
    config = model_config(ckpt, meta)
    model = loaded_base.model
    added = _added_tokens(ckpt, meta, model.config.vocab_size)
    tokenizer = load_tokenizer(ckpt / TOKENIZER_FILE)
    if added:  # the tokens the run added (chat's): the base grows the rows the run learnt
        if added != list(range(loaded_base.tokenizer.vocab_size, tokenizer.vocab_size)):
            raise UsageError(
                f"{ckpt / META_FILE}: 'added_tokens' are not the ids its tokenizer adds to its base's; "
                "the checkpoint is damaged"
            )
        model.add_token_rows(added)
    mismatch = [k for k in ("vocab_size", "n_layer", "n_head", "n_embd", "bias")
                if getattr(model.config, k) != getattr(config, k)]  # fmt: skip
    if mismatch or config.block_size > model.config.block_size:
        raise UsageError(
            f"{ckpt}: its model ({', '.join(mismatch) or 'block_size'}) is not the shape of its base "
            f"{loaded_base.path}; the checkpoint is damaged"
        )
    settings = lora.LoRASettings.of(meta)
    # the rank and the head the metadata claims, against the file, before they are built
    check_tensors(ckpt / MODEL_FILE, lora.planned_shapes(model, settings, config.n_classes, len(added)))
    if config.block_size < model.config.block_size:
        model.crop_block_size(config.block_size)
    model.set_dropout(config.dropout)
    model.set_classifier(config.n_classes)  # the run's head, or none (the base may have had one)
    lora.add_adapters(model, settings)
    if added:
        lora.train_token_rows(model, added)
    model.load_state_dict(read_tensors(ckpt / MODEL_FILE, lora.adapter_shapes(model)), strict=False)
    if merge:
        lora.merge(model)
    model.to(device).eval()
    return Loaded(ckpt, model, tokenizer, meta)


def lora_checkpoint(spec: str | os.PathLike) -> tuple[Path, dict[str, Any]]:
    """The checkpoint directory and metadata of a LoRA run, read without its base;
    a one-line error for anything else --ckpt may name."""
    path = Path(spec)
    if not path.exists() and str(spec) not in hf.HUB_MODELS:
        raise UsageError(f"--ckpt {path}: no such file or directory")
    if not path.is_dir() or (not is_checkpoint_dir(path) and hf.is_hf_dir(path)):
        raise UsageError(f"{path} is not a LoRA run (finetune --lora-rank makes one)")
    ckpt = resolve_checkpoint(path)
    meta = read_meta(ckpt)
    if not meta.get("lora_rank"):
        raise UsageError(f"{ckpt} is not a LoRA run (finetune --lora-rank makes one)")
    return ckpt, meta


def read_adapters(ckpt: Path, meta: dict[str, Any]) -> dict[str, torch.Tensor]:
    """What a LoRA checkpoint saved (its adapters, and any head or new token rows), checked
    against the shapes its metadata implies, without its base: writing the adapters out
    (PEFT's format) needs nothing else."""
    from gptcli import lora
    from gptcli.model import GPT

    config = model_config(ckpt, meta)
    with torch.device("meta"):  # the layers' names and shapes, no memory
        plain = GPT(config)
    added = _added_tokens(ckpt, meta, config.vocab_size)
    shapes = lora.planned_shapes(plain, lora.LoRASettings.of(meta), config.n_classes, len(added))
    check_tensors(ckpt / MODEL_FILE, shapes)
    return read_tensors(ckpt / MODEL_FILE, shapes)


def _added_tokens(ckpt: Path, meta: dict[str, Any], base_vocab: int) -> list[int]:
    """The ids a LoRA run added to its base's vocabulary ([first, count] in its metadata),
    checked to be a few rows at most one past the base's end."""
    value = meta.get("added_tokens")
    if value is None:
        return []
    ok = (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 0 < value[1] <= 64
        and 0 < value[0] <= base_vocab
    )
    if not ok:
        raise UsageError(
            f"{ckpt / META_FILE}: 'added_tokens' is {value!r}, not [first id, count]; it is damaged"
        )
    return list(range(value[0], value[0] + value[1]))


def _load_gguf(path: Path, device: torch.device | str) -> Loaded:
    from gptcli.store.gguf import load_gguf

    model, tokenizer, meta = load_gguf(path, device)
    return Loaded(path, model, tokenizer, meta)


def _load_hf(path: Path, device: torch.device | str) -> Loaded:
    model, meta = hf.load_hf(path, device)
    # a model exported by gptcli with its own tokenizer keeps it beside the weights
    own = path / hf.GPTCLI_TOKENIZER
    refuse_if_not_a_file(own, "the export is damaged")  # (not passed over: GPT-2's would stand in for it)
    # else GPT-2's, with the chat tokens when the directory's template is ChatML
    tokenizer = load_tokenizer(own) if own.is_file() else chat_from_hf(path, gpt2_tokenizer())
    if not own.is_file() and tokenizer.vocab_size > model.config.vocab_size:
        tokenizer = gpt2_tokenizer()  # the tokens are declared, but the embedding has no rows for them
    if tokenizer.vocab_size > model.config.vocab_size:
        raise UsageError(
            f"{path}: the model has {model.config.vocab_size} token embeddings, fewer than the "
            f"{tokenizer.vocab_size} tokens of its tokenizer ({tokenizer.name})"
        )
    return Loaded(path, model, tokenizer, meta)
