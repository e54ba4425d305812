"""`gptcli sample`: generate text from a trained model, optionally showing the top-k
next-token probabilities at every step."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from gptcli.cli import render
from gptcli.cli.common import (
    Base,
    Ckpt,
    DecodeCompile,
    Device,
    Dtype,
    Json,
    Seed,
    check_decoding_fits,
    decode_compiled,
    load_model,
    text_arg,
    warn_if_cut,
)
from gptcli.config import SampleConfig
from gptcli.errors import UsageError

if TYPE_CHECKING:
    from gptcli.data.tokenizer import Tokenizer
    from gptcli.infer.completion import Sampled, TopK


def check_prompt(prompt: str | None, prompt_file: Path | None) -> None:
    """Refuse a bad --prompt / --prompt-file before the model is loaded."""
    if prompt is not None and prompt_file is not None:
        raise UsageError("give --prompt or --prompt-file, not both")
    if prompt is not None:
        text_arg(prompt, "--prompt")
    if prompt_file is not None:
        if not prompt_file.exists():
            raise UsageError(f"--prompt-file {prompt_file}: no such file")
        if prompt_file.is_dir():
            raise UsageError(f"--prompt-file {prompt_file}: a directory, not a file")


def read_prompt(prompt_file: Path, limit: int) -> str:
    """The text of a prompt file: at most its last `limit` bytes (the model sees only its
    last block_size tokens), and from a device or pipe at most its first `limit`."""
    offset = 0  # where in the file the bytes read start
    try:
        with open(prompt_file, "rb") as f:
            if stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # the file itself, also behind a link
                size = os.fstat(f.fileno()).st_size
                f.seek(max(0, size - limit))
                data = f.read(limit)
                if size > limit:
                    data = data.lstrip(bytes(range(0x80, 0xC0)))  # start on a whole character
                    render.warning(
                        f"--prompt-file {prompt_file} is {size:,} bytes; read its last {len(data):,}, "
                        "more than the model's context holds"
                    )
                offset = size - len(data)
            else:
                data = f.read(limit + 1)
                if len(data) > limit:
                    data = data[:limit]
                    render.warning(
                        f"--prompt-file {prompt_file} is not a plain file; read its first {limit:,} bytes"
                    )
    except OSError as e:
        raise UsageError(f"--prompt-file {prompt_file}: {e.strerror or e}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        if e.start >= len(data) - 3 and e.reason == "unexpected end of data":  # cut mid-character
            return data[: e.start].decode("utf-8")
        raise UsageError(
            f"--prompt-file {prompt_file}: not UTF-8 text (byte offset {offset + e.start})"
        ) from None


def sample(
    ckpt: Ckpt = None,
    base: Base = None,
    compile: DecodeCompile = None,
    prompt: Annotated[
        str | None, typer.Option("--prompt", "-p", help="Text to continue (default: start of a document).")
    ] = None,
    prompt_file: Annotated[
        Path | None, typer.Option("--prompt-file", help="Read the prompt from a file.")
    ] = None,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Tokens to generate.")] = 200,
    num_samples: Annotated[
        int, typer.Option("--num-samples", help="Continuations, decoded as one batch.")
    ] = 1,
    temp: Annotated[
        float, typer.Option("--temp", help="Temperature: sample from q ∝ p^(1/temp); 0 = greedy (argmax).")
    ] = 1.0,
    top_k: Annotated[
        int | None, typer.Option("--top-k", help="Sample only among the k likeliest tokens.")
    ] = None,
    top_p: Annotated[
        float | None, typer.Option("--top-p", help="Sample only within the smallest set of mass top-p.")
    ] = None,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="End a continuation at this text (repeatable).")
    ] = None,
    stream: Annotated[
        bool | None,
        typer.Option("--stream/--no-stream", help="Print tokens as they come (default: on in a terminal)."),
    ] = None,
    show_probs: Annotated[
        int,
        typer.Option("--show-probs", help="After each step, show the K likeliest next tokens.", metavar="K"),
    ] = 0,
    seed: Seed = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: Json = False,
) -> None:
    """Generate text from a trained model.

    gptcli sample                                      newest run, start of a document
    gptcli sample --prompt "The rabbit dug a" --show-probs 5 -n 3
    gptcli sample --ckpt runs/shakes --temp 0.8 --top-k 200 --num-samples 3
    """
    from gptcli.infer.completion import complete, encode_prompt
    from gptcli.infer.generate import Sampling

    SampleConfig(temp, top_k, top_p, max_new_tokens, num_samples, show_probs, seed).validate()
    sampling = Sampling(temp, top_k, top_p)
    check_prompt(prompt, prompt_file)
    loaded = load_model(ckpt, device, dtype, decode=compile is None, base=base)
    check_decoding_fits(loaded.model, num_samples, f"--num-samples {num_samples}")
    tok = loaded.tokenizer
    text = prompt
    if prompt_file is not None:  # enough bytes for a full context, and a little more
        text = read_prompt(prompt_file, (loaded.model.config.block_size + 16) * tok.max_token_bytes)
    p = encode_prompt(tok, text, loaded.model.config.block_size)
    warn_if_cut(p, f"the model's block_size {loaded.model.config.block_size}")
    live = (render.out.is_terminal if stream is None else stream) and not json_out
    streaming = live and num_samples == 1 and not show_probs
    if streaming:
        render.stream_text(p.text, style="dim")

    results = complete(
        loaded.model,
        tok,
        p,
        max_new_tokens=max_new_tokens,
        num_samples=num_samples,
        sampling=sampling,
        seed=seed,
        stops=stop or [],
        show_probs=show_probs,
        on_text=(lambda i, delta: render.stream_text(delta, style="bold")) if streaming else None,
        compile=decode_compiled(compile, loaded),
    )

    if json_out:
        render.print_json(
            {
                "prompt": p.text,
                "prompt_ids": p.ids,
                "samples": [
                    {
                        "text": r.text,
                        "ids": r.ids,
                        "finish": r.finish,
                        **({"top_k": [_top_k_json(tok, s) for s in r.steps]} if show_probs else {}),
                    }
                    for r in results
                ],
            }
        )
        return
    if streaming:
        render.stream_text("\n")
        return
    how = sampling.describe()
    for i, r in enumerate(results):
        render.sample_text(p.text, r.text, index=i + 1 if num_samples > 1 else None)
        if show_probs:
            _show_steps(tok, p.ids, r, how)


def _top_k_json(tok: Tokenizer, step: TopK) -> dict[str, Any]:
    """One step of --show-probs for --json: p, and q where sampling reshaped it."""

    def entry(i: int, p: float, q: float | None) -> dict[str, Any]:
        return {"id": i, "token": tok.piece(i), "prob": p, **({"q": q} if q is not None else {})}

    qs = step.q if step.q is not None else [None] * len(step.ids)
    return {
        "chosen": entry(step.chosen, step.chosen_prob, step.chosen_q),
        "candidates": [entry(i, p, q) for i, p, q in zip(step.ids, step.probs, qs, strict=True)],
    }


def _show_steps(tok: Tokenizer, prompt_ids: list[int], result: Sampled, how: str) -> None:
    """One probability table per generated token: the lecture's 'The rabbit dug a -> hole 0.45'."""
    context = list(prompt_ids)
    for step in result.steps:
        qs = step.q if step.q is not None else [None] * len(step.ids)
        rows = [
            (rank, render.visible_piece(tok.token_bytes(i)), p, i == step.chosen, q)
            for rank, (i, p, q) in enumerate(zip(step.ids, step.probs, qs, strict=True), 1)
        ]
        if step.chosen not in step.ids:
            piece = render.visible_piece(tok.token_bytes(step.chosen))
            rows.append((step.chosen_rank, piece, step.chosen_prob, True, step.chosen_q))
        render.probs_table(tok.decode(context), rows, sampling=how if step.q is not None else None)
        context.append(step.chosen)
