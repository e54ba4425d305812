"""`gptcli export`: write a checkpoint in another tool's format (Hugging Face GPT-2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptcli.cli import render
from gptcli.cli.common import Json
from gptcli.errors import UsageError


def export(
    ckpt: Annotated[
        str, typer.Argument(help="A run dir, checkpoint dir, GPT-2 dir or hub name.", show_default=False)
    ],
    out: Annotated[Path, typer.Argument(help="The directory to write.", show_default=False)],
    to: Annotated[str, typer.Option("--to", help="Target format: hf (Hugging Face GPT2LMHeadModel).")] = "hf",
    force: Annotated[
        bool, typer.Option("--force", help="Write into an existing, non-empty directory.")
    ] = False,
    json_out: Json = False,
) -> None:
    """Export a model for other tools.

    gptcli export runs/demo --to hf exported/      then GPT2LMHeadModel.from_pretrained("exported")
    """
    from gptcli import loading
    from gptcli.hf import export_hf

    if to != "hf":
        raise UsageError(f"--to {to!r}: the only export format is hf (Hugging Face GPT-2)")
    from gptcli.checkpoint import holds_checkpoints

    if holds_checkpoints(out):
        raise UsageError(f"{out} is a gptcli run or checkpoint; export into a directory of its own")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise UsageError(f"{out} exists and is not empty; choose another directory or pass --force")
    loaded = loading.load(ckpt)
    if loaded.model.config.n_classes:
        render.warning(
            "the classification head is not part of GPT-2's format; only the language model is exported"
        )
    written = export_hf(loaded.model, loaded.tokenizer, out)
    if json_out:
        render.print_json({"out": str(out), "format": to, "files": list(written)})
        return
    render.info(f"wrote {out}: {', '.join(written)}")
    render.info(f'load it with: transformers.GPT2LMHeadModel.from_pretrained("{out}")')
