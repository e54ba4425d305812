"""`gptcli beam`: beam search for the likeliest continuations, with their scores. Its flags
are config.verbs.BeamSettings."""

from __future__ import annotations

from dataclasses import asdict

from gptcli.cli import render
from gptcli.cli.common import (
    check_decoding_fits,
    choose_decoding,
    load_model,
    text_arg,
    warn_if_cut,
)
from gptcli.config.verbs import BeamSettings
from gptcli.errors import UsageError


def beam(s: BeamSettings) -> None:
    """Search for the likeliest continuations with beam search.

    Keeps the B best partial hypotheses by total log-probability; one that emits the end
    token (end-of-text, an --eos token, or a --stop text) is set aside as finished; stops when
    B are finished or at --max-new-tokens, and ranks them by sum(log p) / length^alpha.

    gptcli beam "The rabbit" --beams 4
    gptcli beam "The fox dug a" --beams 8 --n-best 3 --eos . --length-penalty 0.6
    """
    from gptcli.infer.completion import beam_complete, encode_prompt, end_token_ids

    n_best = s.beams if s.n_best is None else s.n_best
    loaded = load_model(s.ckpt, s.device, s.dtype, base=s.base, quantize=s.quantize, decoding=True)
    tok, block = loaded.tokenizer, loaded.model.config.block_size
    new_tokens = min(40, block // 2) if s.max_new_tokens is None else s.max_new_tokens
    if new_tokens >= block:
        raise UsageError(f"--max-new-tokens must be below the model's block_size {block}, got {new_tokens}")
    p = encode_prompt(tok, text_arg(s.prompt, "the prompt"), block - new_tokens)
    warn_if_cut(p, f"the model's block_size {block} less the {new_tokens} new tokens")
    check_decoding_fits(loaded.model, s.beams, f"--beams {s.beams}", len(p.ids) + new_tokens)
    end_ids = end_token_ids(tok, s.eos)  # (each --eos one token, checked before anything starts)
    compiled = choose_decoding(s.compile, loaded)
    hyps = beam_complete(
        loaded.model,
        tok,
        p,
        beams=s.beams,
        max_new_tokens=new_tokens,
        length_penalty=s.length_penalty,
        end_ids=end_ids,
        stops=s.stop,
        no_repeat_ngram=s.no_repeat_ngram,
        compile=compiled,
    )
    rows = [asdict(h) for h in hyps[:n_best]]
    if s.json_out:
        render.print_json({"prompt": p.text, "prompt_ids": p.ids, "hypotheses": rows})
    else:
        render.beam_table(p.text, rows)
