"""`gptcli classify`: label probabilities from a model finetuned with --task classify."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptcli.cli import render
from gptcli.cli.common import Ckpt, Device, Dtype, Json, load_model, text_arg
from gptcli.errors import UsageError


def classify(
    text: Annotated[
        list[str] | None,
        typer.Argument(help="Text to classify (the first of a pair with --text-b).", show_default=False),
    ] = None,
    ckpt: Ckpt = None,
    text_b: Annotated[str | None, typer.Option("--text-b", help="The second text of a pair.")] = None,
    file: Annotated[
        Path | None,
        typer.Option("--file", "-f", help="Classify every record of a JSONL/CSV file; accuracy if labelled."),
    ] = None,
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: Json = False,
) -> None:
    """Classify text with a finetuned classifier.

    gptcli classify --ckpt runs/needs "The mole dug a tunnel."
    gptcli classify --ckpt runs/nli "A man plays." --text-b "Someone plays."
    gptcli classify --ckpt runs/needs --file test.jsonl --json
    """
    from gptcli.data import Record, read_records
    from gptcli.tasks import Example, SupervisedTask, classify_sequences

    if (text is None) == (file is None):
        raise UsageError("give a text to classify, or --file F.jsonl (one of the two)")
    if file is not None and text_b is not None:
        raise UsageError("--text-b goes with a text argument; in --file, pairs are text_a/text_b fields")
    loaded = load_model(ckpt, device, dtype)
    meta = loaded.meta
    if meta.get("task") != "classify":
        raise UsageError(
            f"{loaded.path} is not a classifier (its task is {meta.get('task', 'lm')}); "
            "make one with gptcli finetune --task classify"
        )
    labels = meta["labels"]
    if file is not None:
        records = read_records(file)
    elif text_b is not None:
        records = [
            Record({"text_a": text_arg(" ".join(text)), "text_b": text_arg(text_b)}, "the command line")
        ]
    else:
        records = [Record({"text": text_arg(" ".join(text))}, "the command line")]
    block = loaded.model.config.block_size
    examples = [
        Example(classify_sequences(r, loaded.tokenizer, block, meta["delimiter"], meta["both_orders"]), 0)
        for r in records
    ]
    task = SupervisedTask("classify", {}, 0.0, block)
    device_ = next(loaded.model.parameters()).device
    probs = task.predict(loaded.model, examples, device_)

    label_index = {repr(label): i for i, label in enumerate(labels)}
    predictions, correct, labelled = [], 0, 0
    for r, p in zip(records, probs.tolist(), strict=True):
        best = max(range(len(labels)), key=lambda i: p[i])
        item = {"label": labels[best], "prob": p[best], "probs": dict(zip(map(str, labels), p, strict=True))}
        if "label" in r.fields:
            if repr(r.fields["label"]) not in label_index:
                known = ", ".join(map(str, labels))
                raise UsageError(
                    f"{r.source}: label {r.fields['label']!r} is not one of the model's ({known})"
                )
            item["true"] = r.fields["label"]
            labelled += 1
            correct += r.fields["label"] == labels[best]
        predictions.append(item)
    accuracy = correct / labelled if labelled else None
    if json_out:
        render.print_json({"accuracy": accuracy, "predictions": predictions})
        return
    if len(records) == 1:
        order = sorted(range(len(labels)), key=lambda i: -probs[0, i])
        rows = [(rank, str(labels[i]), float(probs[0, i]), rank == 1) for rank, i in enumerate(order, 1)]
        what = (
            records[0].fields.get("text") or f"{records[0].fields['text_a']} | {records[0].fields['text_b']}"
        )
        render.probs_table(what, rows, column="label")
        return
    render.predictions_table(records, predictions, accuracy)
