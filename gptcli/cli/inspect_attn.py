"""`gptcli inspect-attn`: the masked self-attention of every layer and head for a prompt,
and the top-k next-token probabilities after it."""

from __future__ import annotations

from pathlib import Path

from gptcli.cli import figures, render
from gptcli.cli.common import check_save, load_model, save_document, text_arg, warn_if_cut, weights_of
from gptcli.config.verbs import InspectAttnSettings
from gptcli.errors import UsageError


def _pick(value: str, n: int, what: str, allow_mean: bool) -> list[int] | str:
    """--layer / --head: an index, `all`, or (heads) `mean`."""
    v = value.strip().lower()
    if v == "all":
        return list(range(n))
    if v == "mean" and allow_mean:
        return "mean"
    try:
        i = int(v)
    except ValueError:
        choices = "N, all or mean" if allow_mean else "N or all"
        raise UsageError(f"--{what} takes {choices}, got {value!r}") from None
    if not 0 <= i < n:
        raise UsageError(f"--{what} {i}: the model has {n} {what}s, numbered 0 to {n - 1}")
    return [i]


def inspect_attn(s: InspectAttnSettings) -> None:
    """Show what every attention head looks at, and what the model predicts next.

    gptcli inspect-attn "The rabbit dug a"                       all heads, small
    gptcli inspect-attn "The rabbit dug a" --layer 3 --head 1    one head, large, with weights
    gptcli inspect-attn "The rabbit dug a" --save attn.html      open it in a browser
    """
    from gptcli.infer.completion import encode_prompt
    from gptcli.inspect.attention import capture

    check_save(s.save, s.force)
    if not s.prompt:
        raise UsageError("give a prompt to look at")
    prompt = text_arg(s.prompt, "the prompt")
    loaded = load_model(s.ckpt, s.device, s.dtype, base=s.base, quantize=s.quantize)
    tok, cfg = loaded.tokenizer, loaded.model.config
    layers = _pick(s.layer, cfg.n_layer, "layer", allow_mean=False)
    heads = _pick(s.head, cfg.n_head, "head", allow_mean=True)
    p = encode_prompt(tok, prompt, cfg.block_size)
    warn_if_cut(p, f"the model's block_size {cfg.block_size}")

    maps = capture(loaded.model, p.ids, vocab_size=tok.vocab_size)
    ids, probs = maps.top_k(s.top_k)
    if s.save is not None or s.json_out:
        document = {
            "prompt": p.text,
            "tokens": [tok.piece(i) for i in p.ids],
            "ids": p.ids,
            "attention": maps.attention.tolist(),
            "top_k": [{"token": tok.piece(i), "id": i, "prob": pr} for i, pr in zip(ids, probs, strict=True)],
            **weights_of(loaded.model, s.quantize),
        }
        if s.save is not None:
            _save(s.save, document, maps, layers, heads, s.force)
        if s.json_out:
            render.print_json(document)
            return

    pieces = [render.visible_piece(tok.token_bytes(i)) for i in p.ids]
    selected = maps.select(layers, heads)  # (L', H', T, T)
    head_names = ["mean"] if heads == "mean" else [str(h) for h in heads]
    if selected.shape[0] * selected.shape[1] == 1:
        title = f"layer {layers[0]}, {'mean of heads' if heads == 'mean' else f'head {heads[0]}'}"
        render.attention_heatmap(pieces, selected[0, 0].tolist(), title)
    else:
        render.token_labels(pieces)
        render.attention_grid(
            pieces,
            [
                (f"L{layer_i} H{name}", selected[i, j].tolist())
                for i, layer_i in enumerate(layers)
                for j, name in enumerate(head_names)
            ],
        )
    rows = [
        (rank, render.visible_piece(tok.token_bytes(i)), pr, False)
        for rank, (i, pr) in enumerate(zip(ids, probs, strict=True), 1)
    ]
    render.probs_table(p.text, rows)
    if s.save is not None:
        render.info(f"saved {s.save}")


def _save(path: Path, document: dict, maps, layers: list[int], heads: list[int] | str, force: bool) -> None:
    names = ["mean"] if heads == "mean" else [str(h) for h in heads]
    labels = [render.visible_piece(t.encode("utf-8")) for t in document["tokens"]]

    def png(path: Path, replace: bool) -> bool:
        return figures.save_attention_png(
            path, labels, maps.select(layers, heads).tolist(), layers, names, replace
        )

    save_document(path, document, force, figures.save_attention_html, png)
