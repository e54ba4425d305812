"""What a run saves with every last/ checkpoint and reads back on --resume, so that it
continues exactly: where training is (TrainState), the optimizers' state (AdamW's under
"optimizer", as runs always saved it, and Muon's under "muon"), the gradient scaler, every
RNG stream and the data position; and metrics.jsonl, cut back to match.

The saved state is data from disk: check_train_state refuses anything in it that does not
fit the run, and restore turns every other surprise into a one-line error.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from gptcli import files
from gptcli.config import Config, TrainConfig
from gptcli.data.inputs import check_types
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError, reason
from gptcli.messages import quote
from gptcli.model import GPT
from gptcli.reports import StepReport
from gptcli.runtime import Dist
from gptcli.store.checkpoint import (
    BEST,
    LAST,
    STABLE,
    checkpoint_in,
    load_train_state,
    read_meta,
    save_checkpoint,
)
from gptcli.train.optim import Optimizers, lr_at
from gptcli.train.parallel import Sharded, Whole

METRICS_FILE = "metrics.jsonl"


class MetricsLog:
    """metrics.jsonl: one JSON object per log step and per evaluation."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, record: dict[str, Any]) -> None:
        files.append_line(self.path, json.dumps(record))

    def log_step(self, report: StepReport, tokens: int) -> None:
        """A log step's record (a StepReport with its loss, tokens/s and MFU filled in)."""
        self.append({
            "kind": "train", "step": report.step, "loss": report.loss, "lr": report.lr,
            **({} if report.muon_lr is None else {"muon_lr": report.muon_lr}),
            "grad_norm": report.grad_norm, "tokens": tokens,
            "tokens_per_s": round(report.tokens_per_s or 0.0, 1),
            "mfu": None if report.mfu is None else round(report.mfu, 4), "elapsed": round(report.elapsed, 3),
        })  # fmt: skip

    def log_eval(self, step: int, elapsed: float, metrics: dict[str, dict[str, float]], scored: dict) -> None:
        """An evaluation's record: val_loss, train_loss, ... and each --eval-file's figures."""
        flat = {f"{split}_{k}": v for split, m in metrics.items() for k, v in m.items()}
        record = {"kind": "eval", "step": step, "elapsed": round(elapsed, 3), **flat}
        self.append(record | ({"files": scored} if scored else {}))

    def log_sample(self, step: int, prompt: str, text: str) -> None:
        self.append({"kind": "sample", "step": step, "prompt": prompt, "text": text})

    def _lines(self) -> tuple[list[tuple[bytes, dict[str, Any] | None]], bool]:
        """Each line with its record, or None where it is not one of ours (not UTF-8, not a
        JSON object, no integer step); and whether the file ends inside a line. A link is
        refused, as appending to it is: what it points to is not the run's log."""
        if self.path.is_symlink():
            raise UsageError(
                f"{self.path} is a symbolic link; gptcli does not write through links: remove it"
            )
        data = self.path.read_bytes() if self.path.exists() else b""
        if not data:  # (a missing or empty log has no lines, not one empty line)
            return [], False
        out = []
        for raw in data.split(b"\n")[: -1 if data.endswith(b"\n") else None]:  # (\r is a byte of a line)
            try:
                rec = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):
                rec = None
            ok = (
                isinstance(rec, dict)
                and isinstance(rec.get("step"), int)
                and not isinstance(rec["step"], bool)
            )
            out.append((raw, rec if ok else None))
        return out, bool(data) and not data.endswith(b"\n")

    def set_aside_damaged(self) -> int:
        """Move the lines that are not records (random bytes, a record overwritten in part)
        to metrics.jsonl.damaged, after what it holds, and keep the rest in order; a last
        line cut short by a crash is dropped (resume writes it again). Returns how many
        lines were set aside. Nothing is deleted."""
        lines, cut_short = self._lines()
        if cut_short and lines and lines[-1][1] is None:
            lines.pop()
        bad = [raw for raw, rec in lines if rec is None]
        for raw in bad:
            files.append_line(self.path.with_name(self.path.name + DAMAGED), raw)
        if bad or cut_short:
            files.write_file(self.path, b"".join(raw + b"\n" for raw, rec in lines if rec is not None))
        return len(bad)

    def truncate(self, step: int, keep_eval_at_step: bool) -> None:
        """Forget records written after the checkpoint at `step` (resume replays them), and
        any line that is not a record."""
        if not self.path.exists():
            return
        kept = [
            raw
            for raw, rec in self._lines()[0]
            if rec is not None
            and (
                rec["step"] < step
                or (rec["step"] == step and (rec.get("kind") != "eval" or keep_eval_at_step))
            )
        ]
        files.write_file(self.path, b"".join(raw + b"\n" for raw in kept))


