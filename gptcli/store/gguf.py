"""GGUF, llama.cpp's file format (also ollama's, LM Studio's, llamafile's): a gptcli model
written as llama.cpp's own GPT-2 converter writes one, and GGUF files of the `gpt2`
architecture read back as a model for every verb's --ckpt.

Written with the `gguf` package (llama.cpp's own writer; the `gguf` extra), which also
dequantizes; read through gptcli.store.gguf_header, one checked pass over the header.
Tensors go under llama.cpp's names in nn.Linear's (out, in) layout, which is its GPT-2
layout too. As the converter does: norms, biases and the position embedding stay
f32, the other matrices take the chosen type (q8_0 where a row is a multiple of 32 values,
else f16). GPT-2's BPE is written as llama.cpp expects it (model `gpt2`, pre-tokenizer
`gpt-2`, GPT-2's byte-to-character tokens, merges, <|endoftext|> as bos and eos, no bos
added); a chat model adds its two tokens as control tokens and its template. gptcli's
own tokenizer JSON travels under `gptcli.tokenizer`.

A GGUF file is untrusted input: its header, counts, sizes, shapes, types and offsets are
checked against the file before anything is allocated.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gptcli import files
from gptcli.config import ModelConfig
from gptcli.data.chat import CHATML_JINJA
from gptcli.data.tokenizer import (
    CHAT_TOKENS,
    ENDOFTEXT,
    IM_END,
    TiktokenTokenizer,
    Tokenizer,
    gpt2_tokenizer,
    tokenizer_from_dict,
)
from gptcli.errors import UsageError, need
from gptcli.model import GPT
from gptcli.store.gguf_header import ARRAY, INTEGERS, STRING, Field, Header, Tensor, read_header
from gptcli.store.validate import check_finite

OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def _gguf() -> Any:
    return need("gguf", "gguf", "GGUF files")


def _tensor_names(n_layer: int) -> dict[str, str]:
    """gptcli's state-dict names -> llama.cpp's GPT-2 tensor names."""
    names = {
        "transformer.wte.weight": "token_embd.weight",
        "transformer.wpe.weight": "position_embd.weight",
        "transformer.ln_f.weight": "output_norm.weight",
        "transformer.ln_f.bias": "output_norm.bias",
    }
    parts = {
        "ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output",
        "ln_2": "ffn_norm", "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down",
    }  # fmt: skip
    for i in range(n_layer):
        for ours, theirs in parts.items():
            for kind in ("weight", "bias"):
                names[f"transformer.h.{i}.{ours}.{kind}"] = f"blk.{i}.{theirs}.{kind}"
    return names


# --- export -----------------------------------------------------------------------------------------


def _gpt2_tokens(tokenizer: TiktokenTokenizer, vocab_size: int) -> tuple[list[str], list[int]]:
    """tokens and token types as llama.cpp's converter writes GPT-2's: the BPE's tokens as
    GPT-2's printable characters, special tokens as control tokens, the rows of a padded
    vocabulary as unused [PADn]."""
    from gptcli.store.hf_tokenizer import _bytes_to_unicode

    gguf = _gguf()
    to_str = _bytes_to_unicode()
    ranks: dict[bytes, int] = tokenizer.enc._mergeable_ranks
    tokens, types = [f"[PAD{i}]" for i in range(vocab_size)], [gguf.TokenType.UNUSED] * vocab_size
    for b, i in ranks.items():
        tokens[i], types[i] = "".join(to_str[x] for x in b), gguf.TokenType.NORMAL
    for t, i in tokenizer.special_tokens.items():
        tokens[i], types[i] = t, gguf.TokenType.CONTROL
    return tokens, [int(t) for t in types]


def _gpt2_merges() -> list[str]:
    """GPT-2's merges, in rank order, from its vocab.bpe (checked against tiktoken's hash
    when the tokenizer was built)."""
    from gptcli.data.tokenizer import _gpt2_data_dir

    lines = (_gpt2_data_dir() / "vocab.bpe").read_text(encoding="utf-8").splitlines()
    return [line for line in lines[1:] if line]  # the first line is a version comment


def export_gguf(
    model: GPT, tokenizer: Tokenizer, out: Path, outtype: str, name: str, source: str, replace: bool
) -> dict[str, int]:
    """Write model as a GGUF file at out (atomically); returns how many tensors took each type."""
    gguf = _gguf()
    c = model.config
    if tokenizer.name == "char":
        raise UsageError(
            "this model uses a char tokenizer, and llama.cpp has none that encodes text one character "
            "per token; GGUF export needs GPT-2's tokenizer (pretrain with --tokenizer gpt2, or finetune "
            "from gpt2)"
        )
    if tokenizer.name != "gpt2":
        raise UsageError(
            f"this model's own BPE ({tokenizer.name}) splits text with a pattern no llama.cpp pre-tokenizer "
            'matches exactly (the nearest, llama-bpe, keeps "\'ſx" whole where it makes two pieces), and a '
            "tokenizer that splits text differently is a different model; GGUF export needs GPT-2's tokenizer"
        )
    if not c.bias:
        raise UsageError("this model has no biases (--no-bias); llama.cpp's GPT-2 needs them")
    assert isinstance(tokenizer, TiktokenTokenizer)
    qtype = {
        "f32": gguf.GGMLQuantizationType.F32,
        "f16": gguf.GGMLQuantizationType.F16,
        "bf16": gguf.GGMLQuantizationType.BF16,
        "q8_0": gguf.GGMLQuantizationType.Q8_0,
    }[outtype]
    file_type = {
        "f32": gguf.LlamaFileType.ALL_F32,
        "f16": gguf.LlamaFileType.MOSTLY_F16,
        "bf16": gguf.LlamaFileType.MOSTLY_BF16,
        "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    }[outtype]
    counts: dict[str, int] = {}
    with files.writing_path(out, replace=replace) as path:
        w = gguf.GGUFWriter(path, "gpt2")
        w.add_name(name)
        w.add_block_count(c.n_layer)
        w.add_context_length(c.block_size)
        w.add_embedding_length(c.n_embd)
        w.add_feed_forward_length(4 * c.n_embd)
        w.add_head_count(c.n_head)
        w.add_layer_norm_eps(1e-5)
        w.add_file_type(file_type)
        w.add_string("gptcli.source", source)
        w.add_string("gptcli.tokenizer", tokenizer.dumps())
        tokens, types = _gpt2_tokens(tokenizer, c.vocab_size)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt-2")
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(_gpt2_merges())
        eot = tokenizer.special_tokens[ENDOFTEXT]
        w.add_bos_token_id(eot)
        w.add_eos_token_id(eot)
        w.add_add_bos_token(False)
        if tokenizer.has_chat:  # a reply ends at <|im_end|>, which llama.cpp calls end of turn
            w.add_eot_token_id(tokenizer.special_tokens[IM_END])
            w.add_chat_template(CHATML_JINJA)
        names = _tensor_names(c.n_layer)
        for ours, tensor in model.state_dict().items():
            if ours not in names:
                continue  # lm_head.weight (tied to token_embd), a classifier head
            theirs = names[ours]
            data = tensor.detach().float().cpu().numpy()
            kind = qtype
            if (
                data.ndim <= 1
                or theirs.endswith("_norm.weight")
                or not theirs.endswith(".weight")
                or (theirs == "position_embd.weight")
            ):
                kind = gguf.GGMLQuantizationType.F32
            try:
                packed = gguf.quants.quantize(data, kind)
            except gguf.QuantError:  # q8_0 of rows that are not multiples of 32: f16, as the converter does
                kind = gguf.GGMLQuantizationType.F16
                packed = gguf.quants.quantize(data, kind)
            w.add_tensor(theirs, packed, raw_dtype=kind)
            counts[kind.name.lower()] = counts.get(kind.name.lower(), 0) + 1
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
    return counts


# --- import -----------------------------------------------------------------------------------------


def is_gguf(path: Path) -> bool:
    """Whether path is a file that starts as GGUF files do."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _field(header: Header, key: str, kind: type, path: Path) -> Any:
    """A scalar or string key of the file, checked to be of kind."""
    field = header.fields.get(key)
    if field is None:
        raise UsageError(f"{path}: the key {key} is missing; it is not a GPT-2 GGUF file gptcli can read")
    if field.kind == ARRAY:
        raise UsageError(f"{path}: {key} is an array, not a single value")
    value = field.value
    if field.kind == STRING:
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"{path}: the key {key} cannot be read; the file is damaged") from None
    if kind is int and (isinstance(value, bool) or not isinstance(value, int | np.integer)):
        raise UsageError(f"{path}: {key} is {value!r}, not an integer")
    if kind is float and not isinstance(value, int | float | np.floating):
        raise UsageError(f"{path}: {key} is {value!r}, not a number")
    if kind is str and not isinstance(value, str):
        raise UsageError(f"{path}: {key} is not a string")
    return value


