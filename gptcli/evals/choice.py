"""--task choice: zero-shot multiple choice (HellaSwag, CBT, Winograd, StoryCloze).

JSONL of {"context"|"ctx", "choices"|"endings", "label"}. Each choice is scored as
lm-evaluation-harness does: the sum of the log-probabilities of its tokens after the
context, joined by one space when the context does not end with whitespace and the choice
does not start with it. acc ranks the choices by the sum; acc_norm by the sum over the
choice's length in characters as written in the file.
"""

from __future__ import annotations

from pathlib import Path

import torch.nn as nn

from gptcli.data.records import Record, choice_index
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.evals.examples import Pair, cut_warning, field, pair, records
from gptcli.evals.result import Result
from gptcli.evals.scoring import Progress, Scores, score, score_shared


def delimiter(context: str, choice: str) -> str:
    return " " if context and not context[-1].isspace() and not choice[:1].isspace() else ""


def choice_record(r: Record) -> tuple[str, list[str], int]:
    """(context, choices, label) of a record, or a file:line error."""
    context = field(r, "context", "ctx")
    choices = field(r, "choices", "endings")
    if not isinstance(context, str):
        raise UsageError(f"{r.source}: the context must be a string")
    if not isinstance(choices, list) or len(choices) < 2 or not all(isinstance(c, str) for c in choices):
        raise UsageError(f"{r.source}: the choices must be a list of at least two strings")
    if not all(choices):
        raise UsageError(f"{r.source}: choice {choices.index('')} is empty")
    return context, choices, choice_index(r, field(r, "label"), len(choices))


def evaluate_choice(
    model: nn.Module,
    tokenizer: Tokenizer,
    path: Path,
    limit: int | None = None,
    progress: Progress | None = None,
) -> Result:
    block = model.config.block_size
    rows = records(path, limit)
    parsed = [choice_record(r) for r in rows]
    pairs: list[list[Pair]] = [
        [pair(tokenizer, ctx, delimiter(ctx, c) + c, block, r.source) for c in choices]
        for r, (ctx, choices, _) in zip(rows, parsed, strict=True)
    ]
    per_example = score_choices(model, pairs, progress)
    correct = correct_norm = 0
    examples = []
    for r, (_, choices, label), scores in zip(rows, parsed, per_example, strict=True):
        sums = [-s.nll for s in scores]
        norms = [s / len(c) for s, c in zip(sums, choices, strict=True)]
        pred, pred_norm = _argmax(sums), _argmax(norms)
        correct += pred == label
        correct_norm += pred_norm == label
        examples.append(
            {
                "source": r.source,
                "label": label,
                "pred": pred,
                "pred_norm": pred_norm,
                "logprob": sums,
                "logprob_per_char": norms,
            }
        )
    metrics = {
        "task": "choice",
        "n": len(rows),
        "acc": correct / len(rows),
        "acc_norm": correct_norm / len(rows),
    }
    warning = cut_warning(path, rows, pairs, block)
    return Result(metrics, examples, [warning] if warning else [])


def score_choices(model: nn.Module, pairs: list[list[Pair]], progress: Progress | None) -> list[list[Scores]]:
    """Each example's choices, its context read once for all of them (score_shared); an
    example cut to fit the block, whose choices then see different contexts, or one that
    fills it (the model reading all but a sequence's last token), one sequence at a time."""
    block = model.config.block_size
    apart = [any(p.cut or len(p.ids) > block for p in ps) for ps in pairs]  # (shared: all of each read)
    whole = [e for e in range(len(pairs)) if apart[e]]
    shared = [e for e in range(len(pairs)) if not apart[e]]
    out: list[list[Scores]] = [[] for _ in pairs]
    prefixes = [pairs[e][0].ids[: pairs[e][0].first] for e in shared]
    continuations = [[p.ids[p.first :] for p in pairs[e]] for e in shared]
    for e, scores in zip(shared, score_shared(model, prefixes, continuations, progress), strict=True):
        out[e] = scores
    flat = [p for e in whole for p in pairs[e]]
    scores = iter(score(model, [p.ids for p in flat], [p.first for p in flat]))
    for e in whole:
        out[e] = [next(scores) for _ in pairs[e]]
    return out


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)
