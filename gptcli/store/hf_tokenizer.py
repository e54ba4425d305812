"""gptcli's tokenizers as Hugging Face `tokenizer.json` files, built with the `tokenizers`
library, so that `AutoTokenizer` / `PreTrainedTokenizerFast`, `pipeline(...)` and
lm-evaluation-harness load an exported model with the ids gptcli gives it.

- byte-level BPE (gpt2, bpe:N): the tiktoken ranks become a BPE vocabulary (bytes as
  GPT-2's printable characters) and merges (each token's last merge, recovered by running
  BPE on its bytes with the ranks below its own), behind the same split pattern;
  <|endoftext|> is a special token.
- char: one token per character (a WordLevel model over single characters), no special
  token: text such as "<|endoftext|>" stays characters.

A chat model's <|im_start|> and <|im_end|> are special tokens of every kind, and its
template (ChatML, gptcli/data/chat.py) is `chat_template` in tokenizer_config.json, with
<|im_end|> as the end of sequence: `apply_chat_template` gives the ids gptcli feeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcli.data.chat import CHATML_JINJA, render_text
from gptcli.data.tokenizer import CHAT_TOKENS, ENDOFTEXT, IM_END, CharTokenizer, TiktokenTokenizer, Tokenizer
from gptcli.errors import UsageError, need


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (so that BPE tokens are strings)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    chars, n = printable[:], 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return dict(zip(printable, map(chr, chars), strict=True))


def _last_merge(ranks: dict[bytes, int], token: bytes) -> tuple[bytes, bytes]:
    """The two tokens whose merge made token: BPE on its bytes with the ranks below its own."""
    limit = ranks[token]
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
        best, at = None, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1])
            if rank is not None and rank < limit and (best is None or rank < best):
                best, at = rank, i
        if best is None:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise UsageError(f"the BPE token {token!r} has no merge that makes it; the tokenizer is damaged")
    return parts[0], parts[1]


def hf_tokenizer(tokenizer: Tokenizer) -> Any:
    """A tokenizers.Tokenizer that encodes and decodes as tokenizer does."""
    tk = need("tokenizers", "hf", "exporting the tokenizer")
    AddedToken, Regex, HFTokenizer = tk.AddedToken, tk.Regex, tk.Tokenizer
    decoders, models, pre_tokenizers = tk.decoders, tk.models, tk.pre_tokenizers

    if isinstance(tokenizer, CharTokenizer):
        vocab = {c: i for i, c in enumerate(tokenizer.chars)}
        hf = HFTokenizer(models.WordLevel(vocab, unk_token=ENDOFTEXT))  # no unk: unknown characters fail
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
        hf.decoder = decoders.Fuse()
        return _with_specials(hf, tokenizer, AddedToken)
    if not isinstance(tokenizer, TiktokenTokenizer):
        raise UsageError(f"cannot write a {tokenizer.name} tokenizer in Hugging Face's format")
    ranks: dict[bytes, int] = tokenizer.enc._mergeable_ranks
    to_str = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(to_str[x] for x in b)

    vocab = {text(b): r for b, r in ranks.items()}
    merges = [tuple(map(text, _last_merge(ranks, b))) for b, _ in sorted(ranks.items(), key=lambda kv: kv[1])
              if len(b) > 1]  # fmt: skip
    hf = HFTokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(tokenizer.enc._pat_str), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    hf.decoder = decoders.ByteLevel()
    return _with_specials(hf, tokenizer, AddedToken)


def _with_specials(hf: Any, tokenizer: Tokenizer, AddedToken: Any) -> Any:
    """The special tokens, in id order, checked to get gptcli's ids."""
    for text, i in sorted(tokenizer.special_tokens.items(), key=lambda kv: kv[1]):
        hf.add_special_tokens([AddedToken(text, special=True, normalized=False, lstrip=False, rstrip=False)])
        if hf.token_to_id(text) != i:
            raise UsageError(f"{text} would get id {hf.token_to_id(text)}, not {i}")
    return hf


