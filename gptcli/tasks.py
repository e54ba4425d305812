"""Training objectives: what one example is, how examples become a batch, and the loss.

The training loop draws example indices and hands them to a task; it knows nothing else
about the data. Pretraining is LMTask: next-token prediction on random windows of a token
stream. Finetuning adds GPT-1's supervised tasks (SupervisedTask: classification and
multiple choice with an auxiliary LM loss) and instruction tuning (SFTTask).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from gptcli.data import Record, read_records
from gptcli.errors import UsageError
from gptcli.model import IGNORE_INDEX
from gptcli.tokenizer import Tokenizer

Batch = dict[str, torch.Tensor]


class Task(Protocol):
    """The data side of training."""

    def num_examples(self, split: str) -> int:
        """Examples are indexed 0 .. num_examples - 1."""
        ...

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        """The examples `indices` of a split, as tensors on device."""
        ...

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Scalar loss to minimise (call inside the autocast context)."""
        ...

    def tokens(self, batch: Batch) -> int:
        """Tokens processed by a forward pass over batch (for tokens/s and MFU)."""
        ...

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        """Metrics over batches; must include "loss"."""
        ...


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class NextTokenTask:
    """Tasks whose batch is tokens "x" with next-token targets "y" (IGNORE_INDEX where no loss)."""

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        _, loss = model(batch["x"], batch["y"])
        return loss

    def tokens(self, batch: Batch) -> int:
        return batch["x"].numel()

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        losses = [self.loss(model, b).item() for b in batches]
        return {"loss": float(np.mean(losses))}


class LMTask(NextTokenTask):
    """Next-token prediction: example i is the window tokens[i : i + block_size + 1]."""

    fixed_length = True  # every batch is batch_size x block_size tokens

    def __init__(
        self, train: np.ndarray, val: np.ndarray, block_size: int, vocab_size: int | None = None
    ) -> None:
        for split, data in (("train", train), ("val", val)):
            if len(data) == 0 and split == "val":
                raise UsageError(
                    "the val split is empty (too little text, or tokenized with --val-fraction 0); "
                    "use more text or a --val-fraction above 0"
                )
            if len(data) < block_size + 1:
                raise UsageError(
                    f"the {split} split has {len(data)} tokens, fewer than block_size + 1 = "
                    f"{block_size + 1}; use more text or a smaller --block-size"
                )
        self.data = {"train": train, "val": val}
        self.block_size = block_size
        self.vocab_size = vocab_size  # ids at or beyond it are refused (a damaged or foreign shard)

    def num_examples(self, split: str) -> int:
        return len(self.data[split]) - self.block_size

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        data, T = self.data[split], self.block_size
        rows = np.stack([np.asarray(data[i : i + T + 1], dtype=np.int64) for i in indices.tolist()])
        if self.vocab_size is not None and rows.max() >= self.vocab_size:  # checked here, on the CPU
            raise UsageError(
                f"the {split} tokens hold id {int(rows.max())}, beyond the vocabulary of {self.vocab_size}; "
                "the tokenized data is damaged or of another tokenizer: tokenize the text again"
            )
        xy = torch.from_numpy(rows)  # (B, T + 1)
        return {"x": to_device(xy[:, :-1], device), "y": to_device(xy[:, 1:], device)}


# --- finetuning: GPT-1's supervised tasks, and instruction tuning --------------------------


def end_ids(tokenizer: Tokenizer) -> list[int]:
    """What closes a finetuning sequence (GPT-1's "extract" position): end-of-text, or a
    newline for tokenizers without one."""
    return [tokenizer.eot_id] if tokenizer.eot_id is not None else tokenizer.encode("\n")


def encode_parts(
    tokenizer: Tokenizer, parts: Sequence[str], delimiter: str, block_size: int, where: str
) -> list[int]:
    """GPT-1's input transformation: the parts joined by the delimiter, then the end token,
    cut from the left to fit block_size."""
    try:
        ids = tokenizer.encode(delimiter.join(parts)) + end_ids(tokenizer)
    except UsageError as e:
        raise UsageError(f"{where}: {e}") from None
    return ids[-block_size:]


