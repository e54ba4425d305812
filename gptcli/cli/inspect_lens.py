"""`gptcli inspect-lens`: the logit lens, what the model would predict after each layer."""

from __future__ import annotations

from pathlib import Path

from gptcli.cli import figures, render
from gptcli.cli.common import check_save, load_model, save_document, text_arg, warn_if_cut, weights_of
from gptcli.config.verbs import InspectLensSettings
from gptcli.errors import UsageError


def _positions(value: str, n: int) -> list[int]:
    """--position: an index (negative counts from the end, -1 the last token) or all."""
    v = value.strip().lower()
    if v == "all":
        return list(range(n))
    try:
        i = int(v)
    except ValueError:
        raise UsageError(f"--position takes N (-1 for the last token) or all, got {value!r}") from None
    if not -n <= i < n:
        raise UsageError(f"--position {i}: the prompt has {n} tokens, numbered 0 to {n - 1} (or -1 to -{n})")
    return [i % n]


def _track_id(tok, text: str) -> int:
    """The one token --track names."""
    from gptcli.data.tokenizer import CharTokenizer

    if isinstance(tok, CharTokenizer) and len(text) == 1 and text not in tok.stoi:
        raise UsageError(f"--track {text!r}: not a character this model knows")
    ids = tok.encode_prompt(text)
    if len(ids) != 1:
        pieces = ", ".join(repr(tok.piece(i)) for i in ids)
        raise UsageError(f"--track {text!r} is {len(ids)} tokens ({pieces}); give a single token")
    return ids[0]


def inspect_lens(s: InspectLensSettings) -> None:
    """Show what the model would predict after each layer (the logit lens).

    gptcli inspect-lens "The rabbit dug a"                       every layer, every position
    gptcli inspect-lens "The rabbit dug a" --track " hole"       when does " hole" win?
    gptcli inspect-lens "The rabbit dug a" --save lens.html      hover the cells in a browser
    """
    from gptcli.infer.completion import encode_prompt
    from gptcli.inspect.lens import logit_lens

    check_save(s.save, s.force)
    if not s.prompt:
        raise UsageError("give a prompt to look at")
    if s.track == "":
        raise UsageError("--track needs a token, e.g. --track ' hole'")
    prompt = text_arg(s.prompt, "the prompt")
    loaded = load_model(s.ckpt, s.device, s.dtype, base=s.base, quantize=s.quantize)
    tok, cfg = loaded.tokenizer, loaded.model.config
    track_id = None if s.track is None else _track_id(tok, text_arg(s.track, "--track"))
    p = encode_prompt(tok, prompt, cfg.block_size)
    warn_if_cut(p, f"the model's block_size {cfg.block_size}")
    positions = _positions(s.position, len(p.ids))

    lens = logit_lens(loaded.model, p.ids, positions, s.top_k, vocab_size=tok.vocab_size, track=track_id)
    document = {**_document(tok, p.text, p.ids, lens, track_id), **weights_of(loaded.model, s.quantize)}
    if s.save is not None:

        def png(path: Path, replace: bool) -> bool:
            visible = lambda token: render.visible_piece(token.encode("utf-8"))  # noqa: E731
            return figures.save_lens_png(path, document, visible, replace=replace)

        save_document(s.save, document, s.force, figures.save_lens_html, png)
    if s.json_out:
        render.print_json(document)
        return

    pieces = [render.visible_piece(tok.token_bytes(i)) for i in p.ids]
    show = [[[(render.visible_piece(tok.token_bytes(i)), pr) for i, pr in zip(ids, probs, strict=True)]
             for ids, probs in zip(layer_ids.tolist(), layer_probs.tolist(), strict=True)]
            for layer_ids, layer_probs in zip(lens.ids, lens.probs, strict=True)]  # fmt: skip
    tracked = None
    if track_id is not None:
        tracked = (
            render.visible_piece(tok.token_bytes(track_id)),
            [row[-1] for row in lens.track_probs.tolist()],
            [row[-1] for row in lens.track_ranks.tolist()],
        )
    render.lens_grid([pieces[i] for i in positions], positions, show)
    render.lens_table(pieces[positions[-1]], positions[-1], [layer[-1] for layer in show], tracked)
    if s.save is not None:
        render.info(f"saved {s.save}")


def _document(tok, text: str, ids: list[int], lens, track_id: int | None) -> dict:
    """What --json prints and --save writes: lens[layer][position] -> the top-k."""

    def top(row_ids: list[int], row_probs: list[float]) -> list[dict]:
        return [{"token": tok.piece(i), "id": i, "prob": p} for i, p in zip(row_ids, row_probs, strict=True)]

    document = {
        "prompt": text,
        "tokens": [tok.piece(i) for i in ids],
        "ids": ids,
        "positions": lens.positions,
        "lens": [
            [top(row_ids, row_probs) for row_ids, row_probs in zip(layer_ids, layer_probs, strict=True)]
            for layer_ids, layer_probs in zip(lens.ids.tolist(), lens.probs.tolist(), strict=True)
        ],
    }
    if track_id is not None:
        document["track"] = {
            "token": tok.piece(track_id),
            "id": track_id,
            "prob": lens.track_probs.tolist(),
            "rank": lens.track_ranks.tolist(),
        }
    return document
