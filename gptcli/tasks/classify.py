"""--task classify: {"text", "label"} or {"text_a", "text_b", "label"} records."""

from __future__ import annotations

import json
from collections.abc import Sequence

from gptcli.data.records import Record
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.tasks.base import Source, encode_parts, record_text
from gptcli.tasks.split import stratified_holdout
from gptcli.tasks.supervised import Example, SupervisedTask


def label_set(records: list[Record]) -> list:
    """The labels these classification records use, sorted; at least two, all strings or
    all integers (0 and "0" would otherwise be two classes)."""
    seen: list = []
    first: Record | None = None
    for r in records:
        if "label" not in r.fields:
            raise UsageError(f"{r.source}: 'label' is missing")
        value = r.fields["label"]
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise UsageError(
                f"{r.source}: label {json.dumps(value)} is not a string or an integer; "
                "write every label as a string (or every label as an integer)"
            )
        if first is None:
            first = r
        elif type(value) is not type(first.fields["label"]):
            raise UsageError(
                f"{r.source}: label {json.dumps(value)} is {_kind(value)}, but {first.source} has "
                f"{json.dumps(first.fields['label'])}, {_kind(first.fields['label'])}; write every label "
                'the same way (0 and "0" would be two classes)'
            )
        if value not in seen:
            seen.append(value)
    if len(seen) < 2:
        raise UsageError(
            f"{records[0].source.rsplit(':', 1)[0]}: every record has label {seen[0]!r}; "
            "classification needs at least two classes"
        )
    return sorted(seen, key=str)


def _kind(value: object) -> str:
    return "a string" if isinstance(value, str) else "an integer"


def classify_examples(
    records: list[Record],
    tokenizer: Tokenizer,
    block_size: int,
    labels: list,
    delimiter: str,
    both_orders: bool,
) -> list[Example]:
    """Examples from {"text", "label"} or {"text_a", "text_b", "label"} records, whose
    labels index into labels (the run's label set)."""
    index = label_index(labels)
    examples = []
    for r in records:
        label = record_label(r, index, labels)  # before the text, whose encoding may fail too
        examples.append(Example(classify_sequences(r, tokenizer, block_size, delimiter, both_orders), label))
    return examples


def label_index(labels: Sequence) -> dict[str, int]:
    """Position of each label, keyed by its JSON form (so 1 and "1" stay apart)."""
    return {json.dumps(label): i for i, label in enumerate(labels)}


def record_label(record: Record, index: dict[str, int], labels: Sequence) -> int:
    """The index of a record's "label" among the run's labels."""
    value = record.fields.get("label")
    if json.dumps(value) not in index:
        raise UsageError(
            f"{record.source}: label {value!r} is not one of the training labels "
            f"({', '.join(map(str, labels))})"
        )
    return index[json.dumps(value)]


def classify_sequences(
    record: Record, tokenizer: Tokenizer, block_size: int, delimiter: str, both_orders: bool
) -> list[list[int]]:
    """The model input of one classification record: "text", or the pair "text_a", "text_b"
    joined by the delimiter (and, with both_orders, the pair the other way round too)."""
    if "text" in record.fields and ("text_a" in record.fields or "text_b" in record.fields):
        raise UsageError(f"{record.source}: has 'text' and 'text_a'/'text_b'; give one text or a pair")
    if "text" in record.fields:
        return [encode_parts(tokenizer, [record_text(record, "text")], delimiter, block_size, record.source)]
    if "text_a" in record.fields or "text_b" in record.fields:
        a, b = record_text(record, "text_a"), record_text(record, "text_b")
        seqs = [encode_parts(tokenizer, [a, b], delimiter, block_size, record.source)]
        if both_orders:
            seqs.append(encode_parts(tokenizer, [b, a], delimiter, block_size, record.source))
        return seqs
    raise UsageError(f"{record.source}: needs 'text', or 'text_a' and 'text_b' (and 'label')")


def _check_val_classes(
    val_records: list[Record], val: list[Example], train_classes: set[int], labels: list
) -> None:
    """Refuse validation records of a class that training never sees."""
    for r, e in zip(val_records, val, strict=True):
        c = e.label
        if c not in train_classes:
            raise UsageError(
                f"{r.source}: label {labels[c]!r} has no training record; add some to the training "
                "file, or leave such records out of validation"
            )


def build(src: Source) -> tuple[SupervisedTask, int, dict]:
    """The task, its head's outputs (one per label) and what the checkpoint must remember:
    the labels, and how validation was held out (class by class for new runs)."""
    s = src.settings
    if s["both_orders"] and not any("text_b" in r.fields for r in src.records):
        raise UsageError(
            f"--both-orders trains on pairs of texts both ways round; {s['data'][0]} holds single "
            '"text" records (pairs are "text_a" and "text_b"): drop --both-orders'
        )
    labels = label_set(src.records) if src.labels is None else src.labels

    def convert(records: list[Record]) -> list[Example]:
        return classify_examples(
            records, src.tokenizer, src.block_size, labels, s["delimiter"], s["both_orders"]
        )

    def stratified(examples: list[Example]) -> tuple[list[int], list[int]]:
        return stratified_holdout([e.label for e in examples], s["val_fraction"], src.seed, s["data"][0])

    splits = src.examples(convert, stratified if src.split == "stratified" else None)
    if src.val_records is not None:
        _check_val_classes(src.val_records, splits["val"], {e.label for e in splits["train"]}, labels)
    task = SupervisedTask("classify", splits, s["aux_lm_weight"], src.block_size)
    extra: dict = {"labels": labels, "split": src.split}
    shapes = {is_pair(r) for r in src.records}
    if len(shapes) == 1 and None not in shapes:  # what classify takes: texts or pairs (mixed: not said)
        extra["pairs"] = shapes.pop()
    return task, len(labels), extra


def is_pair(record: Record) -> bool | None:
    """Whether a classification record is a pair of texts ("text_a", "text_b") rather than
    one ("text"), as classify_sequences reads it; None for both or neither (which it refuses)."""
    text, pair = "text" in record.fields, "text_a" in record.fields or "text_b" in record.fields
    return None if text == pair else pair  # (both, or neither: classify_sequences says which)


def check_shape(record: Record, pairs: bool | None) -> None:
    """Refuse a record of the other kind than a classifier was trained on (pairs: what its
    checkpoint says; None for classifiers trained on both kinds, or made before it said)."""
    shape = is_pair(record)
    if pairs is None or shape is None or shape == pairs:
        return
    if pairs:
        raise UsageError(
            f"{record.source}: this classifier was trained on pairs of texts; give a pair "
            '(the second text with --text-b, or "text_a" and "text_b" in a file)'
        )
    raise UsageError(
        f"{record.source}: this classifier was trained on single texts, not pairs; give one text "
        '(without --text-b, or "text" in a file)'
    )
