"""Evaluation: the GPT-2 paper's metrics for any model on any file, and GPT-1's accuracy
of a finetuned head.

text.py (perplexity, bits per byte and per character, sliding windows), lambada.py (last
word accuracy and perplexity), choice.py (zero-shot multiple choice), chat.py (a chat
model's assistant turns), heads.py (a
finetuned classify/choice model's own head); all score tokens through scoring.py.

A new evaluation is a module with a function (model, tokenizer, path, limit, progress) ->
Result, and one line in ZERO_SHOT below (and in RECORD_CHECKS, for one that reads records).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch.nn as nn

from gptcli.data.inputs import check_input
from gptcli.data.records import Record, read_records
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.evals.chat import evaluate_chat
from gptcli.evals.choice import choice_record, evaluate_choice
from gptcli.evals.heads import evaluate_head, head_records
from gptcli.evals.lambada import evaluate_lambada, lambada_record
from gptcli.evals.result import Result
from gptcli.evals.scoring import Progress
from gptcli.evals.text import evaluate_text

# --task NAME -> how a language model is scored on it
ZERO_SHOT: dict[str, Callable[..., Result]] = {
    "text": evaluate_text,
    "lambada": evaluate_lambada,
    "choice": evaluate_choice,
    "chat": evaluate_chat,
}
# --task NAME -> what reads one of its records, refusing a bad one (before any model scores)
RECORD_CHECKS: dict[str, Callable[[Record], object]] = {"lambada": lambada_record, "choice": choice_record}
HEADS = ("classify", "choice")  # finetuned tasks whose head eval uses


def guess_task(path: Path, flag: bool = True) -> str:
    """text for plain text and JSONL documents; choice for JSONL with choices, chat for
    conversations (never lambada). flag: whether the command has --task to say otherwise
    (eval has; a training run's --eval-file has not)."""
    if path.suffix.lower() not in (".jsonl", ".csv"):
        return "text"
    fields = read_records(path)[0].fields
    if "choices" in fields or "endings" in fields:
        return "choice"
    if "messages" in fields:
        return "chat"
    if "label" in fields:
        other = "or pass --task text to score the texts as text" if flag else "or give texts to score as text"
        raise UsageError(
            f"{path} holds labelled examples: score them with a model finetuned with --task classify, {other}"
        )
    if "text" in fields:
        return "text"
    if not flag:
        raise UsageError(f'{path}: cannot tell which evaluation it is for; give text, or JSONL of "text", '
                         '"choices" or "messages" records')  # fmt: skip
    raise UsageError(f"{path}: cannot tell which evaluation it is for; pass --task text, lambada or choice")


def labelled(path: Path) -> bool:
    """Whether a file holds classification records (a label, no choices): what only a
    model finetuned with --task classify scores."""
    if path.suffix.lower() not in (".jsonl", ".csv"):
        return False
    fields = read_records(path)[0].fields
    return "label" in fields and "choices" not in fields and "endings" not in fields


def plan(
    meta: dict, path: Path, task: str | None, flag: bool = True, limit: int | None = None
) -> tuple[str, str]:
    """(task, how): how is "head" when a finetuned classify/choice model scores with its
    own head (its task, unless --task asks for another), else "zero-shot". flag: as for
    guess_task. The file's first `limit` records (all: None) are read as the task reads
    them: a bad one is refused now, not once the files before it are scored."""
    kind = meta.get("task")
    if kind in HEADS and task in (None, kind):
        task, how = kind, "head"
    else:
        task = guess_task(path, flag) if task is None else task
        how = "zero-shot"
        if task not in ZERO_SHOT:
            raise UsageError(f"--task {task!r}: use one of {', '.join(ZERO_SHOT)}")
    if task != "text" and path.suffix.lower() not in (".jsonl", ".csv"):  # (read as JSON, line by line)
        scorer = f"a model finetuned with --task {task} scores" if how == "head" else f"--task {task} scores"
        instead = "; pass --task text to score it as text" if flag else ""
        raise UsageError(f"{path}: {scorer} JSONL or CSV records, not text{instead}")
    if how == "head":
        head_records(path, limit)
    elif task in RECORD_CHECKS:
        for r in read_records(path)[:limit]:
            RECORD_CHECKS[task](r)
    return task, how


@dataclass(frozen=True)
class FileEval:
    """A file scored at every evaluation of a training run (--eval-file), as planned."""

    label: str  # how reports name it: the file name, or the path where two names are alike
    path: Path
    task: str
    how: str


def plan_files(paths: list[str], meta: dict) -> list[FileEval]:
    """What each --eval-file of a run is scored as, decided (and its errors raised) before training."""
    names = [Path(p).name for p in paths]
    planned = []
    for p, name in zip(paths, names, strict=True):
        path = Path(p)
        check_input(path, "--eval-file")
        task, how = plan(meta, path, None, flag=False)
        planned.append(FileEval(name if names.count(name) == 1 else str(path), path, task, how))
    return planned


def evaluate(
    model: nn.Module,
    tokenizer: Tokenizer,
    meta: dict,
    path: Path,
    task: str,
    how: str,
    stride: int | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Result:
    """Score the model on a file as plan() decided."""
    check_input(path, "the file to score")
    if stride is not None and task != "text":
        raise UsageError("--stride is for --task text")
    if how == "head":
        return evaluate_head(model, tokenizer, meta, path, limit, progress)
    run = ZERO_SHOT[task]
    if task == "text":
        run = functools.partial(run, stride=stride)
    return run(model, tokenizer, path, limit=limit, progress=progress)


__all__ = [
    "HEADS", "ZERO_SHOT", "FileEval", "Result", "evaluate", "guess_task", "labelled", "plan", "plan_files",
]  # fmt: skip
