"""`gptcli beam`: beam search for the likeliest continuations, with their scores."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from gptcli.cli import render
from gptcli.cli.common import (
    Base,
    Ckpt,
    DecodeCompile,
    Device,
    Dtype,
    Json,
    check_decoding_fits,
    decode_compiled,
    load_model,
    text_arg,
    warn_if_cut,
)
from gptcli.config import BeamConfig
from gptcli.errors import UsageError


def beam(
    prompt: Annotated[str, typer.Argument(help="Text to continue.", show_default=False)],
    ckpt: Ckpt = None,
    base: Base = None,
    compile: DecodeCompile = None,
    beams: Annotated[int, typer.Option("--beams", "-b", help="Hypotheses kept at every step (B).")] = 4,
    max_new_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-new-tokens",
            "-n",
            help="Longest continuation (default: 40, or half the context if shorter).",
        ),
    ] = None,
    length_penalty: Annotated[
        float,
        typer.Option(
            "--length-penalty",
            help="alpha in sum(log p) / length^alpha: 1 = mean log-likelihood, 0 = plain sum.",
        ),
    ] = 1.0,
    n_best: Annotated[
        int | None,
        typer.Option("--n-best", help="Hypotheses to show, at most B (default: B).", show_default=False),
    ] = None,
    no_repeat_ngram: Annotated[
        int, typer.Option("--no-repeat-ngram", help="Forbid repeating any n-gram of this size (0 = off).")
    ] = 0,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Text that ends a hypothesis (repeatable).")
    ] = None,
    eos: Annotated[
        list[str] | None,
        typer.Option("--eos", help="A token, given as its text, that ends a hypothesis (repeatable)."),
    ] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: Json = False,
) -> None:
    """Search for the likeliest continuations with beam search.

    Keeps the B best partial hypotheses by total log-probability; one that emits the end
    token (end-of-text, an --eos token, or a --stop text) is set aside as finished; stops when
    B are finished or at --max-new-tokens, and ranks them by sum(log p) / length^alpha.

    gptcli beam "The rabbit" --beams 4
    gptcli beam "The fox dug a" --beams 8 --n-best 3 --eos . --length-penalty 0.6
    """
    from gptcli.infer.completion import beam_complete, encode_prompt

    BeamConfig(beams, max_new_tokens, length_penalty, n_best, no_repeat_ngram).validate()
    n_best = beams if n_best is None else n_best

    loaded = load_model(ckpt, device, dtype, decode=compile is None, base=base)
    tok, block = loaded.tokenizer, loaded.model.config.block_size
    if max_new_tokens is None:
        max_new_tokens = min(40, block // 2)
    if max_new_tokens >= block:
        raise UsageError(
            f"--max-new-tokens must be below the model's block_size {block}, got {max_new_tokens}"
        )
    p = encode_prompt(tok, text_arg(prompt, "the prompt"), block - max_new_tokens)
    warn_if_cut(p, f"the model's block_size {block} less the {max_new_tokens} new tokens")
    check_decoding_fits(loaded.model, beams, f"--beams {beams}", len(p.ids) + max_new_tokens)
    hyps = beam_complete(
        loaded.model,
        tok,
        p,
        beams=beams,
        max_new_tokens=max_new_tokens,
        length_penalty=length_penalty,
        eos=eos or [],
        stops=stop or [],
        no_repeat_ngram=no_repeat_ngram,
        compile=decode_compiled(compile, loaded),
    )
    rows = [asdict(h) for h in hyps[:n_best]]
    if json_out:
        render.print_json({"prompt": p.text, "prompt_ids": p.ids, "hypotheses": rows})
    else:
        render.beam_table(p.text, rows)
