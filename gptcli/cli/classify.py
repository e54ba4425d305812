"""`gptcli classify`: label (or choice) probabilities from a model finetuned with --task
classify (or choice)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptcli.cli import render
from gptcli.cli.common import Base, Ckpt, Device, Dtype, Json, load_model, text_arg
from gptcli.data.inputs import check_input
from gptcli.errors import UsageError


def classify(
    text: Annotated[
        list[str] | None,
        typer.Argument(
            help="Text to classify (the first of a pair with --text-b), or the context of --choice.",
            show_default=False,
        ),
    ] = None,
    ckpt: Ckpt = None,
    base: Base = None,
    text_b: Annotated[str | None, typer.Option("--text-b", help="The second text of a pair.")] = None,
    choice: Annotated[
        list[str] | None,
        typer.Option("--choice", help="A choice for a multiple-choice model (give two or more)."),
    ] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Score every record of a JSONL/CSV file; accuracy if labelled."),
    ] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: Json = False,
) -> None:
    """Classify text with a finetuned classifier, or pick among choices.

    gptcli classify --ckpt runs/needs "The mole dug a tunnel."
    gptcli classify --ckpt runs/nli "A man plays." --text-b "Someone plays."
    gptcli classify --ckpt runs/reasons "The owl hunted because" --choice " it ate." --choice " it slept."
    gptcli classify --ckpt runs/needs --file test.jsonl --json
    """
    from gptcli.data.records import Record, read_records
    from gptcli.tasks import accuracy, predict_records

    if (text is None) == (file is None):
        raise UsageError("give a text to classify, or --file F.jsonl (one of the two)")
    if file is not None and (text_b is not None or choice):
        raise UsageError("--text-b and --choice go with a text argument; in --file they are record fields")
    if file is not None:
        check_input(file, "--file")  # before the model is loaded
    loaded = load_model(ckpt, device, dtype, decode=False, classifier=True, base=base)
    kind = loaded.meta.get("task")
    if kind not in ("classify", "choice"):
        raise UsageError(
            f"{loaded.path} is not a classifier (its task is {kind or 'lm'}); "
            "make one with gptcli finetune --task classify (or choice)"
        )
    if file is not None:
        records = read_records(file)
    elif kind == "choice":
        if not choice or len(choice) < 2 or text_b is not None:
            raise UsageError(
                f'{loaded.path} picks among choices: give the context and two or more --choice "..." options'
            )
        fields = {"context": text_arg(" ".join(text)), "choices": [text_arg(c) for c in choice]}
        records = [Record(fields, "the command line")]
    elif choice:
        raise UsageError(
            f"{loaded.path} is a classifier; --choice is for models finetuned with --task choice"
        )
    elif text_b is not None:
        fields = {"text_a": text_arg(" ".join(text)), "text_b": text_arg(text_b)}
        records = [Record(fields, "the command line")]
    else:
        records = [Record({"text": text_arg(" ".join(text))}, "the command line")]

    device_ = next(loaded.model.parameters()).device
    predictions = predict_records(loaded.model, loaded.tokenizer, loaded.meta, records, device_)
    acc = accuracy(predictions)
    key = "label" if kind == "classify" else "choice"
    if json_out:
        items = []
        for p in predictions:
            item = {key: p.options[p.best], "prob": p.probs[p.best]}
            item["probs"] = (
                dict(zip(map(str, p.options), p.probs, strict=True)) if key == "label" else p.probs
            )
            if p.true is not None:
                item["true"] = p.options[p.true]
            items.append(item)
        render.print_json({"accuracy": acc, "predictions": items})
        return
    if len(records) == 1:
        p = predictions[0]
        order = sorted(range(len(p.probs)), key=lambda i: -p.probs[i])
        rows = [(rank, str(p.options[i]), p.probs[i], rank == 1) for rank, i in enumerate(order, 1)]
        render.probs_table(_shown(records[0].fields), rows, column=key)
        return
    rows = [
        (
            _shown(r.fields),
            str(p.options[p.best]),
            p.probs[p.best],
            None if p.true is None else str(p.options[p.true]),
        )
        for r, p in zip(records, predictions, strict=True)
    ]
    render.predictions_table(rows, acc, column=key)


def _shown(fields: dict) -> str:
    """A record's input text for the tables."""
    if "context" in fields:
        return str(fields["context"])
    if "text" in fields:
        return str(fields["text"])
    return f"{fields.get('text_a', '')} | {fields.get('text_b', '')}"
