"""Write small evaluation sets from the demo grammar (examples/make_demo_corpus.py), for
`gptcli eval` on the demo model.

    python examples/make_eval_sets.py       # -> examples/eval/

- held-out.jsonl stories the demo corpus does not hold (another seed), one document a line
                 as in the corpus: --task text
- lambada.jsonl  stories whose last word needs the story: the animal's home after
                 "It felt safe in its", or the animal again after "Later, the": --task lambada
- choice.jsonl   "The fox dug a den because" -> the right reason among one per need: --task choice
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from make_demo_corpus import AFTER, HABITS, HOMES, OBJECTS, OPENINGS, REASONS, pick, sentence, story

OUT = Path(__file__).parent / "eval"


def lambada_text(rng: random.Random) -> str:
    animal = rng.choice(list(HABITS))
    first, need = sentence(rng, animal, pick(rng, OPENINGS))
    if need == "shelter" and rng.random() < 0.6:
        return f"{first} It felt safe in its {HOMES[animal]}"
    after = pick(rng, AFTER[need]).format(home=HOMES[animal])
    return f"{first} {after} Later, the {animal}"


def choice_record(rng: random.Random) -> dict:
    animal = rng.choice(list(HABITS))
    habits = HABITS[animal]
    action, need, _ = rng.choices(habits, weights=[w for *_, w in habits])[0]
    if "{obj}" in action:
        action = action.format(obj=pick(rng, OBJECTS[(animal, action.split()[0])]))
    needs = list(REASONS)
    rng.shuffle(needs)
    choices = [f" {pick(rng, REASONS[n])}." for n in needs]
    return {"context": f"The {animal} {action} because", "choices": choices, "label": needs.index(need)}


def main() -> None:
    rng = random.Random(2026)  # not the corpus's seed: these stories are new to the model
    OUT.mkdir(exist_ok=True)
    with open(OUT / "held-out.jsonl", "w", encoding="utf-8") as f:
        for _ in range(300):
            f.write(json.dumps({"text": story(rng)}) + "\n")
    with open(OUT / "lambada.jsonl", "w", encoding="utf-8") as f:
        for _ in range(300):
            f.write(json.dumps({"text": lambada_text(rng)}) + "\n")
    with open(OUT / "choice.jsonl", "w", encoding="utf-8") as f:
        for _ in range(300):
            f.write(json.dumps(choice_record(rng)) + "\n")
    print(f"wrote {OUT}/held-out.jsonl, lambada.jsonl, choice.jsonl")


if __name__ == "__main__":
    main()
