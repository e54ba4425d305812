"""Checkpoints: run directories on disk (and, through gptcli.store.hf, Hugging Face GPT-2 models).

A run directory holds `config.yaml`, `metrics.jsonl`, and two checkpoints: `best/` (lowest
validation loss) and `last/` (most recent, with the training state for exact resume); a
run with the WSD schedule adds `stable/` (the state as its decay began, training state
included, from which a longer budget continues).
A checkpoint directory is self-contained:

    model.safetensors       weights (the tied unembedding is stored once)
    checkpoint.json         format version, model config, tokenizer, step, losses, run config
    tokenizer.json          the tokenizer
    train_state.safetensors optimizer moments, RNG states        (last/ and stable/ only)
    train_state.json        step, schedule position, data RNG, ... (last/ and stable/ only)

Nothing is pickled. A checkpoint is written into a temporary directory, fsynced, and then
renamed into place, so a crash never leaves a half-written checkpoint under its real name.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from gptcli import __version__, files, lora
from gptcli.config import Config, merge
from gptcli.data.inputs import check_types, read_json, try_read_json, what_is
from gptcli.data.tokenizer import TOKENIZER_FILE, Tokenizer, load_tokenizer
from gptcli.errors import UsageError
from gptcli.model import GPT
from gptcli.paths import RUNS_DIR
from gptcli.store.layout import BEST, LAST, META_FILE, checkpoint_in, is_checkpoint_dir
from gptcli.store.validate import read_weights

FORMAT = "gptcli-checkpoint"
VERSION = 1
MODEL_FILE = "model.safetensors"
STATE_TENSORS = "train_state.safetensors"
STATE_JSON = "train_state.json"
STABLE = "stable"  # a WSD run's state as its decay began, which a longer run continues from


# --- one training per run directory -------------------------------------------------------


LOCK_FILE = ".lock"


class RunLock:
    """run_dir/.lock, held with flock while a process trains into run_dir: a second one is
    refused; the kernel lets go of the lock when its process dies, however it dies, so a
    file left behind by a killed run is simply taken over. The file names its holder."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self.fd: int | None = None

    def __enter__(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fd = files.open_lock_file(self.path)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                holder = try_read_json(self.path)
                holder = holder if isinstance(holder, dict) else {}
                raise UsageError(
                    f"{self.path.parent} is being trained by process {holder.get('pid')} on "
                    f"{holder.get('host')} (since {holder.get('started')}); wait for it or stop it"
                ) from None
            if os.fstat(fd).st_nlink:
                break
            os.close(fd)  # its holder removed it as it let go: lock the path's new file
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started})
        os.ftruncate(fd, 0)
        os.write(fd, me.encode())
        self.fd = fd
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)  # before letting go, so no one locks a removed file
            os.close(self.fd)
            self.fd = None


# --- saving --------------------------------------------------------------------------------