def special_tokens_map(tokenizer: Tokenizer) -> dict[str, Any]:
    """tokenizer_config.json's special tokens: end-of-text as bos and eos; for a chat model,
    <|im_end|> as eos (a reply ends there) and the template's tokens as additional ones."""
    special: dict[str, Any] = (
        {"bos_token": ENDOFTEXT, "eos_token": ENDOFTEXT} if tokenizer.eot_id is not None else {}
    )
    if tokenizer.has_chat:
        special["eos_token"] = IM_END
        special["additional_special_tokens"] = list(CHAT_TOKENS)
    return special


def chat_template(tokenizer: Tokenizer) -> dict[str, str]:
    """The chat_template entry of tokenizer_config.json, for a chat model."""
    return {"chat_template": CHATML_JINJA} if tokenizer.has_chat else {}


# conversations on which an imported template must render exactly as ChatML does
PROBES = [
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi\nthere "},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": ""},
    ],
    [{"role": "user", "content": " 日本語 🙂\t"}, {"role": "assistant", "content": "  "}],
]


def chat_from_hf(path: Path, tokenizer: Tokenizer) -> Tokenizer:
    """tokenizer with the chat tokens, when a Hugging Face directory's chat template is
    ChatML (it renders as gptcli's on PROBES, in a sandboxed child process: the template is
    data) and its
    tokenizer.json gives <|im_start|> and <|im_end|> the ids gptcli gives them; else
    tokenizer as it is (a model without a template gptcli can use)."""
    from gptcli.data.inputs import try_read_json

    config = try_read_json(path / "tokenizer_config.json")
    template = config.get("chat_template") if isinstance(config, dict) else None
    if isinstance(template, list):  # several named templates: the default one
        named = [t for t in template if isinstance(t, dict) and t.get("name") == "default"]
        template = named[0].get("template") if named else None
    if not isinstance(template, str) or len(template) > 1 << 16:
        return tokenizer
    chat_tok = tokenizer.with_chat_tokens()
    hf = try_read_json(path / "tokenizer.json")
    added = hf.get("added_tokens") if isinstance(hf, dict) else None
    ids = {t.get("content"): t.get("id") for t in added or [] if isinstance(t, dict)}
    if any(ids.get(t) != chat_tok.special_tokens[t] for t in CHAT_TOKENS):
        return tokenizer
    expected = [render_text(m, generation) for m in PROBES for generation in (False, True)]
    return chat_tok if _rendered(template) == expected else tokenizer


# renders a template on PROBES in a child process of bounded time and memory: a template is
# data from elsewhere, and Jinja's sandbox stops code, not endless loops or huge strings
_RENDER = """
import json, resource, sys
resource.setrlimit(resource.RLIMIT_CPU, (5, 5))
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from jinja2.sandbox import ImmutableSandboxedEnvironment
given = json.load(sys.stdin)
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)  # as transformers renders
template = env.from_string(given["template"])
out = [template.render(messages=m, add_generation_prompt=g, bos_token="", eos_token="")
       for m in given["probes"] for g in (False, True)]
json.dump(out, sys.stdout)
"""


def _rendered(template: str) -> list[str] | None:
    """The template rendered on PROBES (each without and with the generation prompt), or
    None if it fails, takes over 5 s of CPU or 1 GiB of memory."""
    import json
    import subprocess
    import sys

    try:
        proc = subprocess.run(
            [sys.executable, "-I", "-c", _RENDER],
            input=json.dumps({"template": template, "probes": PROBES}),
            capture_output=True,
            text=True,
            timeout=20,
        )
        out = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None
    return out if isinstance(out, list) else None


def hf_tokenizer_files(tokenizer: Tokenizer, block_size: int) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json for an export dir."""
    import json

    hf = hf_tokenizer(tokenizer)
    special = special_tokens_map(tokenizer)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": block_size,
        "clean_up_tokenization_spaces": False,  # decode gives back the text, spaces as they were
        **special,
        **chat_template(tokenizer),
    }
    return {
        "tokenizer.json": hf.to_str(),
        "tokenizer_config.json": json.dumps(config, indent=2),
        "special_tokens_map.json": json.dumps(special, indent=2),
    }
