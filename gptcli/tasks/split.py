"""Which records of a finetuning file train and which validate, when no --val-data is given."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from gptcli.data.records import Record
from gptcli.errors import UsageError


def holdout(n: int, val_fraction: float, seed: int, source: str) -> tuple[list[int], list[int]]:
    """Indices of the training and validation records when validation is held out of the
    training file: a seeded random val_fraction of them."""
    if n < 2:
        raise UsageError(
            f"{source}: one record cannot be split into train and val; add records or give --val-data"
        )
    order = list(range(n))
    random.Random(seed).shuffle(order)
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    return sorted(order[n_val:]), sorted(order[:n_val])


def stratified_holdout(
    classes: Sequence[int], val_fraction: float, seed: int, source: str
) -> tuple[list[int], list[int]]:
    """Like holdout (as many records held out), class by class (classes: each record's
    class), so that training keeps every class: each class gives its share of the held-out
    records, rounded by largest remainder, and never its last record."""
    rng = random.Random(seed)
    by_class: dict[int, list[int]] = {}
    for i, c in enumerate(classes):
        by_class.setdefault(c, []).append(i)
    room = sum(len(m) - 1 for m in by_class.values())  # records that can go without emptying a class
    if room == 0:
        raise UsageError(
            f"{source}: too few records to hold some out for validation and still train on every "
            "class; add records, or give --val-data"
        )
    n_val = min(room, max(1, round(len(classes) * val_fraction)))
    share = {c: len(m) * n_val / len(classes) for c, m in by_class.items()}
    take = {c: min(int(q), len(by_class[c]) - 1) for c, q in share.items()}
    order = sorted(by_class, key=lambda c: (int(share[c]) - share[c], c))  # largest remainder first
    while sum(take.values()) < n_val:  # ends: n_val <= room
        for c in order:
            if sum(take.values()) < n_val and take[c] < len(by_class[c]) - 1:
                take[c] += 1
    train, val = [], []
    for c, members in by_class.items():
        rng.shuffle(members)
        val += members[: take[c]]
        train += members[take[c] :]
    return sorted(train), sorted(val)


def split_records(
    records: list[Record],
    val_records: list[Record] | None,
    convert: Callable[[list[Record]], list],
    val_fraction: float,
    seed: int,
    source: str,
    hold: Callable[[list], tuple[list[int], list[int]]] | None = None,
) -> dict[str, list]:
    """Convert every record in file order (so errors name the first bad line), then split:
    the --val-data records, or some held out of the training file by hold(examples) (by
    default a seeded random val_fraction)."""
    examples = convert(records)
    if val_records is not None:
        return {"train": examples, "val": convert(val_records)}
    if hold is None:
        train_idx, val_idx = holdout(len(examples), val_fraction, seed, source)
    else:
        train_idx, val_idx = hold(examples)
    return {"train": [examples[i] for i in train_idx], "val": [examples[i] for i in val_idx]}
