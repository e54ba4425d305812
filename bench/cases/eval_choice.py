"""bench case: multiple-choice examples scored per second against one forward pass per choice."""

from __future__ import annotations

import shutil
import statistics
import time

import torch

from bench.common import Result, eval_text_source, gpt2_pair, scratch


@torch.no_grad()
def hf_choice_loop(hf, tok, rows: list[dict]) -> list[list[float]]:
    """Each choice on its own: encode(context + " " + choice), one forward pass, the sum of
    the choice tokens' log-probabilities."""
    out = []
    for r in rows:
        ctx, sums = tok.encode(r["context"]), []
        for c in r["choices"]:
            whole = tok.encode(r["context"] + " " + c)
            logp = hf(torch.tensor([whole])).logits[0, :-1].float().log_softmax(-1)
            sums.append(sum(float(logp[len(ctx) - 1 + i, t]) for i, t in enumerate(whole[len(ctx) :])))
        out.append(sums)
    return out


def run(args) -> list[Result]:
    """Multiple-choice examples per second (4 choices, HellaSwag-sized), GPT-2 124M, fp32 on
    both sides: gptcli eval against a plain per-choice Hugging Face loop."""
    import json
    import random

    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.evals.choice import evaluate_choice

    hf, ours = gpt2_pair()
    tok = gpt2_tokenizer()
    lines = [ln.strip() for ln in eval_text_source(args).splitlines() if len(ln.split()) >= 6]
    rng = random.Random(0)
    n = 16 if args.quick else 48
    rows = []
    for i in range(n):
        context = " ".join(lines[(3 * i + k) % len(lines)] for k in range(3))  # about 40 tokens
        choices = [" ".join(rng.choice(lines).split()[:14]) for _ in range(4)]  # about 18 tokens each
        rows.append({"context": context, "choices": choices, "label": i % 4})
    work = scratch()
    (work / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    evaluate_choice(ours, tok, work / "c.jsonl", limit=2)  # warm-up
    ours_runs, hf_runs, got, ref = [], [], None, None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        got = evaluate_choice(ours, tok, work / "c.jsonl")
        ours_runs.append(n / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        ref = hf_choice_loop(hf, tok, rows)
        hf_runs.append(n / (time.perf_counter() - t0))
    shutil.rmtree(work)
    worst = max(
        abs(a - b)
        for e, sums in zip(got.examples, ref, strict=True)
        for a, b in zip(e["logprob"], sums, strict=True)
    )
    ours_eps, hf_eps = statistics.median(ours_runs), statistics.median(hf_runs)
    return [
        Result(
            f"eval choice, GPT-2 124M, {n} examples x 4 choices",
            ours_eps,
            hf_eps,
            "examples/s",
            "HF, one forward pass per choice (fp32)",
            ">= 3x, same scores",
            ours_eps / hf_eps >= 3 and worst < 1e-3,
            [f"largest difference of a choice's summed log-probability: {worst:.2e}"],
        )
    ]
