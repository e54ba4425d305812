"""bench case: greedy decoding tokens/s, GPT-2 124M, batch 1, in fp32 and bf16, against HF generate."""

from __future__ import annotations

import statistics

import torch

from bench.common import Result, gpt2_pair, hf_greedy, memory_bandwidth, ours_greedy, to_bf16


def run(args) -> list[Result]:
    hf, ours32 = gpt2_pair()
    ours = to_bf16(ours32)
    n = 50 if args.quick else 200
    prompt = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
    ours_greedy(ours, prompt, n)  # compile the decoding kernels once (they are cached on disk after)
    ours_runs, hf_runs = [], []
    for _ in range(args.repeats):
        ours_runs.append(ours_greedy(ours, prompt, n))
        hf_runs.append(hf_greedy(hf, prompt, n))
    ours_tps, hf_tps = statistics.median(ours_runs), statistics.median(hf_runs)
    bw = memory_bandwidth()
    weight_bytes = sum(p.numel() * p.element_size() for p in ours.parameters())
    limit = bw / weight_bytes
    return [
        Result(
            "greedy decode, GPT-2 124M, 16-token prompt",
            ours_tps,
            hf_tps,
            "tokens/s",
            "HF generate (fp32)",
            ">= 2.5x, >= 60% of bandwidth limit",
            ours_tps / hf_tps >= 2.5 and ours_tps / limit >= 0.6,
            [
                f"{n} new tokens; bf16 weights; {100 * ours_tps / limit:.0f}% of the bandwidth limit "
                f"({bw / 1e9:.1f} GB/s / {weight_bytes / 1e6:.0f} MB of weights = {limit:.0f} tokens/s)"
            ],
        )
    ]
