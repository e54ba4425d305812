"""Hugging Face GPT-2 interoperability, without transformers.

In: a GPT-2 directory (config.json + model.safetensors, or pytorch_model.bin read with
torch.load(weights_only=True)), or a hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl,
distilgpt2) found in the local Hugging Face cache, or downloaded with huggingface_hub when
it is installed and the machine is online. Out: a directory that
transformers.GPT2LMHeadModel.from_pretrained() loads, with the tokenizer files when the
model uses GPT-2's BPE.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch

from gptcli import files
from gptcli.config import ModelConfig
from gptcli.data.inputs import check_types, read_json
from gptcli.data.tokenizer import ENDOFTEXT, GPTCLI_TOKENIZER_FILE, _gpt2_data_dir
from gptcli.errors import UsageError, reason
from gptcli.model import GPT
from gptcli.store.validate import check_against, check_finite, header

# hub names and the repositories that hold them (the short names are the old aliases)
HUB_MODELS = {
    "gpt2": ("openai-community/gpt2", "gpt2"),
    "gpt2-medium": ("openai-community/gpt2-medium", "gpt2-medium"),
    "gpt2-large": ("openai-community/gpt2-large", "gpt2-large"),
    "gpt2-xl": ("openai-community/gpt2-xl", "gpt2-xl"),
    "distilgpt2": ("distilbert/distilgpt2", "distilgpt2"),
}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# every file export may write
EXPORTED = ("config.json", "model.safetensors", "vocab.json", "merges.txt", "special_tokens_map.json",
            "tokenizer_config.json", "tokenizer.json", "gptcli_tokenizer.json",
            "generation_config.json")  # fmt: skip
GPTCLI_TOKENIZER = GPTCLI_TOKENIZER_FILE  # our tokenizer, beside Hugging Face's

# Hugging Face's GPT-2 stores these projections as Conv1D, i.e. weight (in, out): the
# transpose of nn.Linear's (out, in).
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_name(key: str) -> str:
    """Our name for a Hugging Face GPT2LMHeadModel / GPT2Model tensor."""
    return key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"


def hf_to_gptcli_state_dict(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a Hugging Face GPT2LMHeadModel / GPT2Model state dict onto our parameter names."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in hf.items():
        name = hf_name(key)
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # causal-mask buffers of old transformers versions, not weights
        if name.endswith(_CONV1D):
            tensor = tensor.t()
        out[name] = tensor.contiguous()
    out.setdefault("lm_head.weight", out["transformer.wte.weight"])
    return out


def gptcli_to_hf_state_dict(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our state dict in Hugging Face GPT2LMHeadModel's layout (tied lm_head left out)."""
    return {
        name: (t.t() if name.endswith(_CONV1D) else t).contiguous()
        for name, t in sd.items()
        if name.startswith("transformer.")
    }


# --- finding a model -----------------------------------------------------------------------


def is_hf_dir(path: Path) -> bool:
    """A GPT-2 directory in Hugging Face's layout; one whose weights are in shards is refused
    (gptcli reads one weights file)."""
    if (path / "config.json").is_file() and not any((path / f).is_file() for f in WEIGHT_FILES):
        index = next((f for f in ("model.safetensors.index.json", "pytorch_model.bin.index.json")
                      if (path / f).is_file()), None)  # fmt: skip
        if index is not None:
            raise UsageError(
                f"{path}: its weights are in shards ({index}); gptcli reads one file: save the model with "
                'save_pretrained(..., max_shard_size="10GB") and give that directory'
            )
    return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


def refuse_config_alone(path: Path) -> None:
    """A directory that is no checkpoint but holds a Hugging Face config.json: its weights
    are missing, which says more than "not a gptcli run"."""
    if path.is_dir() and (path / "config.json").is_file():
        raise UsageError(
            f"--ckpt {path} has a Hugging Face config.json but no weights beside it "
            f"({' or '.join(WEIGHT_FILES)}); copy the weights file into it"
        )


