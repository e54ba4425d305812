"""`gptcli classify`: label (or choice) probabilities from a model finetuned with --task
classify (or choice)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcli.cli import render
from gptcli.cli.common import load_model, text_arg
from gptcli.config.verbs import ClassifySettings
from gptcli.data.inputs import check_input
from gptcli.errors import UsageError

if TYPE_CHECKING:
    from gptcli.data.records import Record


def classify(s: ClassifySettings) -> None:
    """Classify text with a finetuned classifier, or pick among choices.

    gptcli classify --ckpt runs/needs "The mole dug a tunnel."
    gptcli classify --ckpt runs/nli "A man plays." --text-b "Someone plays."
    gptcli classify --ckpt runs/reasons "The owl hunted because" --choice " it ate." --choice " it slept."
    gptcli classify --ckpt runs/needs --file test.jsonl --json
    """
    from gptcli.data.records import read_records
    from gptcli.tasks import accuracy, predict_records
    from gptcli.tasks.classify import is_pair

    file_records = None
    if s.file is not None:
        check_input(s.file, "--file")  # before the model is loaded
        file_records = read_records(s.file)
    # without --ckpt: the newest classifier of this kind of input (pairs of texts, or single ones)
    pairs = is_pair(file_records[0]) if file_records else None if s.choice else s.text_b is not None
    loaded = load_model(s.ckpt, s.device, s.dtype, classifier=True, base=s.base, pairs=pairs)
    kind = loaded.meta.get("task")
    if kind not in ("classify", "choice"):
        raise UsageError(
            f"{loaded.path} is not a classifier (its task is {kind or 'lm'}); "
            "make one with gptcli finetune --task classify (or choice)"
        )
    records = file_records if file_records is not None else _records(s, kind, loaded.path)
    device = next(loaded.model.parameters()).device
    predictions = predict_records(loaded.model, loaded.tokenizer, loaded.meta, records, device)
    key = "label" if kind == "classify" else "choice"
    if s.json_out:
        render.print_json(_document(predictions, key))
    elif file_records is None:  # one text: its probabilities (--file, even of one record: the table)
        p = predictions[0]
        order = sorted(range(len(p.probs)), key=lambda i: -p.probs[i])
        rows = [(rank, str(p.options[i]), p.probs[i], rank == 1) for rank, i in enumerate(order, 1)]
        render.probs_table(_shown(records[0].fields), rows, column=key)
    else:
        rows = [
            (_shown(r.fields), str(p.options[p.best]), p.probs[p.best],
             None if p.true is None else str(p.options[p.true]))
            for r, p in zip(records, predictions, strict=True)
        ]  # fmt: skip
        render.predictions_table(rows, accuracy(predictions), column=key)


def _records(s: ClassifySettings, kind: str, path: Path) -> list[Record]:
    """What to classify from the command line: the text (and --text-b or --choice)."""
    from gptcli.data.records import Record

    text = text_arg(" ".join(s.text or []))
    if kind == "choice":
        if len(s.choice) < 2 or s.text_b is not None:
            raise UsageError(
                f'{path} picks among choices: give the context and two or more --choice "..." options'
            )
        return [Record({"context": text, "choices": [text_arg(c) for c in s.choice]}, "the command line")]
    if s.choice:
        raise UsageError(f"{path} is a classifier; --choice is for models finetuned with --task choice")
    if s.text_b is not None:
        return [Record({"text_a": text, "text_b": text_arg(s.text_b)}, "the command line")]
    return [Record({"text": text}, "the command line")]


def _document(predictions: list[Any], key: str) -> dict[str, Any]:
    """What --json prints."""
    from gptcli.tasks import accuracy

    items = []
    for p in predictions:
        item = {key: p.options[p.best], "prob": p.probs[p.best]}
        item["probs"] = dict(zip(map(str, p.options), p.probs, strict=True)) if key == "label" else p.probs
        if p.true is not None:
            item["true"] = p.options[p.true]
        items.append(item)
    return {"accuracy": accuracy(predictions), "predictions": items}


def _shown(fields: dict) -> str:
    """A record's input text for the tables."""
    if "context" in fields:
        return str(fields["context"])
    if "text" in fields:
        return str(fields["text"])
    return f"{fields.get('text_a', '')} | {fields.get('text_b', '')}"