DAMAGED = ".damaged"  # metrics.jsonl.damaged: the lines a resume found damaged, kept aside


@dataclass
class TrainState:
    """Where training is; saved with every last/ checkpoint."""

    step: int = 0
    tokens: int = 0
    elapsed: float = 0.0
    best_val_loss: float | None = None
    last_eval_step: int = -1
    schedule: list | None = None  # [max_iters, max_time] the LR schedule was planned for
    decay_from: list[float] | None = None  # see lr_at; set when a resume changed the schedule


def refit_schedule(state: TrainState, cfg: TrainConfig) -> None:
    """Record the schedule's end; a resume that moves it decays on from the current LR (a
    WSD run still in its constant phase simply decays at the new end)."""
    planned = [cfg.max_iters, cfg.max_time]
    moved = state.schedule is not None and state.schedule != planned
    constant = cfg.schedule == "wsd" and state.decay_from is None
    if moved and state.step >= cfg.warmup_iters and not constant:
        before = replace(cfg, max_iters=state.schedule[0], max_time=state.schedule[1])
        lr = lr_at(state.step, before, state.elapsed, state.decay_from)
        state.decay_from = [state.step, lr, state.elapsed]
    state.schedule = planned


@dataclass
class Parts:
    """The live objects whose state is saved and restored with a run."""

    optimizers: Optimizers
    placement: Whole | Sharded
    scaler: torch.amp.GradScaler
    data_gen: torch.Generator
    dist: Dist
    device: torch.device


def collect(state: TrainState, parts: Parts) -> dict[str, Any]:
    """Everything resume needs (collective under torchrun: every rank gives its RNG)."""
    torch_rng = parts.dist.gather(torch.get_rng_state())
    cuda_rng = (
        parts.dist.gather(torch.cuda.get_rng_state(parts.device).cpu())
        if parts.device.type == "cuda"
        else None
    )
    return {
        "state": asdict(state),
        **{_STATE_KEY[name]: parts.placement.optimizer_state(opt) for name, opt in parts.optimizers.items()},
        "scaler": parts.scaler.state_dict() if parts.scaler.is_enabled() else None,
        "data_rng": parts.data_gen.get_state(),
        "world": parts.dist.world,
        "torch_rng": torch_rng,
        "cuda_rng": cuda_rng,
    }


def save_last(
    run_dir: Path,
    model: GPT,
    tokenizer: Tokenizer,
    config: Config,
    meta: dict[str, Any],
    state: TrainState,
    parts: Parts,
    metrics: dict[str, dict[str, float]] | None,
) -> Path | None:
    """Write run_dir/last (collective: every rank calls it); its path on rank 0."""
    saved = collect(state, parts)  # on every rank
    weights = parts.placement.weights()  # whole tensors (sharded: gathered, on rank 0)
    if not parts.dist.is_main:
        return None
    full_meta = {
        "step": state.step,
        "tokens": state.tokens,
        "best_val_loss": state.best_val_loss,
        "train_loss": metrics["train"]["loss"] if metrics else None,
        "val_loss": metrics["val"]["loss"] if metrics else None,
        "config": config.to_dict(),
        **meta,
    }
    if config.train.schedule == "wsd" and state.decay_from is not None:
        full_meta["decay_started"] = int(state.decay_from[0])  # a longer budget goes back to stable/
    return save_checkpoint(run_dir, LAST, model, tokenizer, full_meta, saved, weights)