def hub_cache() -> Path:
    """The Hugging Face hub cache: HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.environ[var])
    home = (
        os.environ.get("HF_HOME")
        or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    )
    return Path(home) / "hub"


def _cached_snapshot(repo: str, cache: Path) -> Path | None:
    model_dir = cache / f"models--{repo.replace('/', '--')}"
    ref = model_dir / "refs" / "main"
    if ref.is_file():
        snap = model_dir / "snapshots" / ref.read_text().strip()
        if is_hf_dir(snap):
            return snap
    snaps = [p for p in (model_dir / "snapshots").glob("*") if is_hf_dir(p)] if model_dir.is_dir() else []
    return max(snaps, key=lambda p: p.stat().st_mtime) if snaps else None


def resolve_hub_name(name: str) -> Path:
    """A hub model's local directory: from the cache, or downloaded if possible."""
    repos = HUB_MODELS.get(name, (name,))
    cache = hub_cache()
    for repo in repos:
        found = _cached_snapshot(repo, cache)
        if found is not None:
            return found
    looked = ", ".join(str(cache / f"models--{r.replace('/', '--')}") for r in repos)
    if os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0"):
        raise UsageError(
            f"--ckpt {name}: not in the Hugging Face cache (looked in {looked}) and HF_HUB_OFFLINE is set"
        )
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UsageError(
            f"--ckpt {name}: not in the Hugging Face cache (looked in {looked}); "
            "pip install huggingface_hub to download it, or pass a local GPT-2 directory"
        ) from None
    try:
        path = snapshot_download(
            repos[0],
            allow_patterns=["config.json", "model.safetensors", "*.json", "merges.txt"],
            cache_dir=cache,
        )
    except Exception as e:  # network, auth, missing repo: all mean "not available here"
        raise UsageError(
            f"--ckpt {name}: not in the Hugging Face cache (looked in {looked}) and the download failed "
            f"({reason(e)}); connect to the internet or pass a local GPT-2 directory"
        ) from None
    return Path(path)


# --- loading -------------------------------------------------------------------------------


# the types of the GPT2Config fields gptcli reads
_CONFIG_SCHEMA: dict[str, tuple[type, ...]] = {
    "model_type": (str,), "activation_function": (str,), "layer_norm_epsilon": (float,),
    "n_inner": (int, type(None)), "scale_attn_weights": (bool,), "scale_attn_by_inverse_layer_idx": (bool,),
    "reorder_and_upcast_attn": (bool,), "tie_word_embeddings": (bool,), "vocab_size": (int,),
    "n_positions": (int,), "n_ctx": (int,), "n_layer": (int,), "n_head": (int,), "n_embd": (int,),
}  # fmt: skip


def config_from_hf(cfg: dict[str, Any], source: str) -> ModelConfig:
    """Our ModelConfig for a Hugging Face GPT2Config, refusing variants we do not compute."""
    if not isinstance(cfg, dict):
        raise UsageError(f"{source}: config.json is not a JSON object")
    if cfg.get("model_type") != "gpt2":
        raise UsageError(
            f"{source}: model_type is {cfg.get('model_type')!r}; only GPT-2 models can be loaded"
        )
    check_types(cfg, _CONFIG_SCHEMA, f"{source}/config.json")
    checks = {
        "activation_function": (
            cfg.get("activation_function", "gelu_new") in ("gelu_new", "gelu_pytorch_tanh")
        ),
        "layer_norm_epsilon": abs(cfg.get("layer_norm_epsilon", 1e-5) - 1e-5) < 1e-12,
        "n_inner": cfg.get("n_inner") in (None, 4 * cfg.get("n_embd", 768)),
        "scale_attn_weights": cfg.get("scale_attn_weights", True),
        "scale_attn_by_inverse_layer_idx": not cfg.get("scale_attn_by_inverse_layer_idx", False),
        "reorder_and_upcast_attn": not cfg.get("reorder_and_upcast_attn", False),
        "tie_word_embeddings": cfg.get("tie_word_embeddings", True),  # one matrix embeds and unembeds
    }
    bad = [k for k, ok in checks.items() if not ok]
    if bad:
        raise UsageError(
            f"{source}: unsupported GPT-2 variant ({', '.join(f'{k}={cfg.get(k)!r}' for k in bad)})"
        )
    missing = [k for k in ("vocab_size", "n_layer", "n_head", "n_embd") if k not in cfg]
    if missing:
        raise UsageError(f"{source}: incomplete GPT-2 config (no {', '.join(missing)} in config.json)")
    config = ModelConfig(
        vocab_size=cfg["vocab_size"],
        block_size=cfg.get("n_positions", cfg.get("n_ctx", 1024)),
        n_layer=cfg["n_layer"],
        n_head=cfg["n_head"],
        n_embd=cfg["n_embd"],
        dropout=0.0,
        bias=True,
    )
    config.validate()
    return config


