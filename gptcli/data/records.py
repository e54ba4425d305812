"""Finetuning records: the rows of a JSONL or CSV file, each with where it came from (for
error messages), and the content hash that tells a run its data."""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from gptcli.data.inputs import check_input
from gptcli.data.sources import BOM, READ_BYTES, iter_file_text, iter_jsonl
from gptcli.errors import UsageError


@dataclass
class Record:
    """One row of a finetuning file, with where it came from (for error messages)."""

    fields: dict
    source: str  # "file:line"


def _csv_error(path: Path, lines: list[str], start: int, end: int, what: str) -> UsageError:
    """A CSV error at the line that caused it: where a quote opened and was not closed at
    the end of its line, if the row ran on past it; else where the row starts."""
    quoted = False
    for lineno in range(start, min(end, len(lines)) + 1):
        opened_here = False
        for ch in lines[lineno - 1]:
            if ch == '"':
                quoted = not quoted
                opened_here = quoted
        if quoted and (opened_here or lineno == start):
            return UsageError(f'{path}:{lineno}: a quote (") opened on this line is not closed ({what})')
    return UsageError(f"{path}:{start}: {what}")


def read_records(path: str | os.PathLike) -> list[Record]:
    """Rows of a JSONL file (one JSON object per line) or a CSV file with a header row."""
    path = Path(path)
    check_input(path, "the records file")
    records: list[Record] = []
    if path.suffix.lower() == ".csv":
        text = "".join(iter_file_text(path)).removeprefix(BOM)
        reader = csv.reader(io.StringIO(text, newline=""), strict=True)
        lines = re.split(r"\r\n|\r|\n", text)  # the line ends csv counts (not str.splitlines' \u2028 ...)
        header: list[str] | None = None
        while True:
            start = reader.line_num + 1  # quoted cells may span lines: a row starts here
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                raise _csv_error(path, lines, start, reader.line_num, str(e)) from None
            if header is None:
                header = [h.strip() for h in row]
                continue
            if not any(cell.strip() for cell in row):
                continue
            if len(row) != len(header):
                what = f"{len(row)} columns, but the header has {len(header)}"
                raise _csv_error(path, lines, start, reader.line_num, what)
            records.append(Record(dict(zip(header, row, strict=True)), f"{path}:{start}"))
        if header is None:
            raise UsageError(f"{path}: empty file; it needs a header row and at least one record")
    else:
        for lineno, obj in iter_jsonl(path, "one JSON object"):
            records.append(Record(obj, f"{path}:{lineno}"))
    if not records:
        raise UsageError(f"{path}: no records in the file")
    return records


def choice_index(record: Record, label: object, n: int) -> int:
    """The index of the right one of n choices: an int, or a string of digits (HellaSwag
    writes "3"); else record's file:line error."""
    if isinstance(label, str) and label.strip().isdigit():
        label = int(label)
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < n:
        what = f"{record.source}: label {label!r}"
        raise UsageError(f"{what} must be the index of the right choice (0 to {n - 1})")
    return label


def content_sha256(paths: Sequence[str | os.PathLike | None]) -> str:
    """One hash of the bytes of these files, in order (None: no file), to recognise data."""
    digest = hashlib.sha256()
    for p in paths:
        digest.update(b"\0file\0")
        if p is None:
            continue
        with open(p, "rb") as f:
            while block := f.read(READ_BYTES):
                digest.update(block)
    return digest.hexdigest()