def pad_batch(seqs: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token sequences into (N, T) with their lengths (N,)."""
    lengths = torch.tensor([len(s) for s in seqs])
    x = torch.zeros(len(seqs), int(lengths.max()), dtype=torch.long)
    for i, s in enumerate(seqs):
        x[i, : len(s)] = torch.tensor(s, dtype=torch.long)
    return x, lengths


def next_token_targets(x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Targets for language modelling each right-padded row: the next token, ignored past the end."""
    y = torch.full_like(x, IGNORE_INDEX)
    y[:, :-1] = x[:, 1:]
    positions = torch.arange(x.size(1))[None, :]
    y[positions >= (lengths[:, None] - 1)] = IGNORE_INDEX
    return y


@dataclass
class Example:
    """One supervised example: its token sequences and the index of the right answer."""

    seqs: list[list[int]]
    label: int


def macro_f1(pred: torch.Tensor, true: torch.Tensor) -> float:
    """Mean F1 over the classes that occur in the labels or the predictions."""
    scores = []
    for c in torch.cat([pred, true]).unique().tolist():
        tp = int(((pred == c) & (true == c)).sum())
        fp = int(((pred == c) & (true != c)).sum())
        fn = int(((pred != c) & (true == c)).sum())
        scores.append(2 * tp / max(1, 2 * tp + fp + fn))
    return float(np.mean(scores)) if scores else 0.0


class SupervisedTask:
    """GPT-1's finetuning: scores from the final hidden state of each sequence's last token,
    objective L3 = L2 (cross-entropy of the scores) + aux_lm_weight * L1 (next-token NLL on
    the same text).

    kind "classify": each example has one sequence (or two, both orders of a pair, whose
    last hidden states are added) and the head gives n_classes scores.
    kind "choice": each example has one sequence per choice; the head gives one score per
    sequence, and the scores of an example's choices go through a softmax."""

    def __init__(
        self, kind: str, splits: dict[str, list[Example]], aux_lm_weight: float, block_size: int
    ) -> None:
        self.kind = kind
        self.splits = splits
        self.aux_lm_weight = aux_lm_weight
        self.block_size = block_size

    def num_examples(self, split: str) -> int:
        return len(self.splits[split])

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        return self.collate([self.splits[split][i] for i in indices.tolist()], device)

    def collate(self, examples: Sequence[Example], device: torch.device) -> Batch:
        seqs = [s for e in examples for s in e.seqs]
        owner = torch.tensor([i for i, e in enumerate(examples) for _ in e.seqs])
        slot = torch.tensor([j for e in examples for j in range(len(e.seqs))])
        x, lengths = pad_batch(seqs)
        return {
            "x": to_device(x, device),
            "lengths": to_device(lengths, device),
            "y_lm": to_device(next_token_targets(x, lengths), device),
            "owner": to_device(owner, device),
            "slot": to_device(slot, device),
            "labels": to_device(torch.tensor([e.label for e in examples]), device),
        }

    def _forward(self, model: nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(scores (B, K), LM loss or None)."""
        h = model.hidden_states(batch["x"])  # (N, T, C)
        N, B = h.size(0), batch["labels"].size(0)
        last = h[torch.arange(N, device=h.device), batch["lengths"] - 1]  # (N, C)
        if self.kind == "classify":
            pooled = torch.zeros(B, h.size(-1), device=h.device, dtype=last.dtype).index_add(
                0, batch["owner"], last
            )
            scores = model.classifier(pooled)  # (B, K)
        else:
            per_seq = model.classifier(last).squeeze(-1).float()  # (N,)
            scores = torch.full((B, int(batch["slot"].max()) + 1), float("-inf"), device=h.device)
            scores[batch["owner"], batch["slot"]] = per_seq
        lm = None
        if self.aux_lm_weight > 0:
            logits = model.lm_head(h)
            lm = F.cross_entropy(
                logits.view(-1, logits.size(-1)), batch["y_lm"].view(-1), ignore_index=IGNORE_INDEX
            )
        return scores, lm

    def _losses(
        self, model: nn.Module, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        scores, lm = self._forward(model, batch)
        cls = F.cross_entropy(scores.float(), batch["labels"])
        total = cls if lm is None else cls + self.aux_lm_weight * lm
        return total, scores, lm

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        return self._losses(model, batch)[0]

    def tokens(self, batch: Batch) -> int:
        return batch["x"].numel()

    def evaluate(self, model: nn.Module, split: str, batches: Iterable[Batch]) -> dict[str, float]:
        totals, cls_losses, lm_losses, preds, labels = [], [], [], [], []
        for b in batches:
            total, scores, lm = self._losses(model, b)
            totals.append(total.item())
            cls_losses.append(F.cross_entropy(scores.float(), b["labels"]).item())
            if lm is not None:
                lm_losses.append(lm.item())
            preds.append(scores.argmax(-1).cpu())
            labels.append(b["labels"].cpu())
        pred, true = torch.cat(preds), torch.cat(labels)
        metrics = {"loss": float(np.mean(totals)), "cls_loss": float(np.mean(cls_losses))}
        if lm_losses:
            metrics["lm_loss"] = float(np.mean(lm_losses))
        metrics["accuracy"] = float((pred == true).float().mean())
        if self.kind == "classify":
            metrics["f1"] = macro_f1(pred, true)
        return metrics

    @torch.no_grad()
    def predict(self, model: nn.Module, examples: list[Example], device: torch.device) -> torch.Tensor:
        """Probabilities (len(examples), K) of each label (or choice)."""
        out = []
        for start in range(0, len(examples), 32):
            scores, _ = self._forward(model, self.collate(examples[start : start + 32], device))
            out.append(scores.float().softmax(-1).cpu())
        return torch.cat(out)


class SFTTask(NextTokenTask):
    """Instruction tuning: prompt + completion + end-of-text, with the loss on the
    completion (and end) tokens only."""

    def __init__(self, splits: dict[str, list[tuple[list[int], int]]], block_size: int) -> None:
        self.splits = splits  # (token ids, prompt length) per example
        self.block_size = block_size

    def num_examples(self, split: str) -> int:
        return len(self.splits[split])

    def batch(self, split: str, indices: torch.Tensor, device: torch.device) -> Batch:
        rows = [self.splits[split][i] for i in indices.tolist()]
        x, _ = pad_batch([ids[:-1] for ids, _ in rows])
        y = torch.full_like(x, IGNORE_INDEX)
        for i, (ids, n_prompt) in enumerate(rows):
            y[i, : len(ids) - 1] = sft_targets(ids, n_prompt)
        return {"x": to_device(x, device), "y": to_device(y, device)}


def sft_targets(ids: Sequence[int], n_prompt: int) -> torch.Tensor:
    """Next-token targets of ids[:-1], ignored where the target is still part of the prompt."""
    y = torch.tensor(ids[1:], dtype=torch.long)
    y[: max(0, n_prompt - 1)] = IGNORE_INDEX
    return y


# --- reading finetuning data ---------------------------------------------------------------


def _text(record: Record, key: str) -> str:
    value = record.fields.get(key)
    if not isinstance(value, str):
        what = "missing" if value is None else f"not a string ({value!r})"
        raise UsageError(f"{record.source}: '{key}' is {what}")
    return value


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
    if "text" in record.fields:
        return [encode_parts(tokenizer, [_text(record, "text")], delimiter, block_size, record.source)]
    if "text_a" in record.fields or "text_b" in record.fields:
        a, b = _text(record, "text_a"), _text(record, "text_b")
        seqs = [encode_parts(tokenizer, [a, b], delimiter, block_size, record.source)]
        if both_orders:
            seqs.append(encode_parts(tokenizer, [b, a], delimiter, block_size, record.source))
        return seqs
    raise UsageError(f"{record.source}: needs 'text', or 'text_a' and 'text_b' (and 'label')")


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
    context = _text(record, "context")
    return [
        encode_parts(tokenizer, [context, c], delimiter, block_size, record.source)
        for c in record_choices(record)
    ]


def choice_label(record: Record) -> int:
    label, n = record.fields.get("label"), len(record_choices(record))
    if isinstance(label, bool) or not isinstance(label, int) or not 0 <= label < n:
        raise UsageError(f"{record.source}: 'label' must be the index of the right choice (0 to {n - 1})")
    return label


def sft_examples(records: list[Record], tokenizer: Tokenizer, block_size: int) -> list[tuple[list[int], int]]:
    """(ids, prompt length) from {"prompt", "completion"} records: prompt + completion + end,
    the prompt cut from the left and then the completion from the right to fit."""
    out = []
    for r in records:
        prompt, completion = _text(r, "prompt"), _text(r, "completion")
        if not completion:
            raise UsageError(f"{r.source}: 'completion' is empty; there would be nothing to learn")
        try:
            p, c = tokenizer.encode(prompt), tokenizer.encode(completion) + end_ids(tokenizer)
        except UsageError as e:
            raise UsageError(f"{r.source}: {e}") from None
        room = block_size + 1  # the sequence feeds block_size tokens and predicts the next of each
        p = p[max(0, len(p) - max(1, room - len(c))) :]
        ids = (p + c)[:room]
        out.append((ids, len(p)))
    return out


def supervised_task(
    settings: dict,
    tokenizer: Tokenizer,
    block_size: int,
    seed: int,
    labels: list | None = None,
    split: str | None = "stratified",
) -> tuple[SupervisedTask | SFTTask, int, dict]:
    """A classify, choice or sft finetuning task from a run's settings (task, data, val_data,
    val_fraction, aux_lm_weight, delimiter, both_orders): the task, the number of outputs of
    its head (0 for none), and what the checkpoint must remember (the labels, how validation
    was held out). labels: the label set of a run being resumed (else taken from the data).
    split: "stratified" holds out classification records class by class; None is the plain
    random holdout of runs made before."""
    kind = settings["task"]
    source = settings["data"][0]
    records = read_records(source)
    val_records = read_records(settings["val_data"]) if settings["val_data"] else None
    extra: dict = {}
    if kind == "classify":
        labels = label_set(records) if labels is None else labels
        extra = {"labels": labels, "split": split}

    def split_records(convert: Callable[[list[Record]], list]) -> dict[str, list]:
        """Convert every record in file order (so errors name the first bad line), then split."""
        examples = convert(records)
        if val_records is not None:
            val = convert(val_records)
            if kind == "classify":
                _check_val_classes(val_records, val, {e.label for e in examples}, labels)
            return {"train": examples, "val": val}
        if kind == "classify" and split == "stratified":
            classes = [e.label for e in examples]
            train_idx, val_idx = stratified_holdout(classes, settings["val_fraction"], seed, source)
        else:
            train_idx, val_idx = holdout(len(records), settings["val_fraction"], seed, source)
        return {"train": [examples[i] for i in train_idx], "val": [examples[i] for i in val_idx]}

    delimiter, weight = settings["delimiter"], settings["aux_lm_weight"]
    if kind == "sft":
        return SFTTask(split_records(lambda rs: sft_examples(rs, tokenizer, block_size)), block_size), 0, {}
    if kind == "choice":
        splits = split_records(lambda rs: choice_examples(rs, tokenizer, block_size, delimiter))
        return SupervisedTask("choice", splits, weight, block_size), 1, {}
    if kind != "classify":
        raise UsageError(f"--task {kind!r}: use one of lm, classify, choice, sft")
    both = settings["both_orders"]
    splits = split_records(lambda rs: classify_examples(rs, tokenizer, block_size, labels, delimiter, both))
    return SupervisedTask("classify", splits, weight, block_size), len(labels), extra


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


# --- using a finetuned classifier ----------------------------------------------------------


@dataclass
class Prediction:
    """A classify or choice model's answer for one record."""

    options: list  # the run's labels, or the record's choices
    probs: list[float]  # one per option
    true: int | None  # the index of the right option, where the record gives it

    @property
    def best(self) -> int:
        return max(range(len(self.probs)), key=self.probs.__getitem__)


def predict_records(
    model: nn.Module, tokenizer: Tokenizer, meta: dict, records: list[Record], device: torch.device
) -> list[Prediction]:
    """Score records with a run finetuned by --task classify or choice; meta is its checkpoint.json."""
    kind, block = meta.get("task"), model.config.block_size
    if kind == "classify":
        labels, index = meta["labels"], label_index(meta["labels"])
        seqs = [
            classify_sequences(r, tokenizer, block, meta["delimiter"], meta["both_orders"]) for r in records
        ]
        options = [labels] * len(records)
        trues = [record_label(r, index, labels) if "label" in r.fields else None for r in records]
    elif kind == "choice":
        seqs = [choice_sequences(r, tokenizer, block, meta["delimiter"]) for r in records]
        options = [record_choices(r) for r in records]
        trues = [choice_label(r) if "label" in r.fields else None for r in records]
    else:
        raise UsageError(
            f"the model is not a classifier (its task is {kind or 'lm'}); make one with "
            "gptcli finetune --task classify (or choice)"
        )
    examples = [Example(s, 0) for s in seqs]
    probs = SupervisedTask(kind, {}, 0.0, block).predict(model, examples, device)
    return [
        Prediction(opts, probs[i, : len(opts)].tolist(), true)
        for i, (opts, true) in enumerate(zip(options, trues, strict=True))
    ]


def accuracy(predictions: Sequence[Prediction]) -> float | None:
    """Share of the labelled predictions that are right (None when no record has a label)."""
    labelled = [p for p in predictions if p.true is not None]
    return sum(p.best == p.true for p in labelled) / len(labelled) if labelled else None
