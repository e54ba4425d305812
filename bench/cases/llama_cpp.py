"""bench case: decoding on the CPU against llama.cpp, on the same GPT-2 124M-shaped weights.

gptcli's run is exported to GGUF by `gptcli export` (gptcli.store.gguf; or, given
--llama-convert PATH, exported to Hugging Face's format and converted by llama.cpp's own
convert_hf_to_gguf.py from the llama-cpp-python source); both decode greedily from the
same prompt, on the same threads, in alternating rounds: bf16 against llama.cpp f16, fp32
against f32, --quantize int8 against q8_0. Also: the first token of a whole `gptcli sample
-n 1` process against importing torch and loading the weights; beams (B=4) and a batch of
16 against this machine's memory-bandwidth and compute limits; encoding a prompt (the
prefill) beside llama.cpp's. Without llama-cpp-python (pip install
llama-cpp-python==0.3.36, which compiles llama.cpp: minutes) the gptcli side runs alone and
the table says so.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

from bench.common import (
    ROOT,
    Result,
    beside,
    beside_bandwidth,
    decoding_models,
    gpt2_pair,
    installed_env,
    scratch,
)
from gptcli.infer import kernels
from gptcli.infer.generate import GREEDY, beam_search, cache_dtype, generate
from gptcli.infer.quantize import weight_bytes
from gptcli.model import GPT
from gptcli.runtime import cpu_bf16_feature, kv_cache_bytes, pick_inference_dtype

PAIRS = (("bf16", "f16"), ("fp32", "f32"), ("int8", "q8_0"))


def products_peak() -> tuple[float, str]:
    """FLOP/s of the best of a few large matmuls (torch's oneDNN kernels), bf16 or fp32,
    whichever this CPU runs faster, and which: bf16 weights may be multiplied either way
    (widened to fp32 where the CPU has no bf16 products), so the faster is the limit of a
    step's products. bf16 is not tried on a CPU without native bf16 (AVX2: a 2048-square
    bf16 matmul ran at 0.3 GFLOP/s on a Zen 3, 1/400 of fp32's)."""
    best = {}
    kinds = (
        (("bf16", torch.bfloat16), ("fp32", torch.float32))
        if cpu_bf16_feature()
        else (("fp32", torch.float32),)
    )
    for name, dtype in kinds:
        a = torch.randn(2048, 2048, dtype=dtype)
        best[name] = 0.0
        for _ in range(4):
            t0 = time.perf_counter()
            for _ in range(4):
                a @ a
            best[name] = max(best[name], 4 * 2 * 2048**3 / (time.perf_counter() - t0))
    kind = max(best, key=best.get)
    return best[kind], kind


def save_run(model: GPT, work: Path) -> Path:
    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.store.checkpoint import save_checkpoint

    run = work / "g124"
    save_checkpoint(run, "best", model, gpt2_tokenizer(), {"task": "lm"})
    return run


def ggufs(
    model: GPT, work: Path, convert: Path | None, kinds: tuple[str, ...] = ("f16", "f32", "q8_0")
) -> tuple[dict[str, Path], str | None]:
    """The model in llama.cpp's formats, or why not: written by gptcli's own GGUF export,
    or by llama.cpp's converter when its path is given."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return {}, "llama-cpp-python is not installed: gptcli measured alone"
    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.store.hf import export_hf

    if convert is None:
        from gptcli.store.gguf import export_gguf

        out = {kind: work / f"g124-{kind}.gguf" for kind in kinds}
        for kind, path in out.items():
            export_gguf(model, gpt2_tokenizer(), path, kind, "g124", "bench", replace=True)
        return out, None
    if not convert.is_file():
        return {}, f"{convert} is not llama.cpp's convert_hf_to_gguf.py: gptcli measured alone"

    hf_dir = work / "hf"
    export_hf(model, gpt2_tokenizer(), hf_dir)
    out = {}
    env = {**os.environ, "PYTHONPATH": str(convert.parent / "gguf-py")}
    for kind in kinds:
        out[kind] = work / f"g124-{kind}.gguf"
        cmd = [sys.executable, str(convert), str(hf_dir), "--outtype", kind, "--outfile", str(out[kind])]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            return {}, f"the converter failed on {kind}: {done.stderr.strip().splitlines()[-1:]}"
    return out, None


def ours_tps(model: GPT, prompt: list[int], n: int) -> float:
    t0 = time.perf_counter()
    for _ in generate(model, prompt, n, sampling=GREEDY):
        pass
    return n / (time.perf_counter() - t0)


def llama_tps(llm, prompt: list[int], n: int) -> tuple[float, list[int]]:
    llm.reset()
    got: list[int] = []
    t0 = time.perf_counter()
    for tok in llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
        got.append(tok)
        if len(got) == n:
            break
    return n / (time.perf_counter() - t0), got


def prompts(model: GPT, llm, n: int, rounds: int) -> Result:
    """Encoding a prompt of n tokens (the prefill: keys and values of every token, logits of
    the last), bf16 against llama.cpp's f16, in alternating rounds; tokens/s."""
    from gptcli.model import KVCache

    prompt = torch.randint(0, 50257, (1, n), generator=torch.Generator().manual_seed(2))
    ours, peer, stock = [], [], []
    for _ in range(rounds + 1):  # (the first round warms up)
        for out, encode in ((ours, model.next_logits), (stock, partial(GPT.next_logits, model))):
            t0 = time.perf_counter()
            with torch.no_grad():
                encode(prompt, kv_cache=KVCache(model.config, 1, n, dtype=cache_dtype(model)))
            out.append(n / (time.perf_counter() - t0))
        if llm is not None:
            llm.reset()
            t0 = time.perf_counter()
            llm.eval(prompt[0].tolist())
            peer.append(n / (time.perf_counter() - t0))
    return Result(
        f"encoding a {n}-token prompt on the CPU, GPT-2 124M, bf16",
        statistics.median(ours[1:]),
        statistics.median(peer[1:]) if peer else None,
        "tokens/s",
        "llama.cpp f16",
        "",
        None,
        [
            f"the prefill alone (a new KV cache, the last token's logits), the median of {rounds} "
            f"alternating rounds, {torch.get_num_threads()} threads; the model's own code (torch's "
            f"products): {statistics.median(stock[1:]):.0f} tokens/s"
        ],
    )


def whole_process(code: list[str], repeats: int) -> float:
    """Seconds of the best of `repeats` runs of a fresh process (after one warm-up run, which
    also leaves Python's bytecode cached: installed_env)."""
    env = installed_env(PYTHONPATH=str(ROOT))
    best = float("inf")
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        done = subprocess.run(code, env=env, capture_output=True, text=True, check=False)
        took = time.perf_counter() - t0
        if done.returncode != 0:
            raise RuntimeError(done.stderr[-2000:])
        if i:  # the first run warms the caches (the decoding kernel, the page cache)
            best = min(best, took)
    return best


def auto_dtype(run: Path) -> str:
    """What `--dtype auto` holds the run's weights in on this CPU, and why."""
    from gptcli.store.loading import load

    model = load(run).model  # (as `sample` picks it: a verb that decodes through the kernel)
    params = model.num_params()
    return pick_inference_dtype(torch.device("cpu"), "auto", params, None, kernels.bf16_products())[1]


def first_token(run: Path, gguf: Path | None, repeats: int) -> list[Result]:
    py = sys.executable
    torch_s = whole_process([py, "-c", "import torch"], repeats)
    load_s = whole_process([py, "-c", f"from gptcli.store.loading import load; load({str(run)!r})"], repeats)
    ours = whole_process(
        [py, "-m", "gptcli", "sample", "--ckpt", str(run), "-n", "1", "--temp", "0"], repeats
    )
    notes = [
        f"whole processes, best of {repeats} after a warm-up run; `import torch` alone {torch_s:.2f} s; "
        f"--dtype auto on this CPU: {auto_dtype(run)}"
    ]
    llama = None
    if gguf is not None:
        code = (
            f"from llama_cpp import Llama; llm = Llama(model_path={str(gguf)!r}, n_ctx=1024, "
            f"n_threads={torch.get_num_threads()}, verbose=False); "
            "next(llm.generate([464], top_k=1, temp=0.0))"
        )
        llama = whole_process([py, "-c", code], repeats)
        notes.append(f"llama.cpp f16, the same in a whole process: {llama:.2f} s")
    return [
        Result(
            "first token, `gptcli sample -n 1`, GPT-2 124M, caches warm",
            ours,
            load_s,
            "s",
            "import torch + loading the weights",
            "<= 1.5x",
            ours / load_s <= 1.5,
            notes,
        )
    ]


def torch_products(model: GPT, rows: int) -> float:
    """Steps/s of a decoding step's products alone, by torch's own kernels (oneDNN): every
    Linear of the model once on `rows` rows, in its dtype, the best of 3 rounds of 10 steps."""
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    dtype = next(model.parameters()).dtype
    xs = [torch.randn(rows, m.in_features, dtype=dtype) for m in linears]
    best = 0.0
    with torch.no_grad():
        for _ in range(4):  # (the first warms up)
            t0 = time.perf_counter()
            for _ in range(10):
                for m, x in zip(linears, xs, strict=True):
                    m(x)
            best = max(best, 10 / (time.perf_counter() - t0))
    return best


def kv_bytes(model: GPT, rows: int, prompt: int, n: int) -> float:
    """Bytes of keys and values a decoding step reads, on average over n steps after a prompt:
    step t attends over prompt + t + 1 slots of every row, in every layer."""
    return kv_cache_bytes(model.config, rows, cache_dtype(model)) * (prompt + (n + 1) / 2)


def batches(
    model: GPT, prompt: list[int], n: int, bw: float, peak: tuple[float, str], greedy: float
) -> list[Result]:
    """Beams and a batch of 16, bf16, against this machine's limits: steps/s at which what a
    step reads (the weights, and every row's KV cache) streams at the measured bandwidth, or
    at which the products run at the machine's peak (products_peak: FLOP/s, bf16 or fp32),
    both measured beside each run (the higher of just before and just after: this shared
    machine's FMA rate moves as its bandwidth does), and against the run's highest (bw, peak).
    greedy: batch-1 steps/s in the same run, beside which a step of several rows is put (what
    the rows cost, whatever the machine's bandwidth did meanwhile)."""
    out = []
    params = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    for name, rows in (("beam search B=4", 4), ("sampling a batch of 16", 16)):

        def steps_per_s(rows: int = rows) -> float:  # each step is `rows` tokens
            t0 = time.perf_counter()
            if rows == 4:
                beam_search(model, prompt, 4, n, end_ids=[])
            else:
                for _ in generate(
                    model, prompt, n, num_samples=16, generator=torch.Generator().manual_seed(0)
                ):
                    pass
            return n / (time.perf_counter() - t0)

        runs, peaks = [], []  # (steps/s, bandwidth), FLOP/s: each beside the run
        for _ in range(5):
            run, flops = beside(lambda: products_peak()[0], lambda: beside_bandwidth(steps_per_s))
            runs.append(run)
            peaks.append(flops)
        by_torch = torch_products(model, rows)
        kv = kv_bytes(model, rows, len(prompt), n)
        top = max(peak[0], *peaks)  # the run's highest
        by_flops = top / (2 * params * rows)
        limits = [  # each run's own
            min(b / (weight_bytes(model) + kv), f / (2 * params * rows))
            for (_, b), f in zip(runs, peaks, strict=True)
        ]
        share = statistics.median(s / limit for (s, _), limit in zip(runs, limits, strict=True))
        steps = statistics.median(s for s, _ in runs)
        by_bw = bw / (weight_bytes(model) + kv)  # against the run's highest bandwidth
        out.append(
            Result(
                f"{name}, GPT-2 124M, bf16",
                steps * rows,
                statistics.median(limits) * rows,
                "tokens/s",
                "the machine's limit",
                ">= 80% of the binding limit",
                share >= 0.8,
                [
                    f"{n} steps from the 16-token prompt, the median of 5; {steps:.1f} steps/s; "
                    f"{100 * share:.0f}% of the binding limit beside each run (the median; bandwidth "
                    f"beside the runs {', '.join(f'{b / 1e9:.1f}' for _, b in runs)} GB/s, {peak[1]} "
                    f"matmuls {', '.join(f'{f / 1e9:.0f}' for f in peaks)} GFLOP/s); "
                    f"against the run's highest bandwidth: bandwidth limit {by_bw:.0f} steps/s "
                    f"({100 * steps / by_bw:.0f}%: {weight_bytes(model) / 1e6:.0f} MB of weights and "
                    f"{kv / 1e6:.0f} MB of KV cache a step on average; the weights alone "
                    f"{bw / weight_bytes(model):.0f} steps/s), compute limit {by_flops:.0f} "
                    f"steps/s ({100 * steps / by_flops:.0f}%; peak {top / 1e9:.0f} GFLOP/s, {peak[1]} "
                    f"matmuls); "
                    f"{steps / greedy:.2f}x the steps/s of batch-1 greedy decoding in this run "
                    f"({greedy:.1f}); "
                    f"torch's own bf16 products for such a step alone, nothing else: {by_torch:.1f} steps/s "
                    f"({100 * by_torch / by_flops:.0f}% of the compute limit; gptcli's whole step "
                    f"{steps / by_torch:.2f}x that)"
                ],
            )
        )
    return out


def run(args) -> list[Result]:
    n = 50 if args.quick else 200
    work = scratch("gptcli-llama-")
    _, fp32 = gpt2_pair()
    run_dir = save_run(fp32, work)
    files, why_not = ggufs(fp32, work, getattr(args, "llama_convert", None))
    models = decoding_models(fp32)
    kernels.LIBRARY.wait()
    prompt = torch.randint(0, 50257, (16,), generator=torch.Generator().manual_seed(1)).tolist()
    llms = {}
    if files:
        from llama_cpp import Llama

        for kind, path in files.items():
            llms[kind] = Llama(
                model_path=str(path),
                n_ctx=1024,
                n_threads=torch.get_num_threads(),
                n_batch=512,
                verbose=False,
            )
    for m in models.values():  # warm-up: first use of each model
        ours_tps(m, prompt, 8)
    ours_runs: dict[str, list[float]] = {k: [] for k in models}
    beside: dict[str, list[float]] = {k: [] for k in models}  # each run's share of the bandwidth beside it
    peer_runs: dict[str, list[float]] = {k: [] for k in llms}
    bws, peaks = [], []  # this shared machine's speed moves within a run
    for _ in range(args.repeats):
        peaks.append(products_peak())
        for ours_kind, peer_kind in PAIRS:
            m = models[ours_kind]
            tps, b = beside_bandwidth(lambda m=m: ours_tps(m, prompt, n))
            ours_runs[ours_kind].append(tps)
            beside[ours_kind].append(tps * weight_bytes(m) / b)
            bws.append(b)
            if peer_kind in llms:
                peer_runs[peer_kind].append(llama_tps(llms[peer_kind], prompt, n)[0])
    bw = max(bws)  # the most the machine gave in this run
    results = []
    targets = {
        "bf16": (1.1, ">= 1.1x, >= 80% of bandwidth"),
        "fp32": (1.0, ">= 1.0x"),
        "int8": (1.0, ">= 1.0x, >= 1.6x gptcli bf16"),
    }
    for ours_kind, peer_kind in PAIRS:
        ours = statistics.median(ours_runs[ours_kind])
        peer = statistics.median(peer_runs[peer_kind]) if peer_runs.get(peer_kind) else None
        share = ours * weight_bytes(models[ours_kind]) / bw
        share_beside = statistics.median(beside[ours_kind])
        ratio_needed, target = targets[ours_kind]
        met = None if peer is None else ours / peer >= ratio_needed
        if ours_kind == "bf16" and met is not None:
            met = met and share_beside >= 0.8
        if ours_kind == "int8":
            vs_bf16 = ours / statistics.median(ours_runs["bf16"])
            met = (met if met is not None else True) and vs_bf16 >= 1.6
        notes = [
            f"{n} new tokens from a 16-token prompt, greedy, {torch.get_num_threads()} threads; "
            f"{100 * share_beside:.0f}% of the bandwidth measured beside each run (the median; torch's "
            "sum over 1 GiB, which the kernel's several streams a thread can pass), "
            f"{100 * share:.0f}% of the run's highest ({bw / 1e9:.1f} GB/s, the highest of "
            f"{len(bws)} measurements beside the runs, the lowest {min(bws) / 1e9:.1f}; "
            f"{weight_bytes(models[ours_kind]) / 1e6:.0f} MB read per token)"
        ]
        if ours_kind == "int8":
            notes.append(f"{vs_bf16:.2f}x gptcli bf16")
        if why_not and ours_kind == "bf16":
            notes.append(why_not)
        results.append(
            Result(
                f"decoding on the CPU, GPT-2 124M, {ours_kind}",
                ours,
                peer,
                "tokens/s",
                f"llama.cpp {peer_kind}",
                target,
                met,
                notes,
            )
        )
    greedy = statistics.median(ours_runs["bf16"])
    peaks.append(products_peak())  # the limit: the highest, as for the bandwidth
    results += batches(models["bf16"], prompt, n, bw, max(peaks), greedy)  # as many steps as greedy
    results.append(prompts(models["bf16"], llms.get("f16"), 64 if args.quick else 256, args.repeats))
    results += first_token(run_dir, files.get("f16"), 2 if args.quick else 3)
    return results
