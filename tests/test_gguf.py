"""GGUF export and import, read back with the `gguf` package's own reader: the metadata and
tensors llama.cpp's GPT-2 converter writes, exact round trips in f32 (f16 and bf16 within
their rounding, q8_0 within its agreement and perplexity targets), every verb's --ckpt
FILE.gguf, and a GGUF file treated as untrusted input."""

from __future__ import annotations

import json
import math
import struct
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from gptcli.data.tokenizer import gpt2_tokenizer
from gptcli.store.loading import load
from tests.helpers import QUICK_FINETUNE, assert_usage_error, make_corpus, run

gguf = pytest.importorskip("gguf")
pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def gpt2_dir(hf_gpt2, tmp_path_factory):
    """A small Hugging Face GPT-2 with GPT-2's 50257 tokens (weights drawn large, so that its
    next-token distributions are peaked, as a trained model's are)."""
    out = tmp_path_factory.mktemp("gguf") / "hf"
    hf_gpt2(n_layer=2, n_head=2, n_embd=64, vocab_size=50257, n_positions=64, seed=3).save_pretrained(out)
    return out


def export(src, out, *args):
    result = run("export", src, out, *args)
    assert result.exit_code == 0, result.output
    return result


def logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]))[0][0]


@pytest.fixture(scope="module")
def text_ids():
    return gpt2_tokenizer().encode(" The rabbit dug a hole because winter was coming. It stayed there." * 2)[
        :60
    ]


def test_metadata_and_tensors_are_llama_cpp_s(gpt2_dir, tmp_path):
    result = export(gpt2_dir, tmp_path / "m.gguf")
    assert "f32" in result.output  # the Hugging Face weights are float32: so is the default
    r = gguf.GGUFReader(tmp_path / "m.gguf")

    def value(key):
        return r.fields[key].contents()

    assert value("general.architecture") == "gpt2" and value("general.name") == "m"
    assert (value("gpt2.block_count"), value("gpt2.context_length"), value("gpt2.embedding_length")) == (
        2,
        64,
        64,
    )
    assert (value("gpt2.feed_forward_length"), value("gpt2.attention.head_count")) == (256, 2)
    assert value("gpt2.attention.layer_norm_epsilon") == pytest.approx(1e-5)
    assert value("general.file_type") == int(gguf.LlamaFileType.ALL_F32)
    assert value("tokenizer.ggml.model") == "gpt2" and value("tokenizer.ggml.pre") == "gpt-2"
    assert value("tokenizer.ggml.bos_token_id") == value("tokenizer.ggml.eos_token_id") == 50256
    assert value("tokenizer.ggml.add_bos_token") is False
    tokens, types = value("tokenizer.ggml.tokens"), value("tokenizer.ggml.token_type")
    assert len(tokens) == 50257 and tokens[50256] == "<|endoftext|>" and tokens[262] == "Ġthe"
    assert types[50256] == gguf.TokenType.CONTROL and types[0] == gguf.TokenType.NORMAL
    merges = value("tokenizer.ggml.merges")
    assert len(merges) == 50000 and merges[0] == "Ġ t"
    names = {t.name: t for t in r.tensors}
    assert "output.weight" not in names  # tied to token_embd, as in GPT-2's own conversion
    assert [int(n) for n in names["blk.0.attn_qkv.weight"].shape] == [64, 192]  # ggml lists (in, out)
    assert len(names) == 4 + 2 * 12


@pytest.mark.parametrize(("outtype", "tolerance"), [("f32", 0.0), ("f16", 2e-2), ("bf16", 2e-1)])
def test_round_trips_give_the_same_logits(gpt2_dir, tmp_path, text_ids, outtype, tolerance):
    export(gpt2_dir, tmp_path / "m.gguf", "--outtype", outtype)
    ours, back = load(gpt2_dir), load(tmp_path / "m.gguf")
    assert back.tokenizer.to_dict() == ours.tokenizer.to_dict()
    a, b = logits(ours.model, text_ids), logits(back.model, text_ids)
    assert (a - b).abs().max().item() <= tolerance * a.abs().max().item()
    r = gguf.GGUFReader(tmp_path / "m.gguf")
    kinds = {t.name: t.tensor_type.name for t in r.tensors}
    assert kinds["blk.0.ffn_up.weight"] == outtype.upper()
    assert kinds["blk.0.ffn_up.bias"] == kinds["position_embd.weight"] == kinds["output_norm.weight"] == "F32"


