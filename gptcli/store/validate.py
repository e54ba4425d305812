"""Files from elsewhere are data: what is checked before anything is built from them.

Checkpoints, Hugging Face directories and training states may come from anyone. Their JSON
is checked field by field against the types gptcli reads, and their weights against the
shapes the model config implies, from the safetensors header alone, before a model is
built or a tensor is read: a few bytes of config claiming a huge model are a one-line
error, not gigabytes allocated. Tensors are then read one by one and refused if they are
not floating point or hold NaN or inf (the message names the tensor).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from gptcli.data.inputs import refuse_if_not_a_file
from gptcli.errors import UsageError


def expected_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """The shape of every weight a GPT of this config saves, computed without allocating
    (the model is built on the meta device)."""
    from gptcli.model import GPT

    with torch.device("meta"):
        model = GPT(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items() if k != "lm_head.weight"}


def header(file: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """{name: (dtype, shape)} from a safetensors file's header, reading no tensor."""
    from safetensors import SafetensorError, safe_open

    refuse_if_not_a_file(file, "the checkpoint is damaged")
    if not file.is_file():
        raise UsageError(f"{file} is missing; the checkpoint is incomplete")
    try:
        with safe_open(file, framework="pt") as f:
            out = {}
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                part = f.get_slice(name)
                out[name] = (part.get_dtype(), tuple(part.get_shape()))
            return out
    except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{file} is corrupted ({e}); use another checkpoint (e.g. the run's last/)") from e


FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")


def check_shapes(
    found: Mapping[str, tuple[str, tuple[int, ...]]], expected: Mapping[str, tuple[int, ...]], source: str
) -> None:
    """Every expected weight present, with its shape and a floating-point dtype."""
    for name, shape in expected.items():
        if name not in found:
            raise UsageError(f"{source} lacks {name}; the checkpoint is incomplete")
        dtype, got = found[name]
        if got != shape:
            raise UsageError(
                f"{source}: {name} has shape {got} but the config needs {shape}; "
                "the weights do not match the config"
            )
        if dtype not in FLOAT_DTYPES:
            raise UsageError(f"{source}: {name} is {dtype}, not floating point; the weights are damaged")


def check_finite(name: str, tensor: torch.Tensor, source: str) -> None:
    if not torch.isfinite(tensor).all():
        raise UsageError(f"{source}: {name} holds NaN or inf; the weights are damaged, use another one")


def check_claims(found: Mapping[str, tuple[str, tuple[int, ...]]], config: Any, source: str) -> None:
    """Every size the config claims, against the tensors the file holds (found: {name:
    (dtype, shape)} in our names, from the header): the blocks counted from the names, the
    width, vocabulary, context and head from the embeddings' and head's shapes. Arithmetic
    only, so that a few bytes claiming a billion layers or dimensions are refused before a
    model of that size is laid out, even on the meta device."""
    blocks = {int(m[1]) for name in found if (m := _BLOCK.match(name))}
    if len(blocks) != config.n_layer or (blocks and max(blocks) != config.n_layer - 1):
        raise UsageError(
            f"{source} holds {len(blocks)} blocks but the config says n_layer = {config.n_layer}; "
            "the weights do not match the config"
        )
    claimed = {
        "transformer.wte.weight": (config.vocab_size, config.n_embd),
        "transformer.wpe.weight": (config.block_size, config.n_embd),
    }
    if config.n_classes:
        claimed["classifier.weight"] = (config.n_classes, config.n_embd)
    for name, shape in claimed.items():
        if name not in found:
            raise UsageError(f"{source} lacks {name}; the checkpoint is incomplete")
        if found[name][1] != shape:
            raise UsageError(
                f"{source}: {name} has shape {found[name][1]} but the config needs {shape}; "
                "the weights do not match the config"
            )


def check_against(
    found: Mapping[str, tuple[str, tuple[int, ...]]], config: Any, source: str
) -> dict[str, tuple[int, ...]]:
    """The weights a model of config needs, after checking that found ({name: (dtype,
    shape)} in our names) holds them: its sizes first (check_claims), then every shape."""
    check_claims(found, config, source)
    expected = expected_shapes(config)
    check_shapes(found, expected, source)
    return expected


_BLOCK = re.compile(r"^transformer\.h\.(\d{1,9})\.")


def read_weights(file: Path, config: Any) -> dict[str, torch.Tensor]:
    """The weights a model of config needs from a safetensors file, checked against its
    header first (see check_against), then each one for NaN and inf."""
    return _read(file, check_against(header(file), config, str(file)))


def check_tensors(file: Path, expected: Mapping[str, tuple[int, ...]]) -> None:
    """A safetensors file holds exactly the tensors named in expected ({name: shape}), with
    those shapes: checked from its header, before the tensors' places are made."""
    found = header(file)
    extra = sorted(set(found) - set(expected))
    if extra:
        raise UsageError(f"{file} holds {extra[0]}, which the model has no place for; it does not fit")
    check_shapes(found, expected, str(file))


def read_tensors(file: Path, expected: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """Exactly the tensors named in expected ({name: shape}) from a safetensors file (a LoRA
    checkpoint's adapters, say), checked against its header first, then for NaN and inf."""
    check_tensors(file, expected)
    return _read(file, expected)


def _read(file: Path, expected: Mapping[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError, safe_open

    out = {}
    try:
        with safe_open(file, framework="pt") as f:
            for name in expected:
                out[name] = f.get_tensor(name)
                check_finite(name, out[name], str(file))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise UsageError(f"{file} is corrupted ({e}); use another checkpoint (e.g. the run's last/)") from e
    return out
