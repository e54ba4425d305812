"""bench case: a long generation, where attention over the growing context costs as much as the weights."""

from __future__ import annotations

import statistics

import torch

from bench.common import Result, gpt2_pair, hf_greedy, ours_greedy, to_bf16


def run(args) -> list[Result]:
    """A long generation, where attending over the growing context starts to cost as much
    as reading the weights: gptcli, HF, and gptcli decoding op by op through the model's own
    blocks (fused attention), with only the Linear layers on the decoding kernel."""
    from gptcli.model import Block

    hf, ours32 = gpt2_pair()
    ours = to_bf16(ours32)
    stock = to_bf16(ours32)
    for m in stock.modules():
        if isinstance(m, Block):
            del m.forward  # back to Block.forward: op by op, F.scaled_dot_product_attention
    n = 300 if args.quick else 1000
    prompt = torch.randint(0, 50257, (1, 16), generator=torch.Generator().manual_seed(1))
    ours_greedy(ours, prompt, n)
    runs: dict[str, list[float]] = {"ours": [], "hf": [], "stock": []}
    for _ in range(max(1, args.repeats // 2)):
        runs["ours"].append(ours_greedy(ours, prompt, n))
        runs["stock"].append(ours_greedy(stock, prompt, n))
        runs["hf"].append(hf_greedy(hf, prompt, n))
    ours_tps, hf_tps, stock_tps = (statistics.median(runs[k]) for k in ("ours", "hf", "stock"))
    case = f"greedy decode, GPT-2 124M, {n} new tokens"
    return [
        Result(
            case,
            ours_tps,
            hf_tps,
            "tokens/s",
            "HF generate (fp32)",
            "(reference)",
            None,
            ["bf16 weights; second row: the same model decoding op by op (fused attention)"],
        ),
        Result(
            case,
            ours_tps,
            stock_tps,
            "tokens/s",
            "gptcli op by op",
            "(reference)",
            None,
        ),
    ]