def test_q8_0_agrees_with_f32_and_keeps_its_perplexity(gpt2_run, tmp_path):
    """On a trained model (random weights have near-ties that any rounding flips)."""
    export(gpt2_run, tmp_path / "q.gguf", "--outtype", "q8_0")
    export(gpt2_run, tmp_path / "f.gguf", "--outtype", "f32")
    # every matrix in 8-bit blocks: about a quarter of the weights' bytes, the vocabulary's beside them
    kinds = {t.name: t.tensor_type.name for t in gguf.GGUFReader(tmp_path / "q.gguf").tensors}
    assert all(
        kinds[n] == "Q8_0" for n in kinds if n.endswith(".weight") and "norm" not in n and "position" not in n
    )
    assert (tmp_path / "q.gguf").stat().st_size < 0.4 * (tmp_path / "f.gguf").stat().st_size
    f32, q8 = load(tmp_path / "f.gguf").model, load(tmp_path / "q.gguf").model
    held = make_corpus(tmp_path / "held.txt", n_sentences=60, seed=9)
    ids = gpt2_tokenizer().encode(held.read_text())
    agree = total = 0
    for start in range(0, len(ids) - 32, 32):  # windows of the model's block
        a, b = logits(f32, ids[start : start + 32]), logits(q8, ids[start : start + 32])
        # the grammar picks among its animals uniformly: where f32's two best are within 0.1
        # of each other (a tie the data made), any rounding may flip them; elsewhere, agree
        top2 = a.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 0.1
        agree += int((a.argmax(-1) == b.argmax(-1))[clear].sum())
        total += int(clear.sum())
    assert total > 500 and agree / total >= 0.99
    ppl = {}
    for name in ("f", "q"):
        result = run("eval", "--ckpt", tmp_path / f"{name}.gguf", held, "--json", "--dtype", "fp32")
        assert result.exit_code == 0, result.output
        ppl[name] = json.loads(result.stdout.strip().splitlines()[-1])["ppl"]
    assert math.isclose(ppl["q"], ppl["f"], rel_tol=0.01)


def test_every_verb_takes_a_gguf_file(gpt2_dir, tmp_path):
    model = tmp_path / "m.gguf"
    export(gpt2_dir, model)
    ours = run("sample", "--ckpt", gpt2_dir, "--prompt", "The fox", "--temp", "0", "-n", "8", "--json")
    theirs = run("sample", "--ckpt", model, "--prompt", "The fox", "--temp", "0", "-n", "8", "--json")
    assert json.loads(theirs.stdout)["samples"] == json.loads(ours.stdout)["samples"]
    for args in (
        ["beam", "--ckpt", model, "The fox", "--beams", "2", "-n", "4"],
        ["inspect-attn", "--ckpt", model, "The fox dug"],
        ["inspect-lens", "--ckpt", model, "The fox dug"],
        ["sample", "--ckpt", model, "-n", "4", "--quantize", "int8"],
    ):
        result = run(*args)
        assert result.exit_code == 0, (args, result.output)
    corpus = make_corpus(tmp_path / "more.txt", n_sentences=100)
    args = list(QUICK_FINETUNE)
    result = run("finetune", "--ckpt", model, corpus, "--out", tmp_path / "ft", *args)
    assert result.exit_code == 0, result.output
    # and export goes on from there: a GGUF file back to Hugging Face
    export(model, tmp_path / "hf-again")
    a = logits(load(tmp_path / "hf-again").model, [464, 21831])
    assert torch.equal(a, logits(load(gpt2_dir).model, [464, 21831]))


