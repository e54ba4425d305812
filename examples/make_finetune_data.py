"""Write small finetuning sets from the demo grammar (examples/make_demo_corpus.py).

    python examples/make_finetune_data.py       # -> examples/finetune/*.jsonl

- needs.jsonl    classify: what an animal did -> why ("shelter", "food", "rest", "play")
- reasons.jsonl  choice: "The fox dug a den because" -> the right reason among three
- why.jsonl      sft: "Why did the fox dig a den?" -> " Because winter was coming."
- needs-test.jsonl  more records like needs.jsonl, drawn after it, to score a classifier on
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from make_demo_corpus import HABITS, OBJECTS, REASONS, pick

OUT = Path(__file__).parent / "finetune"


def act(rng: random.Random, animal: str) -> tuple[str, str]:
    habits = HABITS[animal]
    action, need, _ = rng.choices(habits, weights=[w for *_, w in habits])[0]
    if "{obj}" in action:
        action = action.format(obj=pick(rng, OBJECTS[(animal, action.split()[0])]))
    return action, need


def question(animal: str, action: str) -> str:
    """'dug a hole' -> 'Why did the rabbit dig a hole?'"""
    verbs = {"dug": "dig", "ate": "eat", "hid": "hide", "slept": "sleep", "hunted": "hunt", "ran": "run",
             "buried": "bury", "climbed": "climb", "built": "build", "found": "find", "sang": "sing",
             "cut": "cut", "swam": "swim", "caught": "catch", "rolled": "roll", "floated": "float",
             "watched": "watch", "sat": "sit"}  # fmt: skip
    verb, rest = action.split(" ", 1)
    return f"Why did the {animal} {verbs[verb]} {rest}?"


def main() -> None:
    rng = random.Random(7)
    OUT.mkdir(exist_ok=True)
    animals = list(HABITS)
    with open(OUT / "needs.jsonl", "w", encoding="utf-8") as f:
        for _ in range(600):
            animal = rng.choice(animals)
            action, need = act(rng, animal)
            f.write(json.dumps({"text": f"The {animal} {action}.", "label": need}) + "\n")
    with open(OUT / "reasons.jsonl", "w", encoding="utf-8") as f:
        for _ in range(400):
            animal = rng.choice(animals)
            action, need = act(rng, animal)
            wrong = rng.sample([n for n in REASONS if n != need], 2)
            choices = [pick(rng, REASONS[n]) for n in [need, *wrong]]
            rng.shuffle(choices)
            right = choices.index(next(c for c in choices if c in dict(REASONS[need])))
            context = f"The {animal} {action} because"
            f.write(
                json.dumps({"context": context, "choices": [f" {c}." for c in choices], "label": right})
                + "\n"
            )
    with open(OUT / "why.jsonl", "w", encoding="utf-8") as f:
        for _ in range(400):
            animal = rng.choice(animals)
            action, need = act(rng, animal)
            reason = pick(rng, REASONS[need])
            f.write(
                json.dumps({"prompt": question(animal, action) + "\n", "completion": f"Because {reason}."})
                + "\n"
            )
    # drawn last, so the files above stay as they were
    with open(OUT / "needs-test.jsonl", "w", encoding="utf-8") as f:
        for _ in range(8):
            animal = rng.choice(animals)
            action, need = act(rng, animal)
            f.write(json.dumps({"text": f"The {animal} {action}.", "label": need}) + "\n")
    print(f"wrote {OUT}/needs.jsonl, reasons.jsonl, why.jsonl, needs-test.jsonl")


if __name__ == "__main__":
    main()
