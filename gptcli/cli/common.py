"""What several verbs share: loading --ckpt (or the newest run), --save files, prompts from
the command line, and checks before decoding."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcli.cli import render
from gptcli.config.run import TEXT_TASKS
from gptcli.errors import UsageError

if TYPE_CHECKING:
    from gptcli.infer.completion import Prompt
    from gptcli.store.checkpoint import Loaded


def complete_runs(incomplete: str) -> list[str]:
    """Shell completion for --ckpt: the run directories under ./runs and their checkpoints."""
    from gptcli.paths import RUNS_DIR

    found = []
    if RUNS_DIR.is_dir():
        for run in sorted(RUNS_DIR.iterdir()):
            if run.is_dir():
                found += [str(run), *(str(run / c) for c in ("best", "last") if (run / c).is_dir())]
    return [f for f in found if f.startswith(incomplete)]


SAVE_FORMATS = (".json", ".png", ".html")


def save_document(
    path: Path,
    document: dict,
    force: bool,
    html: Callable[[Path, dict, bool], None],
    png: Callable[[Path, bool], bool],
) -> None:
    """--save FILE by its extension: the JSON document itself, html(path, document, replace)
    or png(path, replace), False when matplotlib is missing."""
    from gptcli import files

    suffix = path.suffix.lower()
    if suffix == ".json":
        files.write_file(path, json.dumps(document, ensure_ascii=False), replace=force)
    elif suffix == ".html":
        html(path, document, force)
    elif not png(path, force):
        raise UsageError("--save .png needs matplotlib: pip install 'gptcli[plot]' (or save .html / .json)")


def check_save(save: Path | None, force: bool) -> None:
    """--save FILE: a figure format, and a file that may be written (see files.check_writable)."""
    if save is None:
        return
    if save.suffix.lower() not in SAVE_FORMATS:
        raise UsageError(f"--save {save}: use a .json, .png or .html file name")
    from gptcli import files
    from gptcli.store.layout import refuse_inside_checkpoints

    refuse_inside_checkpoints(save, "save it outside the checkpoint")
    files.check_writable(save, replace=force)


def weights_of(model: Any, quantize: str | None) -> dict[str, Any]:
    """What a --json document says of the weights that made it: their dtype (--dtype's name)
    and --quantize (None: as stored), so that documents of one model are told apart."""
    from gptcli.runtime import weights_dtype

    return {"dtype": weights_dtype(model), "quantize": quantize}


def is_path(arg: str) -> bool:
    """Whether a command-line argument names an existing file or directory (a text that
    happens to be empty, or too long for a file name, does not)."""
    if not arg:
        return False
    try:
        return Path(arg).exists()
    except (OSError, ValueError):
        return False


def text_arg(text: str, what: str = "the text") -> str:
    """A text from the command line, refusing bytes that were not UTF-8 (Python keeps them
    as lone surrogates)."""
    bad = [i for i, c in enumerate(text) if 0xD800 <= ord(c) <= 0xDFFF]
    if bad:
        byte = ord(text[bad[0]]) - 0xDC00
        raise UsageError(
            f"{what} is not valid UTF-8 (byte 0x{byte:02X} at character {bad[0]}); pass UTF-8 text"
        )
    return text


# what a verb loads when --ckpt is left out: the newest run trained for one of these tasks
NEWEST = {
    "text": (
        TEXT_TASKS,
        "model that writes text",
        "train one with `gptcli pretrain CORPUS` (or `make demo`)",
    ),
    "classifier": (
        ("classify", "choice"),
        "classifier",
        "make one with `gptcli finetune --ckpt RUN DATA --task classify`",
    ),
    "chat": (("chat",), "chat model", "make one with `gptcli finetune --ckpt RUN DATA --task chat`"),
    "labels": (  # eval of labelled records: a classifier's head scores them
        ("classify",),
        "classifier of labelled texts",
        "make one with `gptcli finetune --ckpt RUN DATA --task classify`",
    ),
}


def load_model(
    ckpt: str | None,
    device: str = "auto",
    dtype: str = "auto",
    classifier: bool = False,
    base: Path | None = None,
    quantize: str | None = None,
    chat: bool = False,
    newest: str | None = None,
    pairs: bool | None = None,
    decoding: bool = False,
) -> Loaded:
    """Load --ckpt, or the newest run under ./runs that fits the verb (one that writes
    text; with classifier a classify/choice run; with chat a chat run; newest: another kind
    of NEWEST; pairs: a classifier of pairs of texts, or of single texts) and say which,
    onto the device in the dtype for inference, its weights quantized if asked
    (--quantize); say where it runs and why. A LoRA run comes merged into its base (base:
    where that is now, if it moved). decoding: the verb generates token by token (through
    the CPU kernel, whose bf16 products `--dtype auto` may choose)."""
    from gptcli.infer.quantize import quantize as quantize_weights
    from gptcli.runtime import pick_device, pick_inference_dtype
    from gptcli.store import loading
    from gptcli.store.checkpoint import newest_run

    if ckpt is None:
        kind = newest or ("classifier" if classifier else "chat" if chat else "text")
        tasks, what, hint = NEWEST[kind]
        run = newest_run(tasks=tasks, pairs=pairs)
        if run is None:
            other = newest_run()
            found = f" ({other} is not one)" if other else ""
            raise UsageError(f"no {what} found under ./runs{found}; {hint}, or pass --ckpt")
        skipped = newest_run()
        also = f" (the newer {skipped} is not one)" if skipped is not None and skipped != run else ""
        render.info(f"using the newest {'run' if kind == 'text' else what}: {run}{also}")
        ckpt = str(run)
    dev, why_device = pick_device(device)
    loaded = loading.load(ckpt, dev, base=base)
    if unused := loading.base_unused(loaded, base):
        render.warning(unused)
    bf16_kernel = None
    if decoding and dev.type == "cpu" and dtype == "auto":
        from gptcli.infer import kernels

        bf16_kernel = kernels.bf16_products()
    dt, why_dtype = pick_inference_dtype(dev, dtype, loaded.model.num_params(), quantize, bf16_kernel)
    loaded.model.to(dt)
    if quantize is not None:
        quantize_weights(loaded.model, quantize)
    render.note(f"{why_device}; {why_dtype}")
    return loaded


def start_decoding(loaded: Loaded) -> None:
    """Generate token by token through the C step where the model is on the CPU
    (gptcli/infer/kernels.py), building it the first time on this machine, which it says;
    and have glibc's malloc keep the memory this process frees (runtime.keep_freed_memory):
    a generation's KV cache and every step's logits then reuse freed memory instead of
    memory the kernel maps anew, page by page on first touch (16 samples from GPT-2 124M: 150
    to 300 page faults a step). Called once the verb's input is checked: a refused command
    starts nothing and says one line."""
    from gptcli.infer import kernels
    from gptcli.runtime import keep_freed_memory

    if not kernels.use_fast_decode(loaded.model):
        return
    keep_freed_memory()
    if kernels.LIBRARY.failed:  # (also in scripts and logs: decoding is slower for it)
        render.warning(f"{kernels.LIBRARY.failed}; decoding runs the model's own code")
    elif not kernels.building():
        render.note("decoding in one C call per token")
    else:
        render.info(
            f"building the CPU decoding kernel for this machine, once (kept in {kernels.kernels_dir()}); "
            "until it is ready, tokens come from the model's own code"
        )


def choose_decoding(compile: bool | None, loaded: Loaded) -> bool:
    """--compile/--no-compile, or by default what is fastest where the model runs; starts
    what it chose (start_decoding for the default, or says that torch.compile is at work:
    a step compiled for the first time on a CPU keeps a command silent for up to a minute)."""
    compiled = next(loaded.model.parameters()).device.type == "cuda" if compile is None else compile
    if compiled:
        render.info(
            "compiling the decoding step (torch.compile: up to a minute the first time, a few seconds "
            "once TorchInductor's cache holds it)"
        )
    elif compile is None:
        start_decoding(loaded)
    return compiled


def check_decoding_fits(model: Any, rows: int, what: str, length: int | None = None) -> None:
    """Refuse, before allocating, to decode more sequences at once than memory holds
    (length: the positions each keeps, default the model's context)."""
    from gptcli.runtime import check_fits, decoding_bytes

    weights = next(model.parameters())
    check_fits(decoding_bytes(model.config, rows, weights.dtype, length), weights.device, what)


def warn_if_cut(prompt: Prompt, limit: str) -> None:
    """Say so when encode_prompt cut the prompt from the left; limit names what it had to fit."""
    if prompt.dropped:
        render.warning(
            f"the prompt is {len(prompt.ids) + prompt.dropped} tokens, more than {limit}; "
            f"kept its last {len(prompt.ids)}"
        )
