"""Hugging Face GPT-2 interoperability, without transformers.

In: a GPT-2 directory (config.json + model.safetensors, or pytorch_model.bin read with
torch.load(weights_only=True)), or a hub name (gpt2, gpt2-medium, gpt2-large, gpt2-xl,
distilgpt2) found in the local Hugging Face cache, or downloaded with huggingface_hub when
it is installed and the machine is online. Out: a directory that
transformers.GPT2LMHeadModel.from_pretrained() loads, with the tokenizer files when the
model uses GPT-2's BPE.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from gptcli.checkpoint import save_tensors
from gptcli.config import ModelConfig
from gptcli.errors import UsageError
from gptcli.model import GPT
from gptcli.tokenizer import ENDOFTEXT, _gpt2_data_dir

# hub names and the repositories that hold them (the short names are the old aliases)
HUB_MODELS = {
    "gpt2": ("openai-community/gpt2", "gpt2"),
    "gpt2-medium": ("openai-community/gpt2-medium", "gpt2-medium"),
    "gpt2-large": ("openai-community/gpt2-large", "gpt2-large"),
    "gpt2-xl": ("openai-community/gpt2-xl", "gpt2-xl"),
    "distilgpt2": ("distilbert/distilgpt2", "distilgpt2"),
}
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
GPTCLI_TOKENIZER = "gptcli_tokenizer.json"  # our tokenizer, for models not on GPT-2's BPE

# Hugging Face's GPT-2 stores these projections as Conv1D, i.e. weight (in, out): the
# transpose of nn.Linear's (out, in).
_CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_to_gptcli_state_dict(hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Map a Hugging Face GPT2LMHeadModel / GPT2Model state dict onto our parameter names."""
    out: dict[str, torch.Tensor] = {}
    for key, tensor in hf.items():
        name = key if key.startswith(("transformer.", "lm_head.")) else f"transformer.{key}"
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
    return (path / "config.json").is_file() and any((path / f).is_file() for f in WEIGHT_FILES)


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
            f"({type(e).__name__}); connect to the internet or pass a local GPT-2 directory"
        ) from None
    return Path(path)


# --- loading -------------------------------------------------------------------------------


def config_from_hf(cfg: dict[str, Any], source: str) -> ModelConfig:
    """Our ModelConfig for a Hugging Face GPT2Config, refusing variants we do not compute."""
    if cfg.get("model_type") != "gpt2":
        raise UsageError(
            f"{source}: model_type is {cfg.get('model_type')!r}; only GPT-2 models can be loaded"
        )
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
    try:
        config = ModelConfig(
            vocab_size=int(cfg["vocab_size"]),
            block_size=int(cfg.get("n_positions", cfg.get("n_ctx", 1024))),
            n_layer=int(cfg["n_layer"]),
            n_head=int(cfg["n_head"]),
            n_embd=int(cfg["n_embd"]),
            dropout=0.0,
            bias=True,
        )
    except (KeyError, TypeError, ValueError) as e:
        raise UsageError(f"{source}: incomplete GPT-2 config ({e})") from e
    config.validate()
    return config


def read_hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """Weights of a Hugging Face directory: safetensors, or a .bin through weights_only."""
    st = path / "model.safetensors"
    try:
        if st.is_file():
            return load_file(st)
        # weights_only: tensors and plain containers only; a pickle that would run code is refused
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        lines = [ln.strip() for ln in str(e).splitlines() if "GLOBAL" in ln]
        culprit = lines[0] if lines else "objects that are not tensors"
        raise UsageError(
            f"{path / 'pytorch_model.bin'}: refused, it is not plain tensors ({culprit}); "
            "loading it could run code. Use a model.safetensors file"
        ) from None
    except Exception as e:  # a foreign file: corrupt or truncated
        what = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
        raise UsageError(f"{path}: the weights cannot be read ({type(e).__name__}: {what})") from None


def load_hf(path: Path, device: torch.device | str = "cpu") -> tuple[GPT, dict[str, Any]]:
    """A GPT with the weights of a Hugging Face GPT-2 directory, and metadata about it."""
    try:
        cfg = json.loads((path / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UsageError(f"{path / 'config.json'} is unreadable ({e})") from e
    config = config_from_hf(cfg, str(path))
    model = GPT(config)
    state = hf_to_gptcli_state_dict(read_hf_weights(path))
    expected = model.state_dict()
    for key, value in expected.items():
        if key not in state:
            raise UsageError(f"{path}: the weights lack {key}")
        if state[key].shape != value.shape:
            raise UsageError(
                f"{path}: {key} has shape {tuple(state[key].shape)}, config.json needs {tuple(value.shape)}"
            )
    model.load_state_dict({k: state[k].float() for k in expected}, strict=True)
    model.to(device).eval()
    meta = {"task": "lm", "source": "huggingface", "hf_path": str(path), "model": vars(config)}
    return model, meta


# --- exporting -----------------------------------------------------------------------------


def export_hf(model: GPT, tokenizer: Any, out: Path) -> list[str]:
    """Write out/ so that transformers.GPT2LMHeadModel.from_pretrained(out) gives the same
    logits. Returns the files written."""
    c = model.config
    if not c.bias:
        raise UsageError(
            "this model has no biases (--no-bias); GPT-2's format needs them, so it cannot be exported"
        )
    eot = tokenizer.eot_id if tokenizer.eot_id is not None else 0
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": c.block_size,
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
        "eos_token_id": eot,
        "torch_dtype": "float32",
    }
    out.mkdir(parents=True, exist_ok=True)
    state = gptcli_to_hf_state_dict({k: v.detach().float().cpu() for k, v in model.state_dict().items()})
    save_tensors(state, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    written = ["config.json", "model.safetensors"]
    if tokenizer.name == "gpt2":
        data = _gpt2_data_dir()
        shutil.copyfile(data / "encoder.json", out / "vocab.json")
        shutil.copyfile(data / "vocab.bpe", out / "merges.txt")
        special = {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT, "unk_token": ENDOFTEXT}
        (out / "special_tokens_map.json").write_text(json.dumps(special, indent=2), encoding="utf-8")
        tok_cfg = {"tokenizer_class": "GPT2Tokenizer", "model_max_length": c.block_size, **special}
        (out / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2), encoding="utf-8")
        written += ["vocab.json", "merges.txt", "special_tokens_map.json", "tokenizer_config.json"]
    else:
        # Hugging Face has no loader for these; keep gptcli's own file beside the weights
        tokenizer.save(out / GPTCLI_TOKENIZER)
        written.append(GPTCLI_TOKENIZER)
    return written
