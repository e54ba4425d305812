"""How gptcli's Muon settings and the bench's AdamW rate were chosen: one seed of each
setting on char-level tinyshakespeare (4 layers x 256, block 128, batch 16, 400 steps,
warmup 50 and cosine to lr / 10), scored on the whole val split after the last step, with
the run's curve (training seconds, val loss of its evaluation every 50 steps).

    gptcli tokenize tinyshakespeare.txt --out /tmp/tok-char
    python bench/muon_settings.py /tmp/tok-char [RUN ...]     # under a minute a run on 2 cores

Muon's adjust_lr_fn and weight decay are module constants of gptcli/optim.py, set here for
each run, and its Newton-Schulz steps the config key train.muon_ns_steps (torch's 5 unless a
run says otherwise), and Muon's own warmup train.muon_warmup_iters (none; here AdamW's
unless a run says otherwise); the figures are in bench/RESULTS.md ("Muon settings").
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import gptcli.train.optim as optim  # noqa: E402
from bench.cases.muon import CHAR, gptcli_run  # noqa: E402
from bench.common import scratch  # noqa: E402

RUNS = {
    "muon-original-0.02": dict(optimizer="muon", lr=1e-3, muon_lr=0.02, adjust="original", wd=0.0),
    "adamw-1e-3": dict(optimizer="adamw", lr=1e-3),
    "muon-rms-3e-3": dict(optimizer="muon", lr=1e-3, muon_lr=3e-3, adjust="match_rms_adamw", wd=0.0),
    "adamw-3e-3": dict(optimizer="adamw", lr=3e-3),
    "muon-original-0.02-wd0.1": dict(optimizer="muon", lr=1e-3, muon_lr=0.02, adjust="original", wd=0.1),
    "adamw-6e-3": dict(optimizer="adamw", lr=6e-3),
    # Muon's rate, and AdamW's for the parameters Muon does not take (embeddings, norms, biases)
    "muon-original-0.03": dict(optimizer="muon", lr=1e-3, muon_lr=0.03, adjust="original", wd=0.0),
    "muon-original-0.04": dict(optimizer="muon", lr=1e-3, muon_lr=0.04, adjust="original", wd=0.0),
    "muon-original-0.02-adamw-3e-3": dict(optimizer="muon", lr=3e-3, muon_lr=0.02, adjust="original", wd=0.0),
    "muon-original-0.03-adamw-3e-3": dict(optimizer="muon", lr=3e-3, muon_lr=0.03, adjust="original", wd=0.0),
    # fewer Newton-Schulz iterations: a cheaper step, a rougher orthogonalization
    "muon-original-0.02-ns4": dict(
        optimizer="muon", lr=1e-3, muon_lr=0.02, adjust="original", wd=0.0, ns_steps=4
    ),
    "muon-original-0.02-ns3": dict(
        optimizer="muon", lr=1e-3, muon_lr=0.02, adjust="original", wd=0.0, ns_steps=3
    ),
    "muon-original-0.03-adamw-3e-3-ns4": dict(
        optimizer="muon", lr=3e-3, muon_lr=0.03, adjust="original", wd=0.0, ns_steps=4
    ),
    # Muon at its peak from the first step while AdamW warms up (train.muon_warmup_iters 0)
    "muon-original-0.03-adamw-3e-3-ns4-no-warmup": dict(
        optimizer="muon", lr=3e-3, muon_lr=0.03, adjust="original", wd=0.0, ns_steps=4, muon_warmup_iters=0
    ),
}


BASELINE = "adamw-3e-3"  # the bench's AdamW


def main() -> None:
    tokens, only = Path(sys.argv[1]), sys.argv[2:] or list(RUNS)
    work = scratch("gptcli-muon-settings-")
    runs = {}
    for name in only:
        settings = dict(RUNS[name])
        optim.MUON_ADJUST_LR = settings.pop("adjust", "original")
        optim.MUON_WEIGHT_DECAY = settings.pop("wd", 0.0)
        settings["muon_ns_steps"] = settings.pop("ns_steps", 5)
        settings.setdefault("muon_warmup_iters", None)  # Muon warmed up with AdamW until it had its own
        run = gptcli_run(CHAR, tokens, settings.pop("optimizer"), 1337, work, **settings)
        scored = {"run": name, "val": round(run.final_val, 4), "train_s": round(run.train_s, 1),
                  "curve": [(round(t, 1), round(v, 3)) for t, v in run.curve]}  # fmt: skip
        print(json.dumps(scored), flush=True)
        runs[name] = run
    shutil.rmtree(work, ignore_errors=True)
    if BASELINE in runs:  # how soon each run reaches the baseline's last evaluation
        base = runs[BASELINE]
        target = base.curve[-1][1]
        for name, run in runs.items():
            t = run.time_to(target)
            reached = "not reached" if t is None else f"{t:.1f} s = {t / base.train_s:.2f}x {BASELINE}'s time"
            print(f"{name}: to {BASELINE}'s last evaluation ({target:.3f}): {reached}")


if __name__ == "__main__":
    main()
