"""A/B of beam search's ranking: the C pass (kernels.logsumexp, kernels.top_rows) against
torch's log-softmax and topk, alternated in one process on a random GPT-2 124M in bf16
(beam search B=4, 200 steps from a 16-token prompt). Prints each round's ms per step and
the median ratio; both must find the same beams.

    python bench/rank_ab.py [ROUNDS]
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gptcli.config import ModelConfig
from gptcli.infer import kernels
from gptcli.infer.generate import beam_search
from gptcli.model import GPT


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 6
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)
    model = GPT(config).eval().to(torch.bfloat16)
    kernels.use_fast_decode(model)
    if kernels.LIBRARY.wait() is None:
        sys.exit(f"no CPU decoding library: {kernels.LIBRARY.failed}")
    prompt = torch.randint(0, 50257, (16,), generator=torch.Generator().manual_seed(1)).tolist()
    in_c = kernels.logsumexp, kernels.top_rows

    def ms_per_step(c: bool) -> tuple[float, list[list[int]]]:
        kernels.logsumexp, kernels.top_rows = in_c if c else (lambda *a: None, lambda *a: None)
        t0 = time.perf_counter()
        hyps = beam_search(model, prompt, 4, 200, end_ids=[])
        return (time.perf_counter() - t0) / 200 * 1e3, [h.ids for h in hyps]

    ms_per_step(True), ms_per_step(False)  # warm-up
    ratios = []
    for _ in range(rounds):
        a, beams_a = ms_per_step(False)
        b, beams_b = ms_per_step(True)
        assert beams_a == beams_b, "the two rankings found different beams"
        ratios.append(b / a)
        print(f"torch {a:.2f} ms/step, C {b:.2f} ms/step")
    print(f"C/torch, the median of {rounds}: {statistics.median(ratios):.3f}")


if __name__ == "__main__":
    main()
