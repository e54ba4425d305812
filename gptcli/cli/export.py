"""`gptcli export`: write a checkpoint in another tool's format (Hugging Face GPT-2, GGUF)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gptcli import files
from gptcli.cli import render
from gptcli.config.verbs import ExportSettings
from gptcli.errors import UsageError


def export(s: ExportSettings) -> None:
    """Export a model for other tools.

    gptcli export runs/demo --to hf exported/      then GPT2LMHeadModel.from_pretrained("exported")
    gptcli export runs/gpt2-ft model.gguf          then llama-cli -m model.gguf (llama.cpp, ollama, LM Studio)
    gptcli export runs/gpt2-ft model.gguf --outtype q8_0     8-bit weights, a quarter of f32's size
    gptcli export runs/lora adapters/ --adapters-only    then PeftModel.from_pretrained(base, "adapters")
    """
    named_gguf = s.out.name.lower().endswith(".gguf")  # (".gguf" alone has no suffix, for pathlib)
    to = s.to or ("gguf" if named_gguf else "hf")
    if to == "hf" and named_gguf:
        raise UsageError(f"--to hf writes a directory, not {s.out}; drop --to (or use --to gguf)")
    if s.outtype is not None and to != "gguf":
        raise UsageError("--outtype goes with --to gguf (a Hugging Face export keeps float32 weights)")
    if to == "gguf":
        _export_gguf(s)
        return
    from gptcli.store import loading
    from gptcli.store.hf import export_hf

    ckpt, out, base = s.ckpt, s.out, s.base
    from gptcli.store.layout import refuse_inside_checkpoints

    refuse_inside_checkpoints(out, "export into a directory of its own", runs="inside")
    if out.is_symlink():  # (written through, it would put the files wherever the link points)
        raise UsageError(f"{out} is a symbolic link; export into a directory of its own")
    files.check_under_directories(out)  # (notes.txt/x)
    if out.exists() and not out.is_dir():  # (--force replaces an export's files, never a file by a directory)
        raise UsageError(f"{out} is a file; a Hugging Face export writes a directory: give a directory name")
    if out.exists() and any(out.iterdir()) and not s.force:
        raise UsageError(f"{out} exists and is not empty; choose another directory or pass --force")
    if s.adapters_only:
        if base is not None:
            render.warning("--base is not used: --adapters-only writes the run's adapters alone")
        _export_adapters(ckpt, out, s.json_out)
        return
    loaded = loading.load(ckpt, base=base)  # a LoRA run: merged into its base
    _warn_head(loaded)
    written = export_hf(loaded.model, loaded.tokenizer, out)
    if s.json_out:
        render.print_json({"out": str(out), "format": to, "files": list(written)})
        return
    render.info(f"wrote {out}: {', '.join(written)}")
    render.info(f'load it with: transformers.GPT2LMHeadModel.from_pretrained("{out}")')


def _warn_head(loaded: Any) -> None:
    if loaded.model.config.n_classes:
        render.warning(
            "the classification head has no place in the exported model; only the language model is written"
        )


def _export_gguf(s: ExportSettings) -> None:
    """--to gguf: one file, written atomically; an existing one only with --force."""
    from gptcli.store import loading
    from gptcli.store.gguf import export_gguf
    from gptcli.store.layout import refuse_inside_checkpoints

    if s.adapters_only:
        raise UsageError("--adapters-only writes PEFT's adapters; a GGUF file holds the merged model")
    refuse_inside_checkpoints(s.out, "write the .gguf file outside it", runs="inside")
    files.check_writable(s.out, replace=s.force)
    loaded = loading.load(s.ckpt, base=s.base)  # a LoRA run: merged into its base
    _warn_head(loaded)
    outtype = s.outtype or _stored_type(loaded)
    name = s.out.stem
    counts = export_gguf(
        loaded.model, loaded.tokenizer, s.out, outtype, name, str(loaded.path), replace=s.force
    )
    size = s.out.stat().st_size
    if s.json_out:
        render.print_json(
            {"out": str(s.out), "format": "gguf", "outtype": outtype, "bytes": size, "tensors": counts}
        )
        return
    shown = ", ".join(f"{n} {t}" for t, n in sorted(counts.items()))
    render.info(f"wrote {s.out}: {size / 2**20:.1f} MiB, {outtype} ({shown} tensors)")
    render.info(f"run it with: llama-cli -m {s.out}   (or llama-server -m {s.out}; see docs/models.md)")


def _stored_type(loaded: Any) -> str:
    """--outtype's default: how the checkpoint stores its weights (bf16 stays bf16; float32,
    f32; a GGUF file, its matrices' type), so that an export neither loses precision nor grows."""
    if loaded.meta.get("source") == "gguf":
        return str(loaded.meta.get("gguf_type", "f32"))
    from safetensors import safe_open

    from gptcli.store.loading import weights_file

    file = weights_file(loaded)
    if file.suffix == ".safetensors":
        with safe_open(file, framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                if f.get_slice(key).get_dtype() == "BF16":
                    return "bf16"
    return "f32"


def _export_adapters(ckpt: str, out: Path, json_out: bool) -> None:
    """--adapters-only: the adapters as the run saved them, in PEFT's format; the base is
    not read (PEFT's file names it, for whoever loads the adapters onto it)."""
    from gptcli import lora
    from gptcli.store import loading
    from gptcli.store.checkpoint import model_config
    from gptcli.store.hf import export_peft

    path, meta = loading.lora_checkpoint(ckpt)
    if model_config(path, meta).n_classes:
        raise UsageError(
            "--adapters-only: PEFT's format holds a language model's adapters, and this run's "
            "classification head has no place in it; export the merged model without --adapters-only"
        )
    if meta.get("added_tokens"):
        raise UsageError(
            "--adapters-only: this run added the chat template's tokens to its base, and their "
            "embedding rows have no place in PEFT's adapters; export the merged model without --adapters-only"
        )
    settings = lora.LoRASettings.of(meta)
    assert settings is not None  # (lora_checkpoint refuses runs without adapters)
    written = export_peft(loading.read_adapters(path, meta), settings, str(meta.get("base", "")), out)
    if json_out:
        render.print_json({"out": str(out), "format": "peft", "files": written})
        return
    render.info(f"wrote {out}: {', '.join(written)}")
    render.info(
        f'load it with: peft.PeftModel.from_pretrained(GPT2LMHeadModel.from_pretrained(BASE), "{out}"), '
        f"BASE being {meta.get('base')} in Hugging Face's format (gptcli export BASE --to hf DIR)"
    )
