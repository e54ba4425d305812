"""Write the demo corpus: short stories from a small grammar about animals.

    python examples/make_demo_corpus.py            # -> examples/demo/animals.jsonl

Every animal has its own habits (what it digs, builds, eats, where it hides) and every
habit has its reasons, so a model has to learn who does what and why. The weights make
some continuations clearly likelier than others, as in the lecture's "The rabbit dug a
... hole 0.45, little 0.07, ...". Deterministic: the same seed writes the same file.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

# what each kind of need makes an animal say about why it acted
REASONS = {
    "shelter": [
        ("it needed shelter", 5),
        ("winter was coming", 3),
        ("the rain began", 2),
        ("the wind was cold", 2),
        ("a fox was near", 1),
    ],
    "food": [("it was hungry", 6), ("it had not eaten all day", 2), ("its young were hungry", 2)],
    "rest": [("it was tired", 5), ("the day was long", 2), ("the sun went down", 2)],
    "play": [("it was happy", 3), ("the sun was warm", 3), ("its friends were there", 2)],
}

# animal -> list of (action, need, weight); "{obj}" picks from the action's objects
HABITS = {
    "rabbit": [
        ("dug a {obj}", "shelter", 6),
        ("ate a {obj}", "food", 3),
        ("hid in the tall grass", "shelter", 2),
    ],
    "mole": [("dug a {obj}", "shelter", 6), ("ate a worm", "food", 3), ("slept under the ground", "rest", 2)],
    "fox": [("dug a den", "shelter", 3), ("hunted a mouse", "food", 5), ("ran into the woods", "play", 2)],
    "squirrel": [
        ("buried a nut", "food", 5),
        ("climbed a tall tree", "play", 3),
        ("built a {obj}", "shelter", 2),
    ],
    "bird": [("built a {obj}", "shelter", 5), ("found a worm", "food", 4), ("sang a song", "play", 3)],
    "beaver": [
        ("built a dam", "shelter", 6),
        ("cut down a tree", "shelter", 2),
        ("swam in the river", "play", 2),
    ],
    "bear": [("caught a fish", "food", 4), ("slept in a cave", "rest", 4), ("found some honey", "food", 3)],
    "hedgehog": [
        ("rolled into a ball", "shelter", 4),
        ("ate a beetle", "food", 4),
        ("hid under the leaves", "rest", 3),
    ],
    "otter": [
        ("caught a fish", "food", 5),
        ("swam in the river", "play", 4),
        ("floated on its back", "rest", 2),
    ],
    "owl": [
        ("caught a mouse", "food", 5),
        ("watched the field", "rest", 2),
        ("sat in an old tree", "rest", 3),
    ],
}

# what "{obj}" becomes, per animal and verb: the rabbit's holes follow the lecture's odds
OBJECTS = {
    ("rabbit", "dug"): [
        ("hole", 45),
        ("little hole", 7),
        ("small hole", 2),
        ("deep hole", 2),
        ("burrow", 20),
        ("tunnel", 12),
        ("path", 2),
        ("trench", 1),
    ],
    ("mole", "dug"): [("tunnel", 50), ("hole", 30), ("deep tunnel", 10), ("long tunnel", 10)],
    ("rabbit", "ate"): [("carrot", 60), ("leaf", 25), ("flower", 15)],
    ("squirrel", "built"): [("nest", 70), ("small nest", 30)],
    ("bird", "built"): [("nest", 70), ("small nest", 20), ("round nest", 10)],
}

HOMES = {  # where an animal stays after sheltering
    "rabbit": "burrow",
    "mole": "tunnel",
    "fox": "den",
    "squirrel": "nest",
    "bird": "nest",
    "beaver": "lodge",
    "bear": "cave",
    "hedgehog": "leaves",
    "otter": "river",
    "owl": "tree",
}

AFTER = {
    "shelter": [
        ("It stayed in its {home} until spring.", 3),
        ("It felt safe in its {home}.", 3),
        ("Then it went to sleep.", 2),
    ],
    "food": [
        ("It ate until it was full.", 3),
        ("Then it looked for more food.", 2),
        ("It was not hungry any more.", 3),
    ],
    "rest": [("It slept until morning.", 4), ("Then it closed its eyes.", 2)],
    "play": [("It was a good day.", 3), ("Then it went home.", 3)],
}

OPENINGS = [
    ("", 6),
    ("One morning, ", 2),
    ("In the autumn, ", 1),
    ("After the storm, ", 1),
    ("At night, ", 1),
]


def pick(rng: random.Random, options: list[tuple[str, int]]) -> str:
    words, weights = zip(*options, strict=True)
    return rng.choices(words, weights=weights)[0]


def sentence(rng: random.Random, animal: str, opening: str) -> tuple[str, str]:
    """One 'The <animal> <action> because <reason>.' sentence and the need behind it."""
    habits = HABITS[animal]
    action, need, _ = rng.choices(habits, weights=[w for *_, w in habits])[0]
    if "{obj}" in action:
        verb = action.split()[0]
        action = action.format(obj=pick(rng, OBJECTS[(animal, verb)]))
    subject = f"{opening}the {animal}" if opening else f"The {animal}"
    return f"{subject} {action} because {pick(rng, REASONS[need])}.", need


def story(rng: random.Random) -> str:
    animal = rng.choice(list(HABITS))
    first, need = sentence(rng, animal, pick(rng, OPENINGS))
    parts = [first, pick(rng, AFTER[need]).format(home=HOMES[animal])]
    if rng.random() < 0.5:
        second, need = sentence(rng, animal, "")
        parts += [second.replace(f"The {animal}", "Later, the " + animal, 1)]
        if rng.random() < 0.5:
            parts.append(pick(rng, AFTER[need]).format(home=HOMES[animal]))
    return " ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "demo" / "animals.jsonl")
    parser.add_argument("--stories", type=int, default=8000)
    parser.add_argument("--seed", type=int, default=1337)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with open(args.out, "w", encoding="utf-8") as f:
        for _ in range(args.stories):
            f.write(json.dumps({"text": story(rng)}) + "\n")
    print(f"wrote {args.stories} stories to {args.out}")


if __name__ == "__main__":
    main()