def load_gguf(path: Path, device: torch.device | str = "cpu") -> tuple[GPT, Tokenizer, dict[str, Any]]:
    """A GPT with the weights of a GGUF file of the gpt2 architecture (f32, f16, bf16 and
    q8_0 dequantized to float32), its tokenizer, and metadata."""
    gguf = _gguf()
    header = read_header(path)
    arch = _field(header, "general.architecture", str, path)
    if arch != "gpt2":
        raise UsageError(f"{path}: a GGUF model of the {arch!r} architecture; gptcli reads gpt2 only")
    ints = {
        k: int(_field(header, f"gpt2.{k}", int, path))
        for k in (
            "block_count",
            "context_length",
            "embedding_length",
            "attention.head_count",
            "feed_forward_length",
        )
    }
    eps = float(_field(header, "gpt2.attention.layer_norm_epsilon", float, path))
    n_layer, n_embd, n_head = ints["block_count"], ints["embedding_length"], ints["attention.head_count"]
    if not (0 < n_layer <= 1024 and 0 < n_head <= n_embd <= 1 << 16 and n_embd % n_head == 0):
        shape = f"{n_layer} layers, {n_head} heads of width {n_embd}"
        raise UsageError(f"{path}: its shape ({shape}) is not one gptcli can build")
    if ints["feed_forward_length"] != 4 * n_embd or not abs(eps - 1e-5) <= 1e-7:
        raise UsageError(f"{path}: its feed-forward width or layer-norm epsilon is not GPT-2's")
    if not 0 < ints["context_length"] <= 1 << 20:
        raise UsageError(f"{path}: context length {ints['context_length']} is out of range")
    tensors = {t.name: t for t in header.tensors}
    if len(tensors) != len(header.tensors):
        raise UsageError(f"{path}: a tensor name appears twice; the file is damaged")
    allowed = {gguf.GGMLQuantizationType[t.upper()] for t in OUTTYPES}
    for t in tensors.values():
        if t.tensor_type not in allowed:
            raise UsageError(
                f"{path}: {t.name} is {_type_name(t.tensor_type)}; "
                "gptcli reads f32, f16, bf16 and q8_0 GGUF files"
            )
    embd = tensors.get("token_embd.weight")
    if embd is None:
        raise UsageError(f"{path}: it has no token_embd.weight")
    if len(embd.shape) != 2 or int(embd.shape[0]) != n_embd or not 0 < int(embd.shape[1]) <= 1 << 20:
        shape = tuple(int(n) for n in reversed(embd.shape))
        raise UsageError(f"{path}: token_embd.weight has shape {shape}, not (vocabulary, {n_embd})")
    vocab_size = int(embd.shape[1])
    config = ModelConfig(
        n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=ints["context_length"],
        vocab_size=vocab_size, dropout=0.0, bias=True,
    )  # fmt: skip
    tokenizer = _gguf_tokenizer(header, path, vocab_size)
    expected = {theirs: _shape(ours, config) for ours, theirs in _tensor_names(n_layer).items()}
    state: dict[str, torch.Tensor] = {}
    ours_of = {theirs: ours for ours, theirs in _tensor_names(n_layer).items()}
    for name, t in tensors.items():
        if name == "output.weight":
            continue  # checked below: gptcli ties it to the token embedding
        if name not in expected:
            raise UsageError(f"{path}: unexpected tensor {name!r} for GPT-2")
        shape = tuple(int(n) for n in reversed(t.shape))  # ggml lists dimensions innermost first
        if shape != expected[name]:
            raise UsageError(f"{path}: {name} has shape {shape}, the model's is {expected[name]}")
        state[ours_of[name]] = _dequantized(header, t, shape)
        check_finite(name, state[ours_of[name]], str(path))  # (q8_0: its scales too, through the product)
    missing = sorted(set(expected) - set(tensors))
    if missing:
        raise UsageError(f"{path}: it lacks {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if "output.weight" in tensors:
        out = tensors["output.weight"]
        head = _dequantized(header, out, tuple(int(n) for n in reversed(out.shape)))
        if head.shape != state["transformer.wte.weight"].shape or not torch.allclose(
            head, state["transformer.wte.weight"], atol=1e-2
        ):
            raise UsageError(
                f"{path}: its output matrix is not its token embedding; gptcli's GPT ties the two"
            )
    model = GPT.from_weights(config, state)
    model.to(device).eval()
    name = header.fields.get("general.name")
    kinds = [_type_name(t.tensor_type).lower() for t in tensors.values() if len(t.shape) == 2]
    meta = {
        "task": "lm",
        "source": "gguf",
        "gguf_path": str(path),
        "model": vars(config),
        "name": (name.text() if name is not None else "") or path.stem,
        "gguf_type": max(set(kinds), key=kinds.count),  # the matrices' type
    }
    return model, tokenizer, meta


def _shape(name: str, c: ModelConfig) -> tuple[int, ...]:
    C = c.n_embd
    assert c.vocab_size is not None
    if name == "transformer.wte.weight":
        return (c.vocab_size, C)
    if name == "transformer.wpe.weight":
        return (c.block_size, C)
    sizes = {"c_attn": 3 * C, "attn.c_proj": C, "c_fc": 4 * C, "mlp.c_proj": C}
    for part, out in sizes.items():
        if f".{part}." in name:
            inner = 4 * C if part == "mlp.c_proj" else C
            return (out, inner) if name.endswith("weight") else (out,)
    return (C,)  # LayerNorms


def _type_name(tensor_type: int) -> str:
    try:
        return _gguf().GGMLQuantizationType(tensor_type).name
    except ValueError:
        return f"of type {tensor_type}"


def _dequantized(header: Header, t: Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    gguf = _gguf()
    n = int(np.prod(shape))
    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(t.tensor_type)]
    need = n // block * nbytes
    data = header.data(t, need)  # (ends where the file does)
    if n % block or data.nbytes != need:
        raise UsageError(
            f"{header.path}: {t.name} holds {data.nbytes} bytes, not the {need} its shape needs; "
            "the file is damaged"
        )
    values = gguf.quants.dequantize(data, gguf.GGMLQuantizationType(t.tensor_type))
    return torch.from_numpy(
        np.array(values, dtype=np.float32).reshape(shape)
    )  # a copy: the file stays read-only


def _gguf_tokenizer(header: Header, path: Path, vocab_size: int) -> Tokenizer:
    """GPT-2's BPE (with a chat model's tokens) when the file's vocabulary is exactly what
    gptcli would write for it, else refused: gptcli cannot tokenize for another vocabulary."""
    model = _field(header, "tokenizer.ggml.model", str, path)
    tokens_field = header.fields.get("tokenizer.ggml.tokens")
    if model != "gpt2":
        raise UsageError(f"{path}: its tokenizer is {model!r}; gptcli reads GPT-2's BPE only")
    if tokens_field is None:
        raise UsageError(f"{path}: it names GPT-2's tokenizer but lists no tokens; the file is damaged")
    pre = header.fields.get("tokenizer.ggml.pre")
    if pre is not None and pre.text() != "gpt-2":
        raise UsageError(
            f"{path}: its pre-tokenizer is {pre.text()!r}, not GPT-2's; gptcli cannot tokenize for it"
        )
    tokens = tokens_field.items()
    own = header.fields.get("gptcli.tokenizer")
    if own is not None:
        try:
            d = json.loads(own.text())
        except (ValueError, TypeError, RecursionError):
            raise UsageError(f"{path}: its gptcli.tokenizer is not JSON; the file is damaged") from None
        if not isinstance(d, dict):
            raise UsageError(f"{path}: its gptcli.tokenizer is not a tokenizer; the file is damaged")
        tok = tokenizer_from_dict(d, f"{path}: gptcli.tokenizer")
    else:
        tok = gpt2_tokenizer()
        if len(tokens) > 50257 and any(t in _strings(tokens_field, 50257, 50259) for t in CHAT_TOKENS):
            tok = tok.with_chat_tokens()
    if tok.name != "gpt2" or tok.vocab_size > vocab_size or len(tokens) != vocab_size:
        raise UsageError(f"{path}: its vocabulary is not GPT-2's; gptcli cannot tokenize for it")
    want, types = _gpt2_tokens(tok, vocab_size)  # type: ignore[arg-type]
    merges = header.fields.get("tokenizer.ggml.merges")
    given_types = header.fields.get("tokenizer.ggml.token_type")
    if (
        _strings(tokens_field, 0, tok.vocab_size) != want[: tok.vocab_size]
        or merges is None
        or len(merges.items()) != len(_gpt2_merges())  # (before decoding any of them)
        or _strings(merges, 0, len(merges.items())) != _gpt2_merges()
        or (
            given_types is not None
            and (given_types.item not in INTEGERS or given_types.items().tolist() != types)
        )
    ):
        raise UsageError(
            f"{path}: its vocabulary is not GPT-2's (nor a gptcli export's); gptcli cannot tokenize for it"
        )
    return tok


def _strings(field: Field, start: int, end: int) -> list[str]:
    """Items start..end-1 of a string-array key (none for a key of another kind)."""
    if field.item != STRING:
        return []
    return [b.decode("utf-8", errors="replace") for b in field.items()[start:end]]