def test_a_chat_model_carries_its_template_and_end_of_turn(tmp_path):
    from gptcli.config import ModelConfig
    from gptcli.data.chat import CHATML_JINJA
    from gptcli.model import GPT
    from gptcli.store.gguf import export_gguf

    tok = gpt2_tokenizer().with_chat_tokens()
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=32, vocab_size=50304))
    export_gguf(model, tok, tmp_path / "c.gguf", "f16", "c", "test", replace=False)
    r = gguf.GGUFReader(tmp_path / "c.gguf")
    assert r.fields["tokenizer.chat_template"].contents() == CHATML_JINJA
    assert r.fields["tokenizer.ggml.eot_token_id"].contents() == 50258
    tokens, types = (
        r.fields["tokenizer.ggml.tokens"].contents(),
        r.fields["tokenizer.ggml.token_type"].contents(),
    )
    assert tokens[50257:50259] == ["<|im_start|>", "<|im_end|>"] and types[50258] == gguf.TokenType.CONTROL
    assert tokens[50300] == "[PAD50300]" and types[50300] == gguf.TokenType.UNUSED  # the padded rows
    back = load(tmp_path / "c.gguf")
    assert back.tokenizer.has_chat and back.model.config.vocab_size == 50304


def test_export_refusals(gpt2_dir, chat_run, tmp_path):
    out = tmp_path / "m.gguf"
    assert_usage_error(run("export", chat_run, out), "char tokenizer", "GPT-2's tokenizer")
    from gptcli.config import ModelConfig
    from gptcli.data.tokenizer import train_bpe
    from gptcli.errors import UsageError
    from gptcli.model import GPT
    from gptcli.store.gguf import export_gguf

    bpe = train_bpe(["The fox dug a den because winter was coming. " * 50], 280)
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=280))
    with pytest.raises(UsageError, match=r"no llama\.cpp pre-tokenizer matches exactly"):
        export_gguf(model, bpe, out, "f32", "m", "test", replace=False)
    assert not out.exists()
    export(gpt2_dir, out)
    before = out.read_bytes()
    assert_usage_error(run("export", gpt2_dir, out, "--outtype", "q8_0"), "already exists", "--force")
    assert out.read_bytes() == before
    export(gpt2_dir, out, "--outtype", "q8_0", "--force")
    assert out.read_bytes() != before
    assert_usage_error(run("export", gpt2_dir, out, "--to", "hf"), "--to hf writes a directory")
    assert_usage_error(
        run("export", gpt2_dir, tmp_path / "d", "--outtype", "f16"), "--outtype goes with --to gguf"
    )
    assert_usage_error(run("export", gpt2_dir, tmp_path / "x.gguf", "--adapters-only"), "merged model")
    assert_usage_error(run("export", gpt2_dir, out, "--outtype", "q4_0"), "q4_0")


