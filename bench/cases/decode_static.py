"""bench case: sample --compile (static KV cache, compiled step) against eager decoding, GPT-2 124M fp32."""

from __future__ import annotations

import statistics
import time

import torch

from bench.common import Result, gpt2_pair, hf_greedy, ours_greedy
from gptcli.infer.generate import GREEDY, generate


def run(args) -> list[Result]:
    """GPT-2 124M in fp32, batch 1: sample --compile (a static KV cache and a compiled
    one-token step) against the eager path, and both against HF generate, same tokens."""
    hf, ours = gpt2_pair()
    n = 50 if args.quick else 200
    prompt = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
    t0 = time.perf_counter()
    ours_greedy(ours, prompt, n, compile=True)  # warm-up: compiles the step
    compile_s = time.perf_counter() - t0
    ids = prompt[0].tolist()
    same = [int(s.tokens[0]) for s in generate(ours, ids, n, sampling=GREEDY, compile=True)] == [
        int(s.tokens[0]) for s in generate(ours, ids, n, sampling=GREEDY)
    ]
    runs: dict[str, list[float]] = {"static": [], "eager": [], "hf": []}
    for _ in range(args.repeats):
        runs["static"].append(ours_greedy(ours, prompt, n, compile=True))
        runs["eager"].append(ours_greedy(ours, prompt, n))
        runs["hf"].append(hf_greedy(hf, prompt, n))
    static, eager, hf_tps = (statistics.median(runs[k]) for k in ("static", "eager", "hf"))
    note = f"{n} new tokens after 16; the same tokens: {'yes' if same else 'no'}; "
    note += f"compiling took {compile_s:.0f} s"
    return [
        Result("greedy decode, GPT-2 124M fp32, --compile (static cache)", static, eager, "tokens/s",
               "the eager path (--no-compile)", "", None, [note]),
        Result("greedy decode, GPT-2 124M fp32, --compile (static cache)", static, hf_tps, "tokens/s",
               "HF generate (fp32)", "", None),
        Result("greedy decode, GPT-2 124M fp32, eager", eager, hf_tps, "tokens/s", "HF generate (fp32)", "",
               None),
    ]  # fmt: skip
