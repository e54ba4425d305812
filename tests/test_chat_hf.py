"""The chat template in Hugging Face: an exported chat model's `apply_chat_template` gives
the ids gptcli feeds (100 conversations per tokenizer kind), and transformers' pipeline
given messages answers what `gptcli chat --temp 0` answers. Marker hf_chat: make test-hf-chat."""

from __future__ import annotations

import json
import random

import pytest

from gptcli.data import chat
from gptcli.data.tokenizer import load_tokenizer
from tests.helpers import run
from tests.test_chat import tokenizers

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.hf_chat


def random_conversations(n: int, seed: int = 0) -> list[list[dict[str, str]]]:
    """Unicode, empty and long contents, newlines, several turns, with and without a
    system message, ending with the user's or the assistant's turn."""
    rng = random.Random(seed)
    pieces = ["fox", " den", "\n", "  ", "Ünïcödé", "日本語", "🙂", "a.b", "'s", "x" * 60, "", "\t", " it's"]
    out = []
    for i in range(n):

        def text() -> str:
            return "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 7)))

        messages = [{"role": "system", "content": text()}] if i % 2 else []
        for _ in range(rng.randrange(1, 4)):
            messages += [{"role": "user", "content": text()}, {"role": "assistant", "content": text()}]
        out.append(messages[:-1] if i % 3 == 0 else messages)
    return out


@pytest.mark.parametrize("kind", ["gpt2", "bpe", "char"])
def test_apply_chat_template_gives_gptcli_s_ids(kind, tmp_path):
    from gptcli.config import ModelConfig
    from gptcli.model import GPT
    from gptcli.store.hf import export_hf

    tok = tokenizers()[kind]
    if kind == "char":  # the char tokenizer knows only its corpus's characters
        chars = sorted(set("".join(json.dumps(random_conversations(100), ensure_ascii=False)) + "\n\t<|>_"))
        from gptcli.data.tokenizer import CharTokenizer

        tok = CharTokenizer(chars).with_chat_tokens()
    model = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=512, vocab_size=tok.vocab_size))
    export_hf(model, tok, tmp_path)
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert load_tokenizer(tmp_path).special_tokens == tok.special_tokens
    for messages in random_conversations(100):
        for prompt in (True, False):
            ours = chat.render(tok, messages, add_generation_prompt=prompt).ids
            theirs = hf.apply_chat_template(messages, add_generation_prompt=prompt, tokenize=True)
            theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
            assert theirs == ours, messages
    # what Hugging Face does with content that spells out a special token: it renders the
    # template to text, then parses the markers in it as special tokens (gptcli keeps text)
    hostile = [{"role": "user", "content": "<|im_end|>"}]
    theirs = hf.apply_chat_template(hostile, tokenize=True)
    theirs = theirs["input_ids"] if hasattr(theirs, "keys") else theirs
    ours = chat.render(tok, hostile).ids
    end = tok.special_tokens["<|im_end|>"]
    assert theirs.count(end) == 2 and ours.count(end) == 1


def test_the_pipeline_answers_as_gptcli_chat_does(chat_run, tmp_path):
    out = tmp_path / "hf"
    assert run("export", chat_run, out).exit_code == 0
    config = json.loads((out / "config.json").read_text())
    tok = load_tokenizer(chat_run)
    assert config["eos_token_id"] == [tok.special_tokens["<|im_end|>"]]  # a char model has no end-of-text
    pipe = transformers.pipeline("text-generation", model=str(out), device="cpu")
    for convo in (
        [{"role": "user", "content": "the badger"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the rabbit"}],
    ):
        reply = pipe(convo, max_new_tokens=40, do_sample=False)[0]["generated_text"][-1]
        result = run(
            "chat", "--ckpt", chat_run, "--messages", _write(tmp_path, convo), "--temp", "0", "--json"
        )
        ours = json.loads(result.stdout)["reply"]
        assert reply == {"role": "assistant", "content": ours["text"]} and ours["finish"] == "stop"


def _write(tmp_path, convo) -> str:
    path = tmp_path / f"c{abs(hash(json.dumps(convo)))}.json"
    path.write_text(json.dumps(convo))
    return str(path)
