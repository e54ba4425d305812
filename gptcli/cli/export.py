"""`gptcli export`: write a checkpoint in another tool's format (Hugging Face GPT-2)."""

from __future__ import annotations

from pathlib import Path

from gptcli.cli import render
from gptcli.config.verbs import ExportSettings
from gptcli.errors import UsageError
from gptcli.messages import quote


def export(s: ExportSettings) -> None:
    """Export a model for other tools.

    gptcli export runs/demo --to hf exported/      then GPT2LMHeadModel.from_pretrained("exported")
    gptcli export runs/lora adapters/ --adapters-only    then PeftModel.from_pretrained(base, "adapters")
    """
    from gptcli.store import loading
    from gptcli.store.hf import export_hf

    ckpt, out, base = s.ckpt, s.out, s.base
    if s.to != "hf":
        raise UsageError(f"--to {quote(s.to)}: the only export format is hf (Hugging Face GPT-2)")
    from gptcli.store.checkpoint import holds_checkpoints

    if holds_checkpoints(out):
        raise UsageError(f"{out} is a gptcli run or checkpoint; export into a directory of its own")
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not s.force:
        raise UsageError(f"{out} exists and is not empty; choose another directory or pass --force")
    if s.adapters_only:
        _export_adapters(ckpt, out, base, s.json_out)
        return
    loaded = loading.load(ckpt, base=base)  # a LoRA run: merged into its base
    if loaded.model.config.n_classes:
        render.warning(
            "the classification head is not part of GPT-2's format; only the language model is exported"
        )
    written = export_hf(loaded.model, loaded.tokenizer, out)
    if s.json_out:
        render.print_json({"out": str(out), "format": s.to, "files": list(written)})
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
    if loaded.meta.get("added_tokens"):
        raise UsageError(
            "--adapters-only: this run added the chat template's tokens to its base, and their "
            "embedding rows have no place in PEFT's adapters; export the merged model without --adapters-only"
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