def _write(path, arch="gpt2", tensor_type=None, tokens=None):
    """A small GGUF file written directly with gguf's writer (other programs' files)."""
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(1)
    w.add_context_length(8)
    w.add_embedding_length(32)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_layer_norm_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens or ["a", "b"])
    data = np.zeros((2, 32), dtype=np.float32)
    kind = tensor_type or gguf.GGMLQuantizationType.F32
    w.add_tensor("token_embd.weight", gguf.quants.quantize(data, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_a_gguf_file_is_untrusted_input(gpt2_dir, tmp_path):
    good = tmp_path / "m.gguf"
    export(gpt2_dir, good)
    raw = good.read_bytes()
    claims = tmp_path / "claims.gguf"  # a header that claims 10^12 tensors
    claims.write_bytes(raw[:8] + struct.pack("<Q", 10**12) + raw[16:])
    cut = tmp_path / "cut.gguf"  # the last tensor runs past the end of the file
    cut.write_bytes(raw[: len(raw) - 4096])
    for path, words in [
        (claims, "claims 1000000000000 tensors"),
        (cut, "cut.gguf"),
        (_write(tmp_path / "llama.gguf", arch="llama"), "the 'llama' architecture; gptcli reads gpt2 only"),
        (tmp_path / "empty.gguf", "not a GGUF file"),
    ]:
        if not path.exists():
            path.write_bytes(b"")
        message = assert_usage_error(run("sample", "--ckpt", path, "-n", "2"), words)
        assert len(message) < 400
    q4 = _write(tmp_path / "q4.gguf", tensor_type=gguf.GGMLQuantizationType.Q4_0)
    assert_usage_error(run("sample", "--ckpt", q4, "-n", "2"), "Q4_0", "f32, f16, bf16 and q8_0")


def test_without_the_gguf_package_one_line_names_the_extra(gpt2_dir, tmp_path, monkeypatch):
    import sys

    from gptcli.cli.serve import _model_name

    monkeypatch.setitem(sys.modules, "gguf", None)  # as if not installed
    assert_usage_error(run("export", gpt2_dir, tmp_path / "m.gguf"), "pip install 'gptcli[gguf]'")
    assert not (tmp_path / "m.gguf").exists()
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    assert _model_name(str(tmp_path / "m.gguf"), tmp_path / "m.gguf") == "m"  # serve's name for it


def _parsed(path) -> SimpleNamespace:
    """A GGUF file's architecture, keys ((name, value, kind, sub-kind) each) and tensors, read
    once by gguf's reader (reading 50257 tokens' keys takes seconds: _rebuilt reuses them)."""
    r = gguf.GGUFReader(path)
    keys = []
    for name, field in r.fields.items():
        if not name.startswith("GGUF."):
            kind = field.types[0]
            keys.append(
                (name, field.contents(), kind, field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None)
            )
    tensors = [
        SimpleNamespace(name=t.name, data=np.array(t.data), shape=t.shape, tensor_type=t.tensor_type)
        for t in r.tensors
    ]
    return SimpleNamespace(arch=r.fields["general.architecture"].contents(), keys=keys, tensors=tensors)


def _rebuilt(src: SimpleNamespace, dst, keys: dict | None = None, drop=(), tensors=None):
    """A GGUF file written again from src's keys and tensors (_parsed), with some keys replaced
    (name -> (value, GGUFValueType)) or dropped: another program's file, or a crafted one."""
    w = gguf.GGUFWriter(dst, src.arch)
    for name, value, kind, sub in src.keys:
        if name != "general.architecture" and name not in drop and name not in (keys or {}):
            w.add_key_value(name, value, kind, sub_type=sub)
    for name, (value, kind) in (keys or {}).items():
        w.add_key_value(name, value, kind)
    for t in tensors if tensors is not None else src.tensors:
        w.add_tensor(t.name, np.asarray(t.data), raw_shape=list(reversed([int(n) for n in t.shape])),
                     raw_dtype=t.tensor_type)  # fmt: skip
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def _poisoned(t):
    """A GGUF tensor as it is, but the final layer norm's weights NaN: damaged weights."""
    data = np.asarray(t.data)
    if t.name == "output_norm.weight":
        data = np.full_like(data, np.nan)
    return SimpleNamespace(name=t.name, data=data, shape=t.shape, tensor_type=t.tensor_type)


def test_crafted_headers_and_keys_are_one_line_each(gpt2_dir, tmp_path):
    good = tmp_path / "m.gguf"
    export(gpt2_dir, good)
    parsed = _parsed(good)
    S, ARR = gguf.GGUFValueType.STRING, gguf.GGUFValueType.ARRAY
    array = tmp_path / "array.gguf"  # 49 bytes claiming an array of 2^62 items
    array.write_bytes(
        b"GGUF"
        + struct.pack("<IQQ", 3, 0, 1)
        + struct.pack("<Q", 1)
        + b"a"
        + struct.pack("<IIQ", 9, 0, 1 << 62)
    )
    deep = "[" * 100000 + "]" * 100000
    own = ("gptcli.tokenizer",)
    twice = tmp_path / "twice.gguf"  # a key given twice
    twice.write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 2) + 2 * (struct.pack("<Q", 1) + b"a" + struct.pack("<IB", 0, 1))
    )
    strings = tmp_path / "strings.gguf"  # an array of 2 strings whose second runs past the end
    strings.write_bytes(
        b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a" + struct.pack("<IIQ", 9, 8, 2)
        + struct.pack("<Q", 1) + b"x" + struct.pack("<Q", 1 << 40) + b"y" * 40
    )  # fmt: skip
    for path, words in [
        (array, "an array claims"),
        (twice, "the key a appears twice"),
        (strings, "a string of 1099511627776 bytes is longer than the file"),
        (_rebuilt(parsed, tmp_path / "align.gguf", {"general.alignment": (3, gguf.GGUFValueType.UINT32)}),
         "an alignment of 3"),
        (_rebuilt(parsed, tmp_path / "list.gguf", {"gptcli.tokenizer": ("[1]", S)}), "not a tokenizer"),
        (_rebuilt(parsed, tmp_path / "deep.gguf", {"gptcli.tokenizer": (deep, S)}), "not JSON"),
        (_rebuilt(parsed, tmp_path / "pre.gguf", {"tokenizer.ggml.pre": ("llama-bpe", S)}, drop=own),
         "pre-tokenizer is 'llama-bpe'"),
        (_rebuilt(parsed, tmp_path / "merges.gguf", drop=(*own, "tokenizer.ggml.merges")), "not GPT-2's"),
        (_rebuilt(parsed, tmp_path / "tokens.gguf", drop=(*own, "tokenizer.ggml.tokens")), "lists no tokens"),
        (_rebuilt(parsed, tmp_path / "types.gguf", {"tokenizer.ggml.token_type": (["x"] * 50257, ARR)},
                  drop=own), "not GPT-2's"),
        (_rebuilt(parsed, tmp_path / "nan.gguf", tensors=[_poisoned(t) for t in parsed.tensors]),
         "output_norm.weight holds NaN or inf"),
    ]:  # fmt: skip
        assert_usage_error(run("sample", "--ckpt", path, "-n", "2"), words)
    # a name that is not UTF-8 or not a string: the file's stem
    odd = _rebuilt(parsed, tmp_path / "odd.gguf", {"general.name": (b"\xff\xfe", S)})
    assert load(odd).meta["name"] == "odd"


