"""`gptcli sample`: generate text from a trained model, optionally showing the top-k
next-token probabilities at every step. Its flags are config.verbs.SampleSettings."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import typer

from gptcli.cli import render
from gptcli.cli.common import (
    check_decoding_fits,
    choose_decoding,
    load_model,
    text_arg,
    warn_if_cut,
)
from gptcli.config.verbs import SampleSettings

if TYPE_CHECKING:
    from gptcli.data.tokenizer import Tokenizer
    from gptcli.infer.completion import Prompt, Sampled, TopK


def sample(s: SampleSettings) -> None:
    """Generate text from a trained model.

    gptcli sample                                      newest run, start of a document
    gptcli sample --prompt "The rabbit dug a" --show-probs 5 -n 3
    gptcli sample --ckpt runs/shakes --temp 0.8 --top-k 200 --num-samples 3
    """
    from gptcli.data.inputs import check_prompt_file, read_prompt_file
    from gptcli.infer.completion import complete, encode_prompt
    from gptcli.infer.generate import Sampling

    sampling = Sampling(s.temp, s.top_k, s.top_p)
    if s.prompt is not None:
        text_arg(s.prompt, "--prompt")
    if s.prompt_file is not None:
        check_prompt_file(s.prompt_file)
    loaded = load_model(s.ckpt, s.device, s.dtype, base=s.base, quantize=s.quantize, decoding=True)
    check_decoding_fits(loaded.model, s.num_samples, f"--num-samples {s.num_samples}")
    tok, block = loaded.tokenizer, loaded.model.config.block_size
    text = s.prompt
    if s.prompt_file is not None:  # enough bytes for a full context, and a little more
        text, cut = read_prompt_file(s.prompt_file, (block + 16) * tok.max_token_bytes)
        if cut:
            render.warning(cut)
    p = encode_prompt(tok, text, block)
    warn_if_cut(p, f"the model's block_size {block}")
    live = (render.out.is_terminal if s.stream is None else s.stream) and not s.json_out
    streaming = live and s.num_samples == 1 and not s.show_probs
    if s.stream and not streaming:
        why = "--json" if s.json_out else "--show-probs" if s.show_probs else f"--num-samples {s.num_samples}"
        render.warning(f"--stream shows one sample as it is generated: with {why}, each is shown when done")
    compiled = choose_decoding(s.compile, loaded)
    if streaming:
        render.stream_text(p.text, style="dim")
    results = complete(
        loaded.model,
        tok,
        p,
        max_new_tokens=s.max_new_tokens,
        num_samples=s.num_samples,
        sampling=sampling,
        seed=s.seed,
        stops=s.stop,
        show_probs=s.show_probs,
        compile=compiled,
        on_text=(lambda i, delta: render.stream_text(delta, style="bold")) if streaming else None,
        interruptible=True,  # Ctrl-C: what was generated so far is shown, then the exit status 130
    )
    if s.json_out:
        render.print_json(_document(tok, p, results, s.show_probs))
    elif streaming:
        render.stream_text("\n")
    else:
        for i, r in enumerate(results):
            render.sample_text(p.text, r.text, index=i + 1 if s.num_samples > 1 else None)
            if s.show_probs:
                _show_steps(tok, p.ids, r, sampling.describe())
    if any(r.finish == "interrupted" for r in results):
        each = " a sample" if len(results) > 1 else ""
        render.warning(f"interrupted after {max(len(r.ids) for r in results):,} tokens{each}")
        raise typer.Exit(130)


def _document(tok: Tokenizer, p: Prompt, results: list[Sampled], show_probs: int) -> dict[str, Any]:
    """What --json prints."""
    return {
        "prompt": p.text,
        "prompt_ids": p.ids,
        "samples": [
            {
                "text": r.text, "ids": r.ids, "finish": r.finish,
                **({"top_k": [top_k_json(tok, step) for step in r.steps]} if show_probs else {}),
            }
            for r in results
        ],
    }  # fmt: skip


def top_k_json(tok: Tokenizer, step: TopK) -> dict[str, Any]:
    """One step of --show-probs for --json: p, and q where sampling reshaped it."""

    def entry(i: int, p: float, q: float | None) -> dict[str, Any]:
        return {"id": i, "token": tok.piece(i), "prob": p, **({"q": q} if q is not None else {})}

    qs = step.q if step.q is not None else [None] * len(step.ids)
    return {
        "chosen": entry(step.chosen, step.chosen_prob, step.chosen_q),
        "candidates": [entry(i, p, q) for i, p, q in zip(step.ids, step.probs, qs, strict=True)],
    }


def _show_steps(tok: Tokenizer, prompt_ids: list[int], result: Sampled, sampling: str) -> None:
    """One probability table per generated token: the lecture's 'The rabbit dug a -> hole 0.45'."""
    context = list(prompt_ids)
    for step in result.steps:
        show_step(tok, tok.decode(context), step, sampling)
        context.append(step.chosen)


def show_step(tok: Tokenizer, context: str, step: TopK, sampling: str) -> None:
    """The probability table of one step after the text context: the k likeliest tokens and
    the chosen one (sampling: how the distribution was reshaped, shown where it was)."""
    qs = step.q if step.q is not None else [None] * len(step.ids)
    rows = [
        (rank, render.visible_piece(tok.token_bytes(i)), p, i == step.chosen, q)
        for rank, (i, p, q) in enumerate(zip(step.ids, step.probs, qs, strict=True), 1)
    ]
    if step.chosen not in step.ids:
        piece = render.visible_piece(tok.token_bytes(step.chosen))
        rows.append((step.chosen_rank, piece, step.chosen_prob, True, step.chosen_q))
    render.probs_table(context, rows, sampling=sampling if step.q is not None else None)
