"""bench case: beam search (B=4) tokens/s against HF generate(num_beams=4), the same best hypothesis."""

from __future__ import annotations

import statistics
import time

import torch

from bench.common import Result, gpt2_pair, to_bf16
from gptcli.infer.generate import beam_search


def run(args) -> list[Result]:
    hf, ours32 = gpt2_pair()
    ours = to_bf16(ours32)
    n = 30 if args.quick else 100
    prompt = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(2))

    def run_hf() -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        with torch.no_grad():
            out = hf.generate(
                prompt,
                attention_mask=torch.ones_like(prompt),
                num_beams=4,
                max_new_tokens=n,
                early_stopping=True,
                do_sample=False,
                pad_token_id=50256,
                eos_token_id=50256,
            )
        ids = out[0, 16:].tolist()
        return n / (time.perf_counter() - t0), ids[: ids.index(50256) + 1] if 50256 in ids else ids

    def run_ours() -> tuple[float, list[int]]:
        t0 = time.perf_counter()
        hyps = beam_search(ours, prompt[0].tolist(), 4, n, end_ids=[50256])
        return n / (time.perf_counter() - t0), hyps[0].ids

    ours_runs, hf_runs = [], []
    for _ in range(args.repeats):
        ours_runs.append(run_ours())
        hf_runs.append(run_hf())
    same = ours_runs[0][1] == hf_runs[0][1]
    ours_tps = statistics.median(r[0] for r in ours_runs)
    hf_tps = statistics.median(r[0] for r in hf_runs)
    return [
        Result(
            "beam search B=4, GPT-2 124M",
            ours_tps,
            hf_tps,
            "tokens/s",
            "HF generate(num_beams=4) (fp32)",
            ">= 1.5x, same best hypothesis",
            ours_tps / hf_tps >= 1.5 and same,
            [
                f"{n} new tokens; bf16 weights; best hypothesis "
                f"{'identical to' if same else 'DIFFERENT from'} HF's"
            ],
        )
    ]
