"""bench case `muon`: nanoGPT's train.py (AdamW), gptcli AdamW and gptcli Muon
on the same tokens, model shape, batch, block and step budget, on tinyshakespeare
char-level and with the GPT-2 BPE.

Every trainer runs three seeds. nanoGPT's train.py has no seed option (it seeds torch with
1337 + rank, which draws its initial weights and its batches), so the bench runs it with
torch.manual_seed set to give the seed instead (NANOGPT_SEEDED), its code unchanged. gptcli
Muon also runs at pretrain's default AdamW rate for the parameters Muon does not take
(--lr 1e-3, the rate a user gets), beside the tuned 3e-3. Every final model is scored on
the whole val split (bench/val_loss.py); the curves over time come from gptcli's own
evaluations every 50 steps, against training time only (evaluations and checkpoints left
out), and nanoGPT's time is the sum of its per-iteration times with the evaluating
iterations replaced by its median; it evaluates every 50 steps too (its own 20-batch
estimate), so it has a curve.

The time Muon needs to reach AdamW's final val loss is read two ways: off the curve of its
full-length run, and as a run given 0.65x AdamW's training time, in the steps that takes,
with the schedule fitted to them as --max-time fits it: its time and whole-split val loss
against AdamW's. (On the char case the fitted short run ended above the long run's curve at
the same time: a shorter schedule is not a shortcut.)
"""

from __future__ import annotations

import itertools
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import Result, scratch
from gptcli.reports import Reporter

SEEDS = (1, 2, 3)
EVAL_EVERY = 50
# torch's generator seeded with the first argument instead of train.py's fixed 1337; train.py
# then runs as `python train.py ARGS...` would (its configurator reads sys.argv[1:])
NANOGPT_SEEDED = (
    "import runpy, sys, torch; seed = int(sys.argv.pop(1)); manual_seed = torch.manual_seed; "
    "torch.manual_seed = lambda _: manual_seed(seed); runpy.run_path('train.py', run_name='__main__')"
)
# pretrain's default --lr, for the parameters Muon does not take in a user's Muon run
DEFAULT_LR = 1e-3
# AdamW's peak rate, the best of 1e-3, 3e-3 and 6e-3 on the char case (bench/RESULTS.md, "Muon
# settings"), for gptcli AdamW and nanoGPT alike, and in Muon runs for the parameters Muon does
# not take (--lr 3e-3; Muon itself at its default --muon-lr)
ADAMW_LR = 3e-3
# the share of AdamW's training time a budgeted Muon run gets: below the 0.7x target, as
# step times vary by a few percent between runs
BUDGET = 0.65


@dataclass(frozen=True)
class Shape:
    """One dataset's run: the model, batch and budget every trainer gets."""

    name: str
    tokenizer: str
    n_layer: int
    n_embd: int
    block: int
    batch: int
    steps: int
    vocab: int | None = None  # padded vocabulary (nanoGPT pads GPT-2's to 50304)


CHAR = Shape("char", "char", 4, 256, 128, 16, 400)
BPE = Shape("gpt2", "gpt2", 4, 256, 64, 8, 200, vocab=50304)  # the 50304 x 256 head dominates a step
SHAPES = (CHAR, BPE)


@dataclass
class Run:
    name: str
    seed: int | None
    final_val: float  # whole val split, after the last step
    train_s: float  # training time of all steps
    curve: list[tuple[float, float]]  # (training seconds, val loss) at each evaluation

    def time_to(self, loss: float) -> float | None:
        """When the curve first reaches loss (linear between evaluations), or None."""
        for (t0, v0), (t1, v1) in itertools.pairwise(self.curve):
            if v1 <= loss:
                return t0 + (t1 - t0) * (v0 - loss) / (v0 - v1) if v0 > loss else t0
        return None

    def val_at(self, seconds: float) -> float:
        """The val loss at this training time (linear between evaluations)."""
        for (t0, v0), (t1, v1) in itertools.pairwise(self.curve):
            if t0 <= seconds <= t1:
                return v0 + (v1 - v0) * (seconds - t0) / max(t1 - t0, 1e-9)
        return self.curve[-1][1]


class _Curve(Reporter):
    """Training time (steps only) and the run's val loss at each evaluation."""

    def __init__(self) -> None:
        self.last, self.train_s, self.points = time.perf_counter(), 0.0, []

    def on_step(self, r) -> None:
        now = time.perf_counter()
        self.train_s, self.last = self.train_s + now - self.last, now

    def on_eval(self, r) -> None:
        self.points.append((self.train_s, r.metrics["val"]["loss"]))
        self.last = time.perf_counter()

    def on_checkpoint(self, *args) -> None:
        self.last = time.perf_counter()


