"""`gptcli tokenize`: show how text splits into tokens, or encode a corpus into shards. Its
flags are config.verbs.TokenizeSettings."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from gptcli.cli import render
from gptcli.cli.common import is_path, text_arg
from gptcli.config.verbs import TokenizeSettings
from gptcli.errors import UsageError
from gptcli.messages import command_line

if TYPE_CHECKING:
    from gptcli.data.tokenizer import Tokenizer


def resolve_tokenizer(arg: str, text: str | None = None) -> Tokenizer:
    """--tokenizer as a spec (char, gpt2, bpe:N) or a path to a tokenizer.json, run or data dir.

    A char tokenizer without a file takes its vocabulary from `text`."""
    from gptcli.data.tokenizer import CharTokenizer, build_tokenizer, load_tokenizer, parse_spec

    if is_path(arg):
        return load_tokenizer(arg)
    kind, _ = parse_spec(arg)
    if kind == "char" and text is not None:
        return CharTokenizer.from_texts([text])
    if kind == "bpe":
        raise UsageError(
            f"{arg} is trained on a corpus: run "
            f"`{command_line('tokenize', 'CORPUS', '--out', 'DIR', '--tokenizer', arg)}`, "
            "then pass --tokenizer DIR"
        )
    return build_tokenizer(arg)


def tokenize(s: TokenizeSettings) -> None:
    """Show the tokens of a text, or encode a corpus for training.

    gptcli tokenize "The rabbit dug a"                      position, id and piece of each token
    gptcli tokenize corpus.txt --out data/shakes            train.bin / val.bin for pretrain
    gptcli tokenize books/ --out data/books -t bpe:8192     train an 8192-token BPE on books/
    gptcli tokenize shards/ --out data/web -t gpt2          Parquet, .jsonl.gz, .txt.zst, ...
    """
    if s.out is not None:
        _encode_corpus(s, s.out)
        return
    existing = [p for p in s.inputs if is_path(p)]
    if existing:
        raise UsageError(
            f"{existing[0]} is a file or directory: add --out DIR to encode it as a corpus "
            "(without --out, the arguments are tokenized as text)"
        )
    text = text_arg(" ".join(s.inputs))
    tok = resolve_tokenizer(s.tokenizer or "gpt2", text)
    ids = tok.encode_prompt(text)
    pieces = [tok.token_bytes(i) for i in ids]
    if s.json_out:
        render.print_json(
            {
                "tokenizer": tok.name,
                "ids": ids,
                "pieces": [tok.piece(i) for i in ids],
                "bytes": [b.hex() for b in pieces],  # exact, also for pieces of a character
            }
        )
    else:
        render.token_table(tok.name, tok.vocab_size, text, ids, pieces)


def _encode_corpus(s: TokenizeSettings, out: Path) -> None:
    from gptcli.data.corpus import collect_files, tokenize_corpus
    from gptcli.data.sources import Reader
    from gptcli.store.layout import refuse_inside_checkpoints

    refuse_inside_checkpoints(out, "tokenize into a directory of its own", runs="itself")
    tok: str | Tokenizer = s.tokenizer or "char"
    if is_path(tok):
        tok = resolve_tokenizer(tok)
    total = sum(f.stat().st_size for f in collect_files(s.inputs, exclude=out))
    with render.byte_progress("tokenizing", total, show=total > 4 << 20) as update:
        report = tokenize_corpus(
            s.inputs,
            out,
            tok,
            val_fraction=s.val_fraction,
            force=s.force,
            progress=update,
            reader=Reader(s.text_column),
        )
    if s.json_out:
        from dataclasses import asdict

        render.print_json({**asdict(report), "out": str(out)})
    else:
        render.tokenize_summary(report, str(out))