def test_the_header_reads_what_ggufs_own_reader_reads(gpt2_dir, tmp_path):
    """gptcli.store.gguf_header against the gguf package's reader, on a q8_0 export (every value
    kind the converter writes, and quantized tensors): the same keys, values and tensors."""
    from gptcli.store.gguf_header import ARRAY, STRING, read_header

    path = tmp_path / "m.gguf"
    export(gpt2_dir, path, "--outtype", "q8_0")
    theirs = gguf.GGUFReader(path)
    ours = read_header(path)
    assert set(ours.fields) == {k for k in theirs.fields if not k.startswith("GGUF.")}
    for key, field in ours.fields.items():
        want = theirs.fields[key]
        assert field.kind == want.types[0], key
        if field.kind == ARRAY and field.item == STRING:
            assert [b.decode() for b in field.items()] == want.contents(), key
        elif field.kind == ARRAY:
            assert list(field.items()) == want.contents(), key
        elif field.kind == STRING:
            assert field.text() == want.contents(), key
        else:
            assert field.value == pytest.approx(want.contents()), key
    assert [(t.name, t.shape, t.tensor_type) for t in ours.tensors] == [
        (t.name, tuple(int(n) for n in t.shape), int(t.tensor_type)) for t in theirs.tensors
    ]
    for mine, t in zip(ours.tensors, theirs.tensors, strict=True):
        assert ours.data_start + mine.offset == t.data_offset
        assert np.array_equal(ours.data(mine, t.data.nbytes), np.asarray(t.data).view(np.uint8).reshape(-1))


def test_a_gguf_file_by_any_name_and_lora_on_top_of_one(gpt2_dir, tmp_path):
    plain = tmp_path / "plain-name"  # --to gguf into a name without the extension
    export(gpt2_dir, plain, "--to", "gguf")
    assert load(plain).meta["source"] == "gguf"
    corpus = make_corpus(tmp_path / "more.txt", n_sentences=100)
    args = list(QUICK_FINETUNE)
    result = run("finetune", "--ckpt", plain, corpus, "--out", tmp_path / "lora", "--lora-rank", "2", *args)
    assert result.exit_code == 0, result.output
    assert run("sample", "--ckpt", tmp_path / "lora", "-n", "2").exit_code == 0


def test_a_gguf_name_is_taken_as_one_and_a_directory_is_never_offered_to_force(tmp_path, monkeypatch):
    """ ".gguf" alone (pathlib gives it no suffix) names a GGUF file, not a Hugging Face
    directory; an existing directory named x.gguf is refused as a directory at once, not
    with "pass --force", which then failed on it."""
    monkeypatch.chdir(tmp_path)
    assert_usage_error(run("export", "runs/none", ".gguf", "--to", "hf"), "--to hf writes a directory")
    (tmp_path / "d.gguf").mkdir()
    for force in ([], ["--force"]):
        line = assert_usage_error(run("export", "runs/none", "d.gguf", *force), "d.gguf is a directory")
        assert "--force" not in line