def model_state(model: GPT, state: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """State dict for safetensors (model's own, or state gathered for it elsewhere):
    contiguous, detached, tied unembedding stored once. A model with LoRA adapters saves
    only what it trains (the adapters, and a task's head): its base is a checkpoint of its own."""
    state = model.state_dict() if state is None else state
    keep = lora.is_trained if lora.has_adapters(model) else lambda name: name != "lm_head.weight"
    return {k: v.detach().contiguous() for k, v in state.items() if keep(k)}


def split_tensors(tree: Any, tensors: dict[str, torch.Tensor], prefix: str = "") -> Any:
    """A nested structure with every tensor moved into `tensors` (JSON keeps a reference)."""
    if isinstance(tree, torch.Tensor):
        tensors[prefix] = tree.detach().cpu().contiguous()
        return {"__tensor__": prefix}
    if isinstance(tree, dict):
        return {
            str(k): split_tensors(v, tensors, f"{prefix}.{k}" if prefix else str(k)) for k, v in tree.items()
        }
    if isinstance(tree, (list, tuple)):
        return [split_tensors(v, tensors, f"{prefix}.{i}") for i, v in enumerate(tree)]
    return tree


def join_tensors(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, dict):
        if set(tree) == {"__tensor__"}:
            return tensors[tree["__tensor__"]]
        return {k: join_tensors(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list):
        return [join_tensors(v, tensors) for v in tree]
    return tree


def save_checkpoint(
    run_dir: Path,
    name: str,
    model: GPT,
    tokenizer: Tokenizer,
    meta: dict[str, Any],
    train_state: dict[str, Any] | None = None,
    weights: dict[str, torch.Tensor] | None = None,
) -> Path:
    """Write run_dir/name (best or last) atomically and return its path; weights: the
    model's state as model_state gives it, when the model itself holds only a shard."""
    final = run_dir / name
    weights = model_state(model) if weights is None else weights
    tensors: dict[str, torch.Tensor] = {}
    skeleton = split_tensors(train_state, tensors) if train_state is not None else None
    size = sum(t.numel() * t.element_size() for t in (*weights.values(), *tensors.values()))
    with files.new_dir(final, size=size) as tmp:  # inside a directory of our own: plain writes
        save_file(weights, tmp / MODEL_FILE, metadata={"format": "pt"})
        full_meta = {
            "format": FORMAT,
            "version": VERSION,
            "gptcli_version": __version__,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "model": {**vars(model.config)},
            "tokenizer": tokenizer.name,
            **meta,
        }
        (tmp / META_FILE).write_text(json.dumps(full_meta, indent=2), encoding="utf-8")
        (tmp / TOKENIZER_FILE).write_text(tokenizer.dumps(), encoding="utf-8")
        if skeleton is not None:
            save_file(tensors, tmp / STATE_TENSORS)
            (tmp / STATE_JSON).write_text(json.dumps(skeleton), encoding="utf-8")
        for f in tmp.iterdir():
            files.fix_permissions(f)
    return final


def copy_checkpoint(
    run_dir: Path, src: str, dst: str, meta_update: dict[str, Any] | None = None, train_state: bool = False
) -> Path:
    """Publish run_dir/dst as the weights of run_dir/src (hard links), with its train state
    when asked (stable/), without otherwise (best/)."""
    source = run_dir / src
    with files.new_dir(run_dir / dst) as tmp:
        for f in (MODEL_FILE, TOKENIZER_FILE, *((STATE_TENSORS, STATE_JSON) if train_state else ())):
            files.link_or_copy(source / f, tmp / f)
        meta = read_json(source / META_FILE, "the checkpoint is damaged")
        (tmp / META_FILE).write_text(json.dumps({**meta, **(meta_update or {})}, indent=2), encoding="utf-8")
    return run_dir / dst


# --- finding and loading -------------------------------------------------------------------


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """The checkpoint directory for a run dir (its best/, else last/) or a checkpoint dir.
    A checkpoint interrupted mid-replacement is recovered from its .old copy."""
    p = Path(path)
    if not p.exists():
        raise UsageError(f"{p}: no such file or directory")
    if is_checkpoint_dir(p):
        return p
    found = checkpoint_in(p, BEST) or checkpoint_in(p, LAST)
    if found is not None:
        return found
    if not p.is_dir():  # (a device, a pipe, a file that is none of the formats gptcli reads)
        raise UsageError(
            f"--ckpt {p} is {what_is(p)}, not a gptcli run or checkpoint (a directory), a Hugging Face "
            "directory or a .gguf file"
        )
    raise UsageError(
        f"--ckpt {p} is not a gptcli run or checkpoint (no {META_FILE} in it, {BEST}/ or {LAST}/)"
    )


def newest_run(
    runs_dir: Path = RUNS_DIR,
    tasks: tuple[str, ...] | None = None,
    finetuned: bool | None = None,
    pairs: bool | None = None,
) -> Path | None:
    """The run under runs_dir whose latest checkpoint was written most recently; with
    tasks, the newest run trained for one of them (a run's task is in its checkpoint.json);
    with finetuned, the newest finetuning run (one that names its base) or pretraining run;
    with pairs, the newest whose checkpoint does not say it takes the other kind of input
    (a classifier of pairs of texts, or of single texts)."""
    found: list[tuple[float, Path]] = []
    if not runs_dir.is_dir():
        return None
    for run in runs_dir.iterdir():
        metas = [run / n / META_FILE for n in (LAST, BEST)]
        times = [m.stat().st_mtime for m in metas if m.is_file()]
        if times:
            found.append((max(times), run))
    for _, run in sorted(found, key=lambda x: x[0], reverse=True):
        if tasks is not None and run_task(run) not in tasks:
            continue
        if finetuned is not None and is_finetuned(run) != finetuned:
            continue
        if pairs is None or _meta_of(run).get("pairs", pairs) == pairs:
            return run
    return None


def _meta_of(run: Path) -> dict:
    """A run's newest readable checkpoint.json, or {}."""
    for name in (LAST, BEST):
        meta = try_read_json(run / name / META_FILE)
        if isinstance(meta, dict):
            return meta
    return {}


def is_finetuned(run: Path) -> bool | None:
    """Whether a run was finetuned (its checkpoint.json names its base), None if unreadable."""
    meta = _meta_of(run)
    return "base" in meta if meta else None


def run_task(run: Path) -> str | None:
    """What a run was trained for (lm, sft, chat, classify, choice), or None if unreadable."""
    meta = _meta_of(run)
    task = meta.get("task", "lm") if meta else None
    return task if isinstance(task, str) else None


# the types of what gptcli reads from checkpoint.json (other keys are kept, not read)
META_SCHEMA: dict[str, tuple[type, ...]] = {
    "version": (int,), "model": (dict,), "config": (dict,), "tokenizer": (str,), "task": (str,),
    "step": (int,), "tokens": (int,), "best_val_loss": (float, type(None)), "data_dir": (str,),
    "sources": (list,), "data_sha256": (str,), "data_changes": (list,), "labels": (list,),
    "split": (str, type(None)), "delimiter": (str,), "both_orders": (bool,), "base": (str,),
    "pairs": (bool,), "data": (list,), "val_data": (str, type(None)), "val_fraction": (float,),
    "aux_lm_weight": (float,),
    "lora_rank": (int,), "lora_alpha": (float, type(None)), "lora_dropout": (float,), "lora_targets": (list,),
    "base_checkpoint": (str,), "base_sha256": (str,), "decay_started": (int,), "optimizers": (dict,),
}  # fmt: skip


def read_meta(ckpt_dir: Path) -> dict[str, Any]:
    """checkpoint.json, checked: a gptcli checkpoint of a format this version reads, whose
    fields have the types gptcli reads."""
    meta = read_json(ckpt_dir / META_FILE, "the checkpoint is damaged")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UsageError(f"{ckpt_dir / META_FILE} is not a gptcli checkpoint file")
    source = str(ckpt_dir / META_FILE)
    check_types(meta, {"version": (int,)}, source)  # first: a newer format may have other fields
    if meta.get("version", 0) > VERSION:
        raise UsageError(
            f"{ckpt_dir} was written by a newer gptcli (checkpoint format {meta['version']}, "
            f"this gptcli reads {VERSION}); upgrade gptcli"
        )
    check_types(meta, META_SCHEMA, source)
    for key in ("labels", "data", "sources", "lora_targets"):
        items = meta.get(key, [])
        if not all(isinstance(x, str) or (key == "labels" and _is_int(x)) for x in items):
            raise UsageError(f"{source}: '{key}' holds values of the wrong type; it is damaged")
    bad = (
        ("val_fraction", lambda v: 0 < v < 1),
        ("aux_lm_weight", lambda v: 0 <= v < math.inf),
        ("data", lambda v: len(v) > 0),
        ("split", lambda v: v in (None, "stratified")),
        ("labels", lambda v: len(set(map(json.dumps, v))) == len(v)),
        ("lora_rank", lambda v: 0 <= v <= 2**16),
        ("lora_alpha", lambda v: v is None or 0 < v < math.inf),
        ("lora_dropout", lambda v: 0 <= v < 1),
        ("lora_targets", lambda v: len(v) > 0 and set(v) <= set(lora.TARGETS)),
    )
    for key, ok in bad:
        if key in meta and not ok(meta[key]):
            shown = json.dumps(meta[key])[:60]
            raise UsageError(f"{source}: '{key}' is {shown}, which cannot be; the checkpoint is damaged")
    return meta


@dataclass
class Loaded:
    """A model ready to use, with its tokenizer and checkpoint metadata."""

    path: Path
    model: GPT
    tokenizer: Tokenizer
    meta: dict[str, Any]


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def model_config(ckpt: Path, meta: dict[str, Any]) -> Any:
    """The ModelConfig a checkpoint's metadata describes, checked."""
    if not isinstance(meta.get("model"), dict):
        raise UsageError(f"{ckpt / META_FILE} has no model config; the checkpoint is damaged")
    config = merge(Config(), {"model": meta["model"]}, str(ckpt / META_FILE)).model
    config.validate()
    return config


def load_checkpoint(path: str | os.PathLike, device: torch.device | str = "cpu") -> Loaded:
    """Load a model (eval mode, on device) with its tokenizer and metadata from a gptcli run
    dir or checkpoint dir (gptcli.store.loading also takes Hugging Face directories and names)."""
    ckpt = resolve_checkpoint(Path(path))
    meta = read_meta(ckpt)
    if meta.get("lora_rank"):
        raise UsageError(
            f"{ckpt} holds LoRA adapters, not a whole model: load it with gptcli.store.loading.load"
        )
    config = model_config(ckpt, meta)
    if meta.get("task") == "classify" and len(meta.get("labels", [])) != config.n_classes:
        raise UsageError(
            f"{ckpt / META_FILE}: {len(meta.get('labels', []))} labels for a head of {config.n_classes} "
            "classes; the checkpoint is damaged"
        )
    tokenizer = load_tokenizer(ckpt / TOKENIZER_FILE)
    if config.vocab_size is None or config.vocab_size < tokenizer.vocab_size:
        raise UsageError(
            f"{ckpt}: the model has {config.vocab_size} token embeddings but its tokenizer has "
            f"{tokenizer.vocab_size} tokens; the checkpoint and tokenizer do not belong together"
        )
    # the weights' shapes are checked against the config from the file's header, before
    # anything the size of the model is allocated
    state = read_weights(ckpt / MODEL_FILE, config)
    model = GPT.from_weights(config, state)
    model.to(device).eval()
    return Loaded(ckpt, model, tokenizer, meta)


def load_train_state(ckpt_dir: Path, skip: str | None = None) -> dict[str, Any]:
    """The training state saved with a last/ checkpoint (for --resume); tensors whose
    name starts with skip (e.g. "optimizer.state.") are left out, as None."""
    skeleton = read_json(ckpt_dir / STATE_JSON, "the run cannot be resumed")
    try:
        tensors: dict[str, torch.Tensor | None] = {}
        with safe_open(ckpt_dir / STATE_TENSORS, framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 (a safetensors handle, not a dict)
                tensors[name] = None if skip and name.startswith(skip) else f.get_tensor(name)
    except (OSError, ValueError, SafetensorError) as e:
        raise UsageError(f"{ckpt_dir} has no readable training state ({e}); it cannot be resumed") from e
    try:
        return join_tensors(skeleton, tensors)
    except (KeyError, TypeError) as e:
        raise UsageError(
            f"{ckpt_dir / STATE_JSON} names tensor {e} that {STATE_TENSORS} does not hold; "
            "the training state is damaged, so the run cannot continue exactly"
        ) from None