def gptcli_run(
    shape: Shape, tokens: Path, optimizer: str, seed: int, work: Path, steps: int = 0, **train_flags: float
) -> Run:
    """One gptcli run of the shape (steps: a shorter budget, the schedule fitted to it;
    train_flags: other TrainConfig values, e.g. lr and muon_lr)."""
    from bench.val_loss import full_val_loss
    from gptcli.data.corpus import load_split
    from gptcli.store.checkpoint import load_checkpoint
    from gptcli.train.recipes import pretrain_trainer

    model = dict(n_layer=shape.n_layer, n_head=4, n_embd=shape.n_embd, block_size=shape.block, dropout=0.0)
    if shape.vocab:
        model["vocab_size"] = shape.vocab
    lr = train_flags.pop("lr", ADAMW_LR)
    train = dict(**train_flags,
        optimizer=optimizer, batch_size=shape.batch, max_iters=steps or shape.steps, warmup_iters=50, lr=lr,
        min_lr=lr / 10, eval_interval=EVAL_EVERY, eval_iters=20, log_interval=50, seed=seed, dtype="auto",
    )  # fmt: skip
    out = work / f"{shape.name}-{optimizer}-{seed}-{steps}-{lr:g}"
    curve = _Curve()
    pretrain_trainer([tokens], flags={"model": model, "train": train}, out=out).run(reporter=curve)
    final = full_val_loss(load_checkpoint(out / "last").model, load_split(tokens, "val"))
    shutil.rmtree(out, ignore_errors=True)
    return Run(f"gptcli {optimizer}", seed, final, curve.train_s, curve.points)


def nanogpt_run(shape: Shape, tokens: Path, nanogpt: Path, work: Path, seed: int) -> Run:
    """nanoGPT's train.py with its shakespeare_char settings scaled to the shape, on the
    same train.bin/val.bin (gptcli's tokenize writes nanoGPT's layout: raw uint16 ids),
    seeded with seed (NANOGPT_SEEDED)."""
    from bench.val_loss import full_val_loss, nanogpt_model
    from gptcli.data.corpus import load_data_tokenizer, load_split

    data = work / f"nanogpt-{shape.name}"
    if not data.is_dir():
        data.mkdir()
        for split in ("train", "val"):
            shutil.copy(tokens / f"{split}.bin", data / f"{split}.bin")
        if shape.vocab is None:  # nanoGPT reads a char vocabulary's size from meta.pkl
            with open(data / "meta.pkl", "wb") as f:
                pickle.dump({"vocab_size": load_data_tokenizer(tokens).vocab_size}, f)
    out = work / f"nanogpt-{shape.name}-{seed}-out"
    cmd = [
        sys.executable, "-c", NANOGPT_SEEDED, str(seed), "config/train_shakespeare_char.py",
        f"--dataset={data}", f"--out_dir={out}",
        "--device=cpu", "--compile=False", f"--n_layer={shape.n_layer}", "--n_head=4",
        f"--n_embd={shape.n_embd}", f"--block_size={shape.block}", f"--batch_size={shape.batch}",
        "--dropout=0.0", "--bias=True", "--always_save_checkpoint=True",
        f"--max_iters={shape.steps}", f"--lr_decay_iters={shape.steps}",
        "--warmup_iters=50", f"--eval_interval={EVAL_EVERY}", "--eval_iters=20", "--log_interval=1",
        f"--learning_rate={ADAMW_LR}", f"--min_lr={ADAMW_LR / 10}",
    ]  # fmt: skip
    log = subprocess.run(cmd, cwd=nanogpt, check=True, capture_output=True, text=True).stdout
    times = {
        int(m[1]): float(m[2]) / 1000 for m in re.finditer(r"iter (\d+): loss [\d.]+, time ([\d.]+)ms", log)
    }
    # an iteration that evaluates first (0, 50, ...) counts as the median training step
    median = statistics.median(t for i, t in times.items() if i % EVAL_EVERY)
    step_s = [median if i % EVAL_EVERY == 0 else times[i] for i in range(shape.steps)]
    # "step N: ..., val loss V" is measured after N steps (iterations 0 .. N-1)
    curve = [
        (sum(step_s[: int(m[1])]), float(m[2]))
        for m in re.finditer(r"step (\d+): train loss [\d.]+, val loss ([\d.]+)", log)
    ]
    final = full_val_loss(nanogpt_model(out / "ckpt.pt"), load_split(tokens, "val"))
    train_s = sum(step_s)  # train.py takes one step past the budget; it is not counted
    shutil.rmtree(out, ignore_errors=True)
    return Run("nanoGPT AdamW", seed, final, train_s, curve)