def restore(run_dir: Path, parts: Parts, name: str = LAST) -> TrainState:
    """Put the state saved in run_dir's last/ checkpoint (or stable/) back into parts, and
    return where training was; metrics.jsonl is cut back to it. Anything in it that does
    not fit this run is a one-line error."""
    skip = None if parts.dist.is_main else parts.placement.skip_on_load
    ckpt = checkpoint_in(run_dir, name) or run_dir / name
    saved = load_train_state(ckpt, skip)
    try:
        if parts.dist.is_main:
            check_train_state(saved, parts.optimizers, f"{ckpt}/train_state.json")
        state = _load(saved, parts)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError, RuntimeError) as e:
        raise UsageError(
            f"{ckpt}/train_state.json and its tensors do not fit this run ({reason(e)}); "
            "the training state is damaged, so the run cannot continue exactly"
        ) from None
    if name == STABLE:  # best/ may hold a better model, from the decay since
        best = checkpoint_in(run_dir, BEST)
        kept = read_meta(best).get("best_val_loss") if best is not None else None
        if kept is not None and (state.best_val_loss is None or kept < state.best_val_loss):
            state.best_val_loss = kept
    if parts.dist.is_main:
        MetricsLog(run_dir / METRICS_FILE).truncate(state.step, state.last_eval_step == state.step)
    return state


def _load(saved: dict[str, Any], parts: Parts) -> TrainState:
    for name, opt in parts.optimizers.items():
        optim = saved[_STATE_KEY[name]]
        optim["state"] = {int(k): v for k, v in optim["state"].items()}
        parts.placement.load_optimizer_state(opt, optim)
    if saved.get("scaler"):
        parts.scaler.load_state_dict(saved["scaler"])
    parts.data_gen.set_state(saved["data_rng"])
    dist = parts.dist
    ranks = saved.get("world", 1)
    if ranks != dist.world:
        raise UsageError(
            f"the run was trained by {ranks} process(es); resume it with the same number "
            f"(now {dist.world}) to continue exactly"
        )
    torch.set_rng_state(_per_rank(saved["torch_rng"])[dist.rank])
    if parts.device.type == "cuda" and saved.get("cuda_rng") is not None:
        torch.cuda.set_rng_state(_per_rank(saved["cuda_rng"])[dist.rank], parts.device)
    return TrainState(**saved["state"])


def _per_rank(rng: torch.Tensor | list[torch.Tensor]) -> list[torch.Tensor]:
    """RNG states by rank (early single-process checkpoints saved one state, not a list)."""
    return [rng] if isinstance(rng, torch.Tensor) else rng


_STATE_KEY = {"adamw": "optimizer", "muon": "muon"}  # where each optimizer's state is saved

_STATE_SCHEMA: dict[str, tuple[type, ...]] = {
    "step": (int,), "tokens": (int,), "elapsed": (float,), "best_val_loss": (float, type(None)),
    "last_eval_step": (int,), "schedule": (list, type(None)), "decay_from": (list, type(None)),
}  # fmt: skip


def check_train_state(saved: Any, optimizers: Optimizers, source: str = "the training state") -> None:
    """Raise ValueError unless a saved training state has the parts resume reads, with
    values that can be, and a state for exactly this run's optimizers, each for exactly
    its parameters (every moment the shape of its parameter)."""
    if not isinstance(saved, dict) or not all(k in saved for k in ("state", "optimizer", "data_rng")):
        raise ValueError("it lacks the state, optimizer or data_rng part")
    if not isinstance(saved["state"], dict) or set(saved["state"]) - set(TrainState.__dataclass_fields__):
        raise ValueError("its state part holds unknown fields")
    check_types(saved["state"], _STATE_SCHEMA, source)
    _check_state_values(saved["state"])
    for name, key in _STATE_KEY.items():
        if (key in saved) != (name in optimizers):
            raise ValueError(f"it {'holds' if key in saved else 'lacks'} a {name} state, and this run "
                             f"{'does not use' if key in saved else 'uses'} {name}")  # fmt: skip
    for name, opt in optimizers.items():
        _check_optimizer_state(saved[_STATE_KEY[name]], opt, name)


