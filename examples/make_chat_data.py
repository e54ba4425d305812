"""Write a small conversation set from the demo grammar (examples/make_demo_corpus.py), to
make a chat model from runs/demo in about a minute on a CPU.

    python examples/make_chat_data.py      # -> examples/chat/animals.jsonl, animals-test.jsonl

The user asks what an animal did and then why; the assistant answers in the corpus's own
words ("The fox dug a den." / "Because winter was coming."). Some conversations open with
a system message instead of asking why: every conversation fits the demo model's block of
64 tokens (at most 63 with its tokenizer and the two chat tokens). Deterministic: the same
seed writes the same files.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from make_demo_corpus import HABITS, REASONS, pick
from make_finetune_data import act

OUT = Path(__file__).parent / "chat"


def conversation(rng: random.Random) -> dict:
    animal = rng.choice(list(HABITS))
    action, need = act(rng, animal)
    messages = [{"role": "system", "content": "Be brief."}] if rng.random() < 0.2 else []
    messages += [
        {"role": "user", "content": f"What did the {animal} do?"},
        {"role": "assistant", "content": f"The {animal} {action}."},
    ]
    if len(messages) == 2 and rng.random() < 0.7:  # two exchanges fill the demo's 64-token block
        messages += [
            {"role": "user", "content": "Why?"},
            {"role": "assistant", "content": f"Because {pick(rng, REASONS[need])}."},
        ]
    return {"messages": messages}


def main() -> None:
    rng = random.Random(11)
    OUT.mkdir(exist_ok=True)
    for name, n in (("animals.jsonl", 1200), ("animals-test.jsonl", 100)):
        with open(OUT / name, "w", encoding="utf-8") as f:
            for _ in range(n):
                f.write(json.dumps(conversation(rng)) + "\n")
    print(f"wrote {OUT}/animals.jsonl, animals-test.jsonl")


if __name__ == "__main__":
    main()