def _per_seed(values: list[float], form: str, unit: str = "") -> str:
    return ", ".join("not reached" if v == float("inf") else format(v, form) + unit for v in values)


def _spread(values: list[float], digits: int = 3) -> str:
    return (
        f"{statistics.mean(values):.{digits}f} (min {min(values):.{digits}f}, max {max(values):.{digits}f})"
    )


def run(args) -> list[Result]:
    """The case's rows."""
    from gptcli.data.corpus import tokenize_corpus

    if not args.nanogpt or not args.corpus:
        note = ["skipped: needs --nanogpt DIR and --corpus tinyshakespeare.txt"]
        return [Result("Muon against AdamW", float("nan"), None, "", "gptcli AdamW", "", None, note)]
    work = scratch("gptcli-bench-muon-")
    results = []
    for shape in SHAPES:
        tokens = work / f"tokens-{shape.name}"
        tokenize_corpus([args.corpus], tokens, shape.tokenizer)
        peers, runs, defaults = [], {"adamw": [], "muon": []}, []
        for seed in SEEDS:
            print(f"  {shape.name}: nanoGPT, seed {seed} ...", file=sys.stderr, flush=True)
            peers.append(nanogpt_run(shape, tokens, args.nanogpt, work, seed))
            for optimizer in runs:
                print(f"  {shape.name}: gptcli {optimizer}, seed {seed} ...", file=sys.stderr, flush=True)
                runs[optimizer].append(gptcli_run(shape, tokens, optimizer, seed, work))
            say = f"  {shape.name}: gptcli muon, --lr {DEFAULT_LR:g}, seed {seed} ..."
            print(say, file=sys.stderr, flush=True)
            defaults.append(gptcli_run(shape, tokens, "muon", seed, work, lr=DEFAULT_LR))
        # Muon given BUDGET of AdamW's training time, as --max-time would: the steps its own
        # runs took that long for, with warmup and cosine fitted to them
        per_step = statistics.mean(m.train_s for m in runs["muon"]) / shape.steps
        steps = int(BUDGET * statistics.mean(a.train_s for a in runs["adamw"]) / per_step)
        budget = []
        for seed in SEEDS:
            print(f"  {shape.name}: gptcli muon, {steps} steps, seed {seed} ...", file=sys.stderr, flush=True)
            budget.append(gptcli_run(shape, tokens, "muon", seed, work, steps))
        results += _compare(shape, peers, runs["adamw"], runs["muon"])
        results.append(_budget_row(shape, runs["adamw"], budget, steps))
        results.append(_defaults_row(shape, runs["adamw"], defaults))
    shutil.rmtree(work, ignore_errors=True)
    return results


def _budget_row(shape: Shape, adamw: list[Run], budget: list[Run], steps: int):
    """Muon with a budget of BUDGET x AdamW's time: its time and whole-split val loss against
    the same seed's AdamW run."""
    time_ratio = [b.train_s / a.train_s for a, b in zip(adamw, budget, strict=True)]
    lower = [a.final_val - b.final_val for a, b in zip(adamw, budget, strict=True)]
    char = shape.name == "char"
    return Result(
        f"Muon, {shape.name}: {steps} steps (schedule fitted), AdamW's final val loss in <= 0.7x its time",
        statistics.mean(time_ratio), 1.0, "x AdamW's time", "AdamW's whole run",
        "<= 0.7x, val loss <= AdamW's" if char else "(reported)",
        (max(time_ratio) <= 0.7 and min(lower) >= 0) if char else None,
        [
            f"per seed: time {_per_seed(time_ratio, '.2f', 'x')}; whole val split "
            f"{_per_seed([b.final_val for b in budget], '.3f')} against AdamW's "
            f"{_per_seed([a.final_val for a in adamw], '.3f')} after {shape.steps} steps"
        ],
    )  # fmt: skip


def _reach(adamw: list[Run], other: list[Run]) -> list[float]:
    """Per seed, the share of AdamW's training time the other run needs to reach that AdamW
    run's final evaluation (inf: never)."""
    return [
        float("inf") if (t := o.time_to(a.curve[-1][1])) is None else t / a.train_s
        for a, o in zip(adamw, other, strict=True)
    ]


