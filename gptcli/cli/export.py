"""`gptcli export`: write a checkpoint in another tool's format (Hugging Face GPT-2)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptcli.cli import render
from gptcli.cli.common import Base, Json
from gptcli.errors import UsageError


def export(
    ckpt: Annotated[
        str, typer.Argument(help="A run dir, checkpoint dir, GPT-2 dir or hub name.", show_default=False)
    ],
    out: Annotated[Path, typer.Argument(help="The directory to write.", show_default=False)],
    to: Annotated[str, typer.Option("--to", help="Target format: hf (Hugging Face GPT2LMHeadModel).")] = "hf",
    adapters_only: Annotated[
        bool,
        typer.Option(
            "--adapters-only",
            help="A LoRA run: its adapters alone, in PEFT's format (adapter_config.json, "
            "adapter_model.safetensors), not the merged model.",
        ),
    ] = False,
    base: Base = None,
    force: Annotated[
        bool, typer.Option("--force", help="Write into an existing, non-empty directory.")
    ] = False,
    json_out: Json = False,
) -> None:
    """Export a model for other tools.

    gptcli export runs/demo --to hf exported/      then GPT2LMHeadModel.from_pretrained("exported")
    gptcli export runs/lora adapters/ --adapters-only    then PeftModel.from_pretrained(base, "adapters")
    """
    from gptcli.store import loading
    from gptcli.store.hf import export_hf

    if to != "hf":
        raise UsageError(f"--to {to!r}: the only export format is hf (Hugging Face GPT-2)")
    from gptcli.store.checkpoint import holds_checkpoints

    if holds_checkpoints(out):
        raise UsageError(f"{out} is a gptcli run or checkpoint; export into a directory of its own")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise UsageError(f"{out} exists and is not empty; choose another directory or pass --force")
    if adapters_only:
        _export_adapters(ckpt, out, base, json_out)
        return
    loaded = loading.load(ckpt, base=base)  # a LoRA run: merged into its base
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


def _export_adapters(ckpt: str, out: Path, base: Path | None, json_out: bool) -> None:
    from gptcli import lora
    from gptcli.store import loading
    from gptcli.store.hf import export_peft

    loaded = loading.load(ckpt, base=base, merge=False)
    settings = lora.LoRASettings.of(loaded.meta)
    if settings is None:
        raise UsageError(f"--adapters-only: {loaded.path} is not a LoRA run (finetune --lora-rank makes one)")
    if loaded.model.config.n_classes:
        raise UsageError(
            "--adapters-only: PEFT's format holds a language model's adapters, and this run's "
            "classification head has no place in it; export the merged model without --adapters-only"
        )
    written = export_peft(loaded.model, settings, str(loaded.meta.get("base", "")), out)
    if json_out:
        render.print_json({"out": str(out), "format": "peft", "files": written})
        return
    render.info(f"wrote {out}: {', '.join(written)}")
    render.info(
        f'load it with: peft.PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(BASE), "{out}"), '
        f"BASE being {loaded.meta.get('base')} in Hugging Face's format (gptcli export BASE --to hf DIR)"
    )