def _check_optimizer_state(optim: Any, optimizer: torch.optim.Optimizer, name: str) -> None:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    groups = optim.get("param_groups") if isinstance(optim, dict) else None
    if not isinstance(groups, list) or [len(g.get("params", [])) for g in groups] != [
        len(g["params"]) for g in optimizer.param_groups
    ]:
        raise ValueError(f"its {name} has other parameter groups than this model")
    for saved, live in zip(groups, optimizer.state_dict()["param_groups"], strict=True):
        if not isinstance(saved, dict) or saved.get("params") != live["params"]:
            raise ValueError(f"its {name} has other parameter groups than this model")
        for key in saved.keys() & live.keys() - {"params"}:
            # a flag that changes the algorithm (amsgrad, nesterov, ...) is the run's; how it
            # is computed (fused, foreach, capturable) may follow the machine
            fixed = isinstance(live[key], bool) and key not in ("fused", "foreach", "capturable")
            if not _same_kind(saved[key], live[key]) or (fixed and saved[key] != live[key]):
                raise ValueError(f"its {name} setting {key} is {quote(saved[key])}, not a value {name} takes")
    for index, moments in (optim.get("state") or {}).items():
        i = int(index)
        if not 0 <= i < len(params) or not isinstance(moments, dict):
            raise ValueError(f"its {name} state names parameter {index}, which this model lacks")
        for key, value in moments.items():
            if key != "step" and isinstance(value, torch.Tensor) and value.shape != params[i].shape:
                raise ValueError(
                    f"{name} {key} of parameter {i} has shape {tuple(value.shape)}, "
                    f"the parameter {tuple(params[i].shape)}"
                )


def _check_state_values(state: dict[str, Any]) -> None:
    if not all(state.get(k, 0) >= 0 for k in ("step", "tokens", "elapsed")) or not math.isfinite(
        state.get("elapsed", 0.0)
    ):
        raise ValueError("its step, tokens or elapsed time is negative or not finite")
    best = state.get("best_val_loss")
    if best is not None and not math.isfinite(best):
        raise ValueError(f"its best_val_loss is {best}")
    schedule, decay = state.get("schedule"), state.get("decay_from")
    if schedule is not None and not (
        len(schedule) == 2
        and _is_int(schedule[0])
        and schedule[0] >= 1
        and (schedule[1] is None or (_is_number(schedule[1]) and 0 < schedule[1] < math.inf))
    ):
        raise ValueError(f"its schedule {schedule} is not [max_iters, max_time or null]")
    if decay is not None and not (len(decay) == 3 and all(_is_number(x) and math.isfinite(x) for x in decay)):
        raise ValueError(f"its decay_from {decay} is not three numbers")


def _same_kind(value: Any, like: Any) -> bool:
    """Whether a saved optimizer setting is the kind of value the live one is (a flag, a
    whole number, a finite number within float32, a name, a list of such of the same
    length), so that the optimizer can take it."""
    if isinstance(like, bool) or like is None or isinstance(like, str):
        return type(value) is type(like) or (like is None and value is None)
    if isinstance(like, (list, tuple)):
        return (
            isinstance(value, (list, tuple)) and len(value) == len(like) and all(map(_same_kind, value, like))
        )
    if isinstance(like, int):
        return _is_int(value) and 0 <= value < 2**31
    if isinstance(like, float):
        return _is_number(value) and math.isfinite(value) and abs(value) <= 3.4e38
    return True  # (a tensor-valued setting: torch checks it)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)
