"""bench case: gptcli eval's tokens scored per second against HF's sliding-window perplexity loop."""

from __future__ import annotations

import math
import shutil
import statistics
import time

import torch

from bench.common import Result, eval_text_source, gpt2_pair, scratch
from gptcli.model import GPT


@torch.no_grad()
def hf_guide_perplexity(hf, ids: list[int], block: int) -> tuple[float, int]:
    """Total NLL and tokens scored, as Hugging Face's perplexity guide loops (stride = block)."""
    nll, n, prev_end = 0.0, 0, 0
    for begin in range(0, len(ids), block):
        end = min(begin + block, len(ids))
        trg_len = end - prev_end
        input_ids = torch.tensor([ids[begin:end]])
        target_ids = input_ids.clone()
        target_ids[:, :-trg_len] = -100
        loss = hf(input_ids, labels=target_ids).loss
        valid = int((target_ids[:, 1:] != -100).sum())
        nll += float(loss) * valid
        n += valid
        prev_end = end
        if end == len(ids):
            break
    return nll, n


def run(args) -> list[Result]:
    """Tokens scored per second, GPT-2 124M, windows of 1024: gptcli eval's batched windows
    in the dtype it picks on this CPU, against HF's forward pass on the same windows."""
    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.evals.text import encode_text, evaluate_text
    from gptcli.runtime import pick_inference_dtype

    hf, ours32 = gpt2_pair()
    tok = gpt2_tokenizer()
    windows = 4 if args.quick else 12
    work = scratch()
    text, chars = eval_text_source(args), 4000 * windows
    (work / "t.txt").write_text(text[:chars], encoding="utf-8")
    ids = encode_text(work / "t.txt", tok).ids
    dtype, _ = pick_inference_dtype(torch.device("cpu"), "auto", ours32.num_params())
    ours = GPT(ours32.config).eval().to(dtype)
    ours.load_state_dict(ours32.state_dict())
    evaluate_text(ours, tok, work / "t.txt", limit=1)  # warm-up
    ours_runs, hf_runs, got, ref = [], [], None, None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        got = evaluate_text(ours, tok, work / "t.txt").metrics
        ours_runs.append(got["tokens"] / (time.perf_counter() - t0))
        t0 = time.perf_counter()
        ref = hf_guide_perplexity(hf, ids, 1024)
        hf_runs.append(ref[1] / (time.perf_counter() - t0))
    fp32 = evaluate_text(ours32, tok, work / "t.txt").metrics
    hf_ppl = math.exp(ref[0] / ref[1])
    shutil.rmtree(work)
    ours_tps, hf_tps = statistics.median(ours_runs), statistics.median(hf_runs)
    same = got["tokens"] == ref[1] and abs(fp32["ppl"] / hf_ppl - 1) < 1e-4
    close = abs(got["ppl"] / hf_ppl - 1) < (2e-2 if dtype == torch.bfloat16 else 1e-4)
    return [
        Result(
            f"eval text, GPT-2 124M, {len(ids):,} tokens in windows of 1024",
            ours_tps,
            hf_tps,
            "tokens/s",
            "HF forward, perplexity guide (fp32)",
            ">= 1.5x, same numbers",
            ours_tps / hf_tps >= 1.5 and same and close,
            [
                f"gptcli in {str(dtype).removeprefix('torch.')} (what --dtype auto picks here): ppl "
                f"{got['ppl']:.4f}; in fp32 {fp32['ppl']:.4f}; HF {hf_ppl:.4f}; tokens scored "
                f"{got['tokens']:,} vs {ref[1]:,}"
            ],
        )
    ]
