"""Training objectives: what one example is, how examples become a batch, and the loss.

The training loop draws example indices and hands them to a Task (base.py); it knows
nothing else about the data. Pretraining is LMTask (lm.py): next-token prediction on
random windows of a token stream. Finetuning adds GPT-1's supervised tasks (supervised.py,
read by classify.py and choice.py), instruction tuning (sft.py) and conversations
(chat.py); predict.py uses a finetuned classifier.

A new finetuning task is a module with a build(Source) function, one line in FINETUNE
below, and its name in config.FINETUNE_TASKS.
"""

from __future__ import annotations

from collections.abc import Callable

from gptcli.data.records import read_records
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.tasks import chat, choice, classify, sft
from gptcli.tasks.base import Batch, NextTokenTask, Source, Task, to_device
from gptcli.tasks.lm import LMTask
from gptcli.tasks.predict import Prediction, accuracy, predict_records
from gptcli.tasks.sft import SFTTask, sft_examples, sft_targets
from gptcli.tasks.split import holdout, stratified_holdout
from gptcli.tasks.supervised import Example, SupervisedTask

# --task NAME (besides lm, which trains on text as pretraining does) -> its builder
FINETUNE: dict[str, Callable[[Source], tuple[Task, int, dict]]] = {
    "classify": classify.build,
    "choice": choice.build,
    "sft": sft.build,
    "chat": chat.build,
}


def supervised_task(
    settings: dict,
    tokenizer: Tokenizer,
    block_size: int,
    seed: int,
    labels: list | None = None,
    split: str | None = "stratified",
) -> tuple[Task, int, dict]:
    """A finetuning task on records from a run's settings (task, data, val_data,
    val_fraction, aux_lm_weight, delimiter, both_orders): the task, the number of outputs of
    its head (0 for none), and what the checkpoint must remember (the labels, how validation
    was held out). labels: the label set of a run being resumed (else taken from the data).
    split: "stratified" holds out classification records class by class; None is the plain
    random holdout of runs made before."""
    kind = settings["task"]
    if kind not in FINETUNE:
        raise UsageError(f"--task {kind!r}: use one of lm, {', '.join(FINETUNE)}")
    records = read_records(settings["data"][0])
    val_records = read_records(settings["val_data"]) if settings["val_data"] else None
    return FINETUNE[kind](Source(records, val_records, settings, tokenizer, block_size, seed, labels, split))


__all__ = [
    "FINETUNE", "Batch", "Example", "LMTask", "NextTokenTask", "Prediction", "SFTTask", "Source",
    "SupervisedTask", "Task", "accuracy", "holdout", "predict_records", "sft_examples", "sft_targets",
    "stratified_holdout", "supervised_task", "to_device",
]  # fmt: skip