def _defaults_row(shape: Shape, adamw: list[Run], defaults: list[Run]):
    """Muon as a user's run gets it (AdamW's group at pretrain's default --lr) against the
    tuned AdamW: the time to AdamW's final val loss, per seed."""
    ratio = _reach(adamw, defaults)
    char = shape.name == "char"
    at_time = [a.curve[-1][1] - d.val_at(a.train_s) for a, d in zip(adamw, defaults, strict=True)]
    return Result(
        f"Muon at pretrain's default --lr {DEFAULT_LR:g} (for what Muon does not take), {shape.name}: "
        "time to gptcli AdamW's final val loss",
        statistics.mean(ratio), 1.0, "x AdamW's time", "AdamW's whole run",
        "<= 0.7x" if char else "(reported)", max(ratio) <= 0.7 if char else None,
        [
            f"per seed: {_per_seed(ratio, '.2f', 'x')}; val loss lower than AdamW's at AdamW's wall "
            f"time by {_per_seed(at_time, '.3f')}; whole val split after {shape.steps} steps "
            f"{_spread([d.final_val for d in defaults])} (with --lr {ADAMW_LR:g}: see above)"
        ],
    )  # fmt: skip


def _compare(shape: Shape, peers: list[Run], adamw: list[Run], muon: list[Run]) -> list:
    """The case's rows: each seed's Muon against the same seed's AdamW; nanoGPT beside."""
    what = (
        f"{shape.name}, {shape.n_layer} layers x {shape.n_embd}, block {shape.block}, batch {shape.batch}, "
        f"{shape.steps} steps"
    )
    last = [a.curve[-1][1] for a in adamw]  # AdamW's final evaluation, per seed
    reach = [m.time_to(v) for v, m in zip(last, muon, strict=True)]
    reach_ratio = _reach(adamw, muon)
    muon_at = [m.val_at(a.train_s) for a, m in zip(adamw, muon, strict=True)]  # at AdamW's wall time
    at_time = [v - m for v, m in zip(last, muon_at, strict=True)]
    per_step = [m.train_s / a.train_s for a, m in zip(adamw, muon, strict=True)]
    char = shape.name == "char"
    finals = {name: [r.final_val for r in rs] for name, rs in (("adamw", adamw), ("muon", muon))}
    mean = {name: statistics.mean(v) for name, v in finals.items()}
    notes = [
        f"whole val split after {shape.steps} steps: nanoGPT AdamW {_spread([p.final_val for p in peers])}, "
        f"gptcli AdamW {_spread(finals['adamw'])}, gptcli Muon {_spread(finals['muon'])} over seeds {SEEDS}",
        f"training time of {shape.steps} steps: nanoGPT {_spread([p.train_s for p in peers], 0)} s, "
        f"gptcli AdamW {_spread([a.train_s for a in adamw], 0)} s, "
        f"gptcli Muon {_spread([m.train_s for m in muon], 0)} s",
    ]
    target = statistics.mean(last)
    peer_reach = [p.time_to(target) for p in peers]
    notes.append(
        f"time to gptcli AdamW's final val loss ({target:.3f}, mean of the seeds' last evaluations): "
        f"gptcli AdamW {statistics.mean(a.train_s for a in adamw):.0f} s, gptcli Muon "
        f"{_spread([float('inf') if r is None else r for r in reach], 0)} s, nanoGPT "
        + ", ".join("not reached" if r is None else f"{r:.0f} s" for r in peer_reach)
    )
    notes.append(
        f"val loss (evaluation, 20 batches) at gptcli AdamW's wall time: AdamW "
        f"{_spread(last)}, Muon {_spread(muon_at)}, nanoGPT "
        f"{_spread([p.val_at(statistics.mean(a.train_s for a in adamw)) for p in peers])}"
    )
    return [
        Result(
            f"Muon, {what}: val loss after {shape.steps} steps",
            mean["muon"], mean["adamw"], "nats", "gptcli AdamW", "lower", mean["muon"] < mean["adamw"], notes,
        ),
        Result(
            f"Muon, {shape.name}: time to gptcli AdamW's final val loss, on its {shape.steps}-step curve",
            statistics.mean(reach_ratio), 1.0, "x AdamW's time", "AdamW's whole run",
            "<= 0.7x" if char else "(reported)", max(reach_ratio) <= 0.7 if char else None,
            [f"per seed: {_per_seed(reach_ratio, '.2f', 'x')}"],
        ),
        Result(
            f"Muon, {shape.name}: val loss lower than AdamW's at AdamW's wall time",
            statistics.mean(at_time), None, "nats", "", ">= 0.1 nats" if char else "(reported)",
            min(at_time) >= 0.1 if char else None, [f"per seed: {_per_seed(at_time, '.3f')}"],
        ),
        Result(
            f"Muon, {shape.name}: step time against AdamW's", statistics.mean(per_step), None, "x", "",
            "(reported)", None, [f"per seed: {_per_seed(per_step, '.2f', 'x')}"],
        ),
    ]  # fmt: skip