def read_hf_weights(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """The weights of a Hugging Face directory in our layout, checked against the shapes
    the config implies before they are read: safetensors by its header; a .bin through
    torch.load(weights_only=True) memory-mapped, so its tensors are not read until checked."""
    st = path / "model.safetensors"
    if st.is_file():
        on_disk = header(st)
        found = {hf_name(k): (dtype, _hf_shape(k, shape)) for k, (dtype, shape) in on_disk.items()}
        expected = check_against(found, config, str(st))
        names = {hf_name(k): k for k in on_disk}
        raw = read_weights_named(st, {names[k]: k for k in expected})
    else:
        raw = _read_bin(path / "pytorch_model.bin")
        found = {hf_name(k): (_dtype_name(t), _hf_shape(k, tuple(t.shape))) for k, t in raw.items()}
        expected = check_against(found, config, str(path / "pytorch_model.bin"))
        raw = {k: t for k, t in raw.items() if hf_name(k) in expected}
    state = hf_to_gptcli_state_dict(raw)
    for name in expected:
        check_finite(name, state[name], str(path))
    return state


def _dtype_name(t: torch.Tensor) -> str:
    return {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}.get(
        t.dtype, str(t.dtype)
    )


def _hf_shape(key: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A Hugging Face tensor's shape in our layout (Conv1D weights are transposed)."""
    return tuple(reversed(shape)) if hf_name(key).endswith(_CONV1D) else shape


def read_weights_named(file: Path, names: dict[str, str]) -> dict[str, torch.Tensor]:
    """Tensors of a safetensors file, {their name in the file: our name}, read one by one."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(file, framework="pt") as f:
            return {k: f.get_tensor(k) for k in names}
    except (SafetensorError, OSError, ValueError) as e:
        raise UsageError(f"{file}: the weights cannot be read ({e})") from None


def _read_bin(file: Path) -> dict[str, torch.Tensor]:
    try:
        try:  # memory-mapped: shapes first, bytes only when used
            raw = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as e:
            if "mmap" not in str(e) and "zip" not in str(e):
                raise
            raw = torch.load(file, map_location="cpu", weights_only=True)  # the legacy format
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln]
        culprit = lines[0] if lines else "objects that are not tensors"
        raise UsageError(
            f"{file}: refused, it is not plain tensors ({culprit}); "
            "loading it could run code. Use a model.safetensors file"
        ) from None
    except Exception as e:  # a foreign file: corrupt or truncated
        raise UsageError(f"{file}: the weights cannot be read ({reason(e)})") from None
    if not isinstance(raw, dict) or not all(isinstance(t, torch.Tensor) for t in raw.values()):
        raise UsageError(f"{file}: not a dictionary of tensors")
    return raw


def load_hf(path: Path, device: torch.device | str = "cpu") -> tuple[GPT, dict[str, Any]]:
    """A GPT with the weights of a Hugging Face GPT-2 directory, and metadata about it."""
    cfg = read_json(path / "config.json", "it is not a Hugging Face GPT-2 config")
    config = config_from_hf(cfg, str(path))
    state = read_hf_weights(path, config)
    model = GPT.from_weights(config, {k: v for k, v in state.items() if k != "lm_head.weight"})
    model.to(device).eval()
    meta = {"task": "lm", "source": "huggingface", "hf_path": str(path), "model": vars(config)}
    return model, meta


# --- exporting -----------------------------------------------------------------------------


PEFT_FILES = ("adapter_config.json", "adapter_model.safetensors")


def export_peft(saved: dict[str, torch.Tensor], settings: Any, base_name: str, out: Path) -> list[str]:
    """Write a LoRA run's adapters (saved: what its checkpoint holds, settings a
    lora.LoRASettings) in PEFT's format, for peft.PeftModel.from_pretrained(GPT2LMHeadModel
    of the base, out). Returns the files written."""
    from gptcli import lora

    out.mkdir(parents=True, exist_ok=True)
    files.clean_stale(out, PEFT_FILES)
    files.save_tensors(lora.peft_tensors(saved), out / PEFT_FILES[1], metadata={"format": "pt"})
    files.write_file(out / PEFT_FILES[0], json.dumps(lora.peft_config(settings, base_name), indent=2))
    return list(PEFT_FILES)


def export_hf(model: GPT, tokenizer: Any, out: Path) -> list[str]:
    """Write out/ so that transformers.GPT2LMHeadModel.from_pretrained(out) gives the same
    logits. Returns the files written."""
    from gptcli.store.hf_tokenizer import chat_template, hf_tokenizer_files, special_tokens_map

    c = model.config
    if not c.bias:
        raise UsageError(
            "this model has no biases (--no-bias); GPT-2's format needs them, so it cannot be exported"
        )
    eot = tokenizer.eot_id if tokenizer.eot_id is not None else 0
    # a chat model's reply ends at <|im_end|>: generate() stops at any of these
    ends = list(reversed(tokenizer.end_ids)) if tokenizer.has_chat else eot
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
        "n_ctx": c.block_size,  # as Hugging Face's own GPT-2 configs have it (llama.cpp's converter reads it)
        "n_embd": c.n_embd,
        "n_layer": c.n_layer,
        "n_head": c.n_head,
        "n_inner": None,
        "activation_function": "gelu_new",
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.dropout,
        "layer_norm_epsilon": 1e-5,
        "initializer_range": 0.02,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": eot,
        "eos_token_id": ends,
        "torch_dtype": "float32",
    }
    # a new export is written beside out and moved into place whole (a killed one leaves a
    # temporary directory, removed the next time, never half an export); --force over an
    # earlier one writes its files in place, each atomically, and removes those it does not write
    fresh = not (out.is_dir() and any(out.iterdir()))
    with files.new_dir(out) if fresh else contextlib.nullcontext(out) as dest:
        if not fresh:
            files.clean_stale(out, EXPORTED)
        state = gptcli_to_hf_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
        files.save_tensors(state, dest / "model.safetensors", metadata={"format": "pt"})
        contents: dict[str, str | bytes] = {"config.json": json.dumps(config, indent=2)}
        if tokenizer.has_chat:
            generation = {"bos_token_id": eot, "eos_token_id": ends}
            contents["generation_config.json"] = json.dumps(generation, indent=2)
        # Hugging Face's tokenizer.json (and its config) for every tokenizer, so AutoTokenizer loads it
        contents |= hf_tokenizer_files(tokenizer, c.block_size)
        if tokenizer.name == "gpt2":
            data = _gpt2_data_dir()
            special = {**special_tokens_map(tokenizer), "unk_token": ENDOFTEXT}
            tok_cfg = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": c.block_size, **special}
            contents |= {
                "vocab.json": (data / "encoder.json").read_bytes(),
                "merges.txt": (data / "vocab.bpe").read_bytes(),
                "special_tokens_map.json": json.dumps(special, indent=2),
                "tokenizer_config.json": json.dumps(tok_cfg | chat_template(tokenizer), indent=2),
            }
        if (
            tokenizer.name != "gpt2" or tokenizer.has_chat
        ):  # and gptcli's own, which gptcli reads back exactly
            contents[GPTCLI_TOKENIZER] = tokenizer.dumps()
        for name, content in contents.items():
            files.write_file(dest / name, content)
        written = ["config.json", "model.safetensors", *list(contents)[1:]]
        for name in set(EXPORTED) - set(written):  # an earlier export's: not this one's
            if files.is_regular_file(dest / name) or (dest / name).is_symlink():
                (dest / name).unlink()
    return written
