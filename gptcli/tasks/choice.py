"""--task choice: {"context", "choices": [...], "label": i} records, one sequence per choice."""

from __future__ import annotations

from gptcli.data.records import Record, choice_index
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.tasks.base import Source, encode_parts, record_text
from gptcli.tasks.supervised import Example, SupervisedTask


def choice_examples(
    records: list[Record], tokenizer: Tokenizer, block_size: int, delimiter: str
) -> list[Example]:
    """Examples from {"context", "choices": [...], "label": i} records, one sequence per choice."""
    examples = []
    for r in records:
        label = choice_label(r)  # before the text, whose encoding may fail too
        examples.append(Example(choice_sequences(r, tokenizer, block_size, delimiter), label))
    return examples


def record_choices(record: Record) -> list[str]:
    choices = record.fields.get("choices")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise UsageError(f"{record.source}: 'choices' must be a list of at least two strings")
    return choices


def choice_sequences(
    record: Record, tokenizer: Tokenizer, block_size: int, delimiter: str
) -> list[list[int]]:
    """The model inputs of one multiple-choice record: context, delimiter, choice (for each)."""
    context = record_text(record, "context")
    return [
        encode_parts(tokenizer, [context, c], delimiter, block_size, record.source)
        for c in record_choices(record)
    ]


def choice_label(record: Record) -> int:
    return choice_index(record, record.fields.get("label"), len(record_choices(record)))


def build(src: Source) -> tuple[SupervisedTask, int, dict]:
    """The task, its head's outputs per sequence (one score) and nothing more to remember."""
    delimiter = src.settings["delimiter"]
    splits = src.examples(lambda rs: choice_examples(rs, src.tokenizer, src.block_size, delimiter))
    return SupervisedTask("choice", splits, src.settings["aux_lm_weight"], src.block_size), 1, {}
