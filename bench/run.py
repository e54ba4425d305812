"""gptcli against its peers, side by side in one run: a table of our figure, the peer's, and
the ratio, appended with the machine's details to bench/RESULTS.md.

    python bench/run.py                       # every case (about 20 minutes on 2 cores)
    python bench/run.py --quick               # shorter runs, no equal-time training case
    python bench/run.py --only decode,beam    # some cases
    python bench/run.py --nanogpt ~/src/nanoGPT --corpus tinyshakespeare.txt
    python bench/run.py --only muon --nanogpt ~/src/nanoGPT --corpus tinyshakespeare.txt

The in-repo peer is Hugging Face transformers (a dev dependency). nanoGPT is not part of
this project: give --nanogpt DIR (a checkout of it) to also run its model and loop for the
training cases; its code is imported from there, never copied here.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib.util
import math
import multiprocessing
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptcli.config import ModelConfig, load_config  # noqa: E402
from gptcli.infer.generate import GREEDY, beam_search, generate  # noqa: E402
from gptcli.infer.kernels import use_fast_decode  # noqa: E402
from gptcli.model import GPT  # noqa: E402
from gptcli.reports import Reporter  # noqa: E402
from gptcli.runtime import cpu_name, keep_freed_memory, measured_peak_flops  # noqa: E402
from gptcli.store.hf import hf_to_gptcli_state_dict  # noqa: E402


@dataclass
class Result:
    case: str
    ours: float
    peer: float | None
    unit: str
    peer_name: str
    target: str
    passed: bool | None
    notes: list[str] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        return None if not self.peer else self.ours / self.peer


def quiet_transformers():
    import transformers

    transformers.logging.set_verbosity_error()
    return transformers


def median_of(fn, repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def memory_bandwidth() -> float:
    """Bytes/s read by the best of several sums over a 1 GiB tensor (all threads)."""
    x = torch.ones(1 << 28, dtype=torch.float32)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0))
    return best


def gpt2_pair(seed: int = 0):
    """A random GPT-2 124M in Hugging Face and the same weights in gptcli (fp32)."""
    transformers = quiet_transformers()
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config()).eval()
    ours = GPT(ModelConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768))
    ours.load_state_dict(hf_to_gptcli_state_dict(hf.state_dict()), strict=False)
    return hf, ours.eval()


def to_bf16(model: GPT) -> GPT:
    copy = GPT(model.config)
    copy.load_state_dict(model.state_dict())
    copy.eval().to(torch.bfloat16)
    use_fast_decode(copy)
    return copy


# --- training speed -------------------------------------------------------------------------


def train_tokens_per_s(step, batch_tokens: int, steps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch_tokens / (time.perf_counter() - t0)


class _Rates(Reporter):
    """Keeps the tokens/s of every step after the first few, and the process's peak
    resident memory as of the last step (before the final checkpoint is written)."""

    def __init__(self, skip: int) -> None:
        self.skip, self.rates, self.peak_rss = skip, [], 0

    def on_step(self, r) -> None:
        import resource

        if r.step > self.skip and r.tokens_per_s:
            self.rates.append(r.tokens_per_s)
        self.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def ours_trainer_run(
    cfg: ModelConfig, batch: int, steps: int, compile_: bool, work: Path, adapt=None, rates=None
) -> tuple[float, GPT]:
    """Tokens/s of gptcli's own training loop (the Trainer: data sampling, autocast,
    clipping, fused AdamW), on random tokens. adapt(model): changes the model first (LoRA);
    rates: the _Rates to fill in."""
    from gptcli.config import flag_overrides
    from gptcli.data.tokenizer import CharTokenizer
    from gptcli.tasks import LMTask
    from gptcli.train.trainer import Trainer

    warm = 3
    config = load_config(
        None,
        flag_overrides(
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_embd=cfg.n_embd,
            block_size=cfg.block_size,
            bias=cfg.bias,
            batch_size=batch,
            max_iters=warm + steps,
            eval_interval=10_000,
            eval_iters=1,
            log_interval=1,
            device="cpu",
            dtype="auto",
            compile=compile_,
            optimizer="adamw",  # nanoGPT's; the muon case measures Muon
            warmup_iters=0,
        ),
    )
    config.model.vocab_size = cfg.vocab_size
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, 200_000).astype(np.uint16)
    tok = CharTokenizer([chr(ord("!") + i) for i in range(cfg.vocab_size)])
    torch.manual_seed(0)
    model = GPT(config.model)
    if adapt is not None:
        adapt(model)
    rates = rates if rates is not None else _Rates(skip=warm)
    rates.skip = warm
    run_dir = Path(tempfile.mkdtemp(dir=work))
    Trainer(model, tok, LMTask(data, data[:10_000], cfg.block_size), config, run_dir).run(reporter=rates)
    shutil.rmtree(run_dir, ignore_errors=True)
    return statistics.median(rates.rates), model


def nanogpt_module(path: Path):
    spec = importlib.util.spec_from_file_location("nanogpt_model", path / "model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def nanogpt_train_step(nanogpt: Path, cfg: ModelConfig, batch: int):
    """nanoGPT's model and loop on the CPU (fp32, as its train.py runs there)."""
    mod = nanogpt_module(nanogpt)
    torch.manual_seed(0)
    with contextlib.redirect_stdout(open(os.devnull, "w")):
        model = mod.GPT(
            mod.GPTConfig(
                block_size=cfg.block_size,
                vocab_size=cfg.vocab_size,
                n_layer=cfg.n_layer,
                n_head=cfg.n_head,
                n_embd=cfg.n_embd,
                dropout=0.0,
                bias=False,
            )
        )
        opt = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))
    y = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))

    def step() -> None:
        _, loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def hf_train_step(cfg: ModelConfig, batch: int):
    transformers = quiet_transformers()
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(
            vocab_size=cfg.vocab_size,
            n_positions=cfg.block_size,
            n_layer=cfg.n_layer,
            n_head=cfg.n_head,
            n_embd=cfg.n_embd,
            resid_pdrop=0,
            embd_pdrop=0,
            attn_pdrop=0,
        )
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.block_size))

    def step() -> None:
        loss = model(x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def _in_child(fn, *args):
    """fn(*args) in a fresh Python process. gptcli's Trainer changes a process-wide setting
    on the CPU (it keeps freed memory, see runtime.keep_freed_memory), which must not reach
    a peer measured after it; each measurement gets a process of its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


def _ours_rate(cfg: ModelConfig, batch: int, steps: int, work: Path) -> tuple[float, float]:
    rate, model = ours_trainer_run(cfg, batch, steps, compile_=True, work=work)
    return rate, model.flops_per_token(cfg.block_size)


def _peer_rate(
    peer: str, nanogpt: Path | None, cfg: ModelConfig, batch: int, steps: int, keep: bool
) -> float:
    if keep:
        keep_freed_memory()
    step = nanogpt_train_step(nanogpt, cfg, batch) if peer == "nanogpt" else hf_train_step(cfg, batch)
    return train_tokens_per_s(step, batch * cfg.block_size, steps)


def case_train_speed(args) -> list[Result]:
    cfg = ModelConfig(vocab_size=65, block_size=256, n_layer=6, n_head=6, n_embd=384, bias=False)
    batch, steps = 16, (4 if args.quick else 10)
    # name -> (peer, keep freed memory as gptcli does); the first is the target's peer
    peers = {"HF GPT2LMHeadModel (fp32)": ("hf", False)}
    if args.nanogpt:
        peers = {
            "nanoGPT (fp32)": ("nanogpt", False),
            **peers,
            "nanoGPT (fp32), keeping freed memory as gptcli does": ("nanogpt", True),
        }
    work = Path(tempfile.mkdtemp(prefix="gptcli-bench-"))
    # alternate the runs so that load on this shared machine hits all of them alike
    ours_runs: list[float] = []
    peer_runs: dict[str, list[float]] = {k: [] for k in peers}
    for _ in range(args.repeats):
        rate, flops_per_token = _in_child(_ours_rate, cfg, batch, steps, work)
        ours_runs.append(rate)
        for k, (peer, keep) in peers.items():
            peer_runs[k].append(_in_child(_peer_rate, peer, args.nanogpt, cfg, batch, steps, keep))
    shutil.rmtree(work, ignore_errors=True)
    ours = statistics.median(ours_runs)
    peak = measured_peak_flops(torch.device("cpu"), torch.bfloat16)
    mfu = flops_per_token * ours / peak
    out = []
    for i, (k, runs) in enumerate(peer_runs.items()):
        peer = statistics.median(runs)
        main = i == 0 and k.startswith("nanoGPT")
        notes = [
            "gptcli's Trainer with --compile and dtype auto (bf16 autocast), bias off as in nanoGPT; "
            f"MFU {100 * mfu:.1f}% of the measured bf16 matmul peak ({peak / 1e9:.0f} GFLOP/s); "
            "each run in a process of its own"
        ]
        out.append(
            Result(
                "train 6L/6H/384, block 256, batch 16, char",
                ours,
                peer,
                "tokens/s",
                k,
                ">= 2.0x nanoGPT, MFU >= 60%" if main else "(reference)",
                (ours / peer >= 2.0 and mfu >= 0.6) if main else None,
                notes if i == 0 else [],
            )
        )
    return out


# --- val loss at equal wall time ------------------------------------------------------------


def case_equal_time(args) -> list[Result]:
    """nanoGPT's CPU shakespeare_char run, then gptcli's with the same config given the
    same wall time; both scored on the whole val split of the same text."""
    if not args.nanogpt or not args.corpus:
        return [
            Result(
                "val loss at equal wall time",
                float("nan"),
                None,
                "",
                "nanoGPT",
                "lower",
                None,
                ["skipped: needs --nanogpt DIR and --corpus tinyshakespeare.txt"],
            )
        ]
    from bench.val_loss import full_val_loss, nanogpt_model
    from gptcli.data.corpus import load_split, tokenize_corpus
    from gptcli.store.checkpoint import load_checkpoint

    work = Path(tempfile.mkdtemp(prefix="gptcli-bench-"))
    data = args.nanogpt / "data" / "shakespeare_char"
    shutil.copy(args.corpus, data / "input.txt")
    subprocess.run([sys.executable, "prepare.py"], cwd=data, check=True, capture_output=True)
    cmd = [
        sys.executable,
        "train.py",
        "config/train_shakespeare_char.py",
        "--device=cpu",
        "--compile=False",
        "--eval_iters=20",
        "--log_interval=1",
        "--block_size=64",
        "--batch_size=12",
        "--n_layer=4",
        "--n_head=4",
        "--n_embd=128",
        "--max_iters=2000",
        "--lr_decay_iters=2000",
        "--dropout=0.0",
        f"--out_dir={work / 'nanogpt'}",
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=args.nanogpt, check=True, capture_output=True)
    wall = time.perf_counter() - t0
    tok_dir = work / "tokens"
    tokenize_corpus([args.corpus], tok_dir, "char")
    val = load_split(tok_dir, "val")
    theirs = full_val_loss(nanogpt_model(work / "nanogpt" / "ckpt.pt"), val)
    run = work / "ours"
    cmd = [
        sys.executable,
        "-m",
        "gptcli",
        "pretrain",
        str(tok_dir),
        "-c",
        str(ROOT / "examples" / "configs" / "shakespeare-char-cpu.yaml"),
        "--out",
        str(run),
        "--max-time",
        f"{wall:.1f}",
        "--max-iters",
        "100000",
        "--optimizer",
        "adamw",  # the same optimizer as nanoGPT: this case measures the loop (muon: Muon's gain)
    ]
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    loaded = load_checkpoint(run / "last")
    ours = full_val_loss(loaded.model, val)
    steps = loaded.meta["step"]
    return [
        Result(
            "val loss, shakespeare-char-cpu.yaml, equal wall time",
            ours,
            theirs,
            "val loss",
            "nanoGPT (2000 iters)",
            "lower",
            ours < theirs,
            [f"wall time {wall:.0f} s each; gptcli ran {steps} steps in it; whole val split scored"],
        )
    ]


# --- decoding -------------------------------------------------------------------------------


def hf_greedy(hf, prompt: torch.Tensor, n: int) -> float:
    """Tokens/s of HF generate, greedy, exactly n new tokens."""
    t0 = time.perf_counter()
    with torch.no_grad():
        hf.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            pad_token_id=50256,
        )
    return n / (time.perf_counter() - t0)


def ours_greedy(model: GPT, prompt: torch.Tensor, n: int, compile: bool = False) -> float:
    t0 = time.perf_counter()
    for _ in generate(model, prompt[0].tolist(), n, sampling=GREEDY, compile=compile):
        pass
    return n / (time.perf_counter() - t0)


def case_decode_static(args) -> list[Result]:
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


def case_decode(args) -> list[Result]:
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


def case_decode_long(args) -> list[Result]:
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


def case_beam(args) -> list[Result]:
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


# --- tokenizing -----------------------------------------------------------------------------


def case_bpe(args) -> list[Result]:
    from gptcli.data.corpus import tokenize_corpus
    from gptcli.data.tokenizer import gpt2_tokenizer

    work = Path(tempfile.mkdtemp(prefix="gptcli-bench-"))
    seed = (args.corpus.read_text(encoding="utf-8") if args.corpus else None) or _generated_text()
    size = (10 if args.quick else 50) * 1_000_000
    text = (seed * (size // len(seed.encode()) + 1))[:size]
    src = work / "corpus.txt"
    src.write_text(text, encoding="utf-8")
    n = len(text.encode())
    enc = gpt2_tokenizer().enc

    def peer() -> float:
        t0 = time.perf_counter()
        enc.encode_ordinary(text)
        return n / 1e6 / (time.perf_counter() - t0)

    def ours() -> float:
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        tokenize_corpus([src], out, "gpt2")  # read, check, encode, write train/val shards
        return n / 1e6 / (time.perf_counter() - t0)

    ours_runs, peer_runs = [], []
    for _ in range(args.repeats):
        ours_runs.append(ours())
        peer_runs.append(peer())
    shutil.rmtree(work, ignore_errors=True)
    o, p = statistics.median(ours_runs), statistics.median(peer_runs)
    return [
        Result(
            f"GPT-2 BPE encoding, {size // 1_000_000} MB corpus",
            o,
            p,
            "MB/s",
            "tiktoken encode_ordinary, 1 thread",
            ">= 1.7x",
            o / p >= 1.7,
            ["ours: `gptcli tokenize --out` end to end (hash, split, encode, write shards)"],
        )
    ]


def case_formats(args) -> list[Result]:
    """`gptcli tokenize` of the same documents as JSONL, gzip and zstd JSONL, and Parquet
    (and the same text as .txt, .txt.gz, .txt.zst): MB of text per second, each against
    the plain file in the same run; formats interleaved, the best of the repeats kept."""
    import gzip
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq
    import zstandard

    from gptcli.data.corpus import tokenize_corpus
    from gptcli.data.sources import Reader

    work = Path(tempfile.mkdtemp(prefix="gptcli-bench-"))
    seed = (args.corpus.read_text(encoding="utf-8") if args.corpus else None) or _generated_text()
    lines = [ln for ln in seed.splitlines() if ln.strip()]
    size = (5 if args.quick else 25) * 1_000_000
    docs, total = [], 0
    while total < size:
        doc = "\n".join(lines[len(docs) * 7 % len(lines) :][:7])
        docs.append(doc)
        total += len(doc.encode())
    blob = "".join(json.dumps({"text": d}) + "\n" for d in docs).encode()
    paths = {"jsonl": work / "d.jsonl", "jsonl.gz": work / "d.jsonl.gz", "jsonl.zst": work / "d.jsonl.zst"}
    paths["jsonl"].write_bytes(blob)
    paths["jsonl.gz"].write_bytes(gzip.compress(blob, compresslevel=6))
    paths["jsonl.zst"].write_bytes(zstandard.ZstdCompressor(level=3).compress(blob))
    paths["parquet"] = work / "d.parquet"
    pq.write_table(pa.table({"text": docs}), paths["parquet"])
    text = "\n".join(docs).encode()  # the same text as one plain-text document
    paths["txt"] = work / "d.txt"
    paths["txt"].write_bytes(text)
    paths["txt.gz"] = work / "d.txt.gz"
    paths["txt.gz"].write_bytes(gzip.compress(text, compresslevel=6))
    paths["txt.zst"] = work / "d.txt.zst"
    paths["txt.zst"].write_bytes(zstandard.ZstdCompressor(level=3).compress(text))

    def rate(path: Path) -> float:
        out = work / "out"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        tokenize_corpus([path], out, "gpt2", reader=Reader())
        return total / 1e6 / (time.perf_counter() - t0)

    runs: dict[str, list[float]] = {k: [] for k in paths}
    for _ in range(args.repeats):
        for k, p in paths.items():
            runs[k].append(rate(p))
    shutil.rmtree(work, ignore_errors=True)
    results = []
    for k, base in (
        ("jsonl.gz", "jsonl"),
        ("jsonl.zst", "jsonl"),
        ("parquet", "jsonl"),
        ("txt.gz", "txt"),
        ("txt.zst", "txt"),
    ):
        ours, plain = max(runs[k]), max(runs[base])  # the best run of each: the least disturbed
        what = "the same documents as plain .jsonl" if base == "jsonl" else "the same text as plain .txt"
        results.append(
            Result(
                f"tokenize {total / 1e6:.0f} MB as .{k} (GPT-2 BPE)",
                ours,
                plain,
                "MB/s",
                what,
                ">= 0.9x",
                ours / plain >= 0.9,
            )
        )
    return results


def _generated_text() -> str:
    sys.path.insert(0, str(ROOT / "examples"))
    import random

    from make_demo_corpus import story

    rng = random.Random(0)
    return "\n".join(story(rng) for _ in range(20000)) + "\n"


# --- evaluation -----------------------------------------------------------------------------


def _eval_text_source(args) -> str:
    return (args.corpus.read_text(encoding="utf-8") if args.corpus else None) or _generated_text()


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


def case_eval_text(args) -> list[Result]:
    """Tokens scored per second, GPT-2 124M, windows of 1024: gptcli eval's batched windows
    in the dtype it picks on this CPU, against HF's forward pass on the same windows."""
    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.evals.text import encode_text, evaluate_text
    from gptcli.runtime import pick_inference_dtype

    hf, ours32 = gpt2_pair()
    tok = gpt2_tokenizer()
    windows = 4 if args.quick else 12
    work = Path(tempfile.mkdtemp())
    text, chars = _eval_text_source(args), 4000 * windows
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


def case_eval_choice(args) -> list[Result]:
    """Multiple-choice examples per second (4 choices, HellaSwag-sized), GPT-2 124M, fp32 on
    both sides: gptcli eval against a plain per-choice Hugging Face loop."""
    import json
    import random

    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.evals.choice import evaluate_choice

    hf, ours = gpt2_pair()
    tok = gpt2_tokenizer()
    lines = [ln.strip() for ln in _eval_text_source(args).splitlines() if len(ln.split()) >= 6]
    rng = random.Random(0)
    n = 16 if args.quick else 48
    rows = []
    for i in range(n):
        context = " ".join(lines[(3 * i + k) % len(lines)] for k in range(3))  # about 40 tokens
        choices = [" ".join(rng.choice(lines).split()[:14]) for _ in range(4)]  # about 18 tokens each
        rows.append({"context": context, "choices": choices, "label": i % 4})
    work = Path(tempfile.mkdtemp())
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


# --- LoRA ------------------------------------------------------------------------------------

GPT2_MEDIUM = ModelConfig(vocab_size=50257, block_size=128, n_layer=24, n_head=16, n_embd=1024)


def _adapt(model: GPT) -> None:
    from gptcli import lora

    lora.add_adapters(model, lora.LoRASettings(rank=8, alpha=16))


def _finetune_probe(rank: int, batch: int, steps: int, work: str) -> tuple[float, int, int]:
    """(seconds per step, peak resident bytes while training, parameters trained) of the
    Trainer finetuning the GPT-2 medium shape, in full or with LoRA adapters of rank 8."""
    rates = _Rates(skip=0)
    rate, model = ours_trainer_run(
        GPT2_MEDIUM, batch, steps, False, Path(work), adapt=_adapt if rank else None, rates=rates
    )
    trained = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return batch * GPT2_MEDIUM.block_size / rate, rates.peak_rss, trained


def _demo_finetunes(work: Path, steps: int) -> list[tuple[str, float, float]]:
    """(task, best val loss in full, with LoRA) on the demo finetuning sets, from a demo
    model pretrained here as `make demo` trains it."""
    import json

    from gptcli.config import FinetuneSettings, flag_overrides
    from gptcli.train.recipes import finetune_trainer, pretrain_trainer

    demo = work / "demo"
    config = ROOT / "examples" / "configs" / "demo.yaml"
    pretrain_trainer([ROOT / "examples" / "demo" / "animals.jsonl"], config_path=config, out=demo).run()
    out = []
    for task, name in (("classify", "needs"), ("choice", "reasons"), ("sft", "why")):
        best = []
        for rank in (0, 8):
            settings = FinetuneSettings(
                task=task, data=[str(ROOT / "examples" / "finetune" / f"{name}.jsonl")], base=str(demo),
                lora_rank=rank,
            ).validate()  # fmt: skip
            # LoRA's usual learning rate is about ten times full finetuning's
            flags = flag_overrides(max_iters=steps, eval_interval=steps // 4, lr=3e-3 if rank else 3e-4)
            run_dir = work / f"{name}-{rank}"
            finetune_trainer(settings, flags=flags, out=run_dir).run()
            meta = json.loads((run_dir / "last" / "checkpoint.json").read_text())
            best.append(meta["best_val_loss"])
        out.append((f"{task} ({name}.jsonl)", best[0], best[1]))
    return out


def case_lora(args) -> list[Result]:
    """Finetuning the GPT-2 medium shape (355M) on the CPU, batch 2 x 128 tokens, fp32:
    LoRA (rank 8 on every Linear of the blocks) against full finetuning, each in a fresh
    process; then the val loss both reach on the demo finetuning sets."""
    work = Path(tempfile.mkdtemp())
    steps = 3 if args.quick else 5
    try:
        full_s, full_rss, full_n = _in_child(_finetune_probe, 0, 2, steps, str(work))
        lora_s, lora_rss, lora_n = _in_child(_finetune_probe, 8, 2, steps, str(work))
        losses = _in_child(_demo_finetunes, work, 100 if args.quick else 200)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    gib = 1 << 30
    trained = f"LoRA trains {lora_n:,} parameters, full finetuning {full_n:,}"
    results = [
        Result(
            "finetune GPT-2 medium shape, peak resident memory (LoRA vs full)",
            lora_rss / gib, full_rss / gib, "GiB", "full finetuning, AdamW", "<= 0.5x",
            lora_rss <= 0.5 * full_rss, [trained],
        ),
        Result(
            "finetune GPT-2 medium shape, seconds per step (LoRA vs full)",
            lora_s, full_s, "s", "full finetuning, AdamW", "<= 0.8x", lora_s <= 0.8 * full_s,
        ),
    ]  # fmt: skip
    for task, full, adapted in losses:
        results.append(
            Result(
                f"demo finetune {task}: best val loss, LoRA rank 8 (lr 3e-3) vs full (lr 3e-4)",
                adapted, full, "", "full finetuning", "", None,
            )
        )  # fmt: skip
    return results


# --- start-up -------------------------------------------------------------------------------


MINIMAL_TYPER_APP = """
import typer
app = typer.Typer()
@app.command()
def a(x: int = 1):
    "A."
@app.command()
def b(y: int = 2):
    "B."
app()
"""


def case_help(args) -> list[Result]:
    """`gptcli --help` against the floor of any Typer CLI on this machine: a two-command
    Typer app's --help, interleaved."""
    exe = shutil.which("gptcli") or str(Path(sys.executable).parent / "gptcli")
    minimal = Path(tempfile.mkdtemp()) / "app.py"
    minimal.write_text(MINIMAL_TYPER_APP)

    def once(cmd: list[str]) -> float:
        t0 = time.perf_counter()
        subprocess.run(cmd, check=True, capture_output=True)
        return time.perf_counter() - t0

    ours_cmd, floor_cmd = [exe, "--help"], [sys.executable, str(minimal), "--help"]
    once(ours_cmd), once(floor_cmd)
    ours, floor = [], []
    for _ in range(7):
        ours.append(once(ours_cmd))
        floor.append(once(floor_cmd))
    t, f = statistics.median(ours), statistics.median(floor)
    peer = "a two-command Typer app's --help"
    return [Result("`gptcli --help` wall time", t, f, "s", peer, "<= 0.3 s", t <= 0.3)]


def case_chart(args) -> list[Result]:
    """The live view's loss chart redrawn after 50,000 logged steps, against after 500."""
    from gptcli.cli.render.training import Series, loss_chart

    def redraw(steps: int) -> float:
        points = [(s, 3.0 * math.exp(-s / steps) + 1.0) for s in range(1, steps + 1)]
        train, val = Series(points), Series(points[:: steps // 100])  # 100 evaluations either way
        t0 = time.perf_counter()
        loss_chart(train, val, 110, 16)
        return time.perf_counter() - t0

    redraw(500)
    short, long = median_of(lambda: redraw(500), 5), median_of(lambda: redraw(50_000), 5)
    return [
        Result(
            "live loss chart redraw, 50,000 steps of history (vs 500)",
            long * 1000,
            short * 1000,
            "ms",
            "the same chart after 500 steps",
            "<= 2x",
            long <= 2 * short,
        )
    ]


def case_muon(args) -> list[Result]:
    """--optimizer muon against adamw and nanoGPT, three seeds (bench/muon.py)."""
    from bench.muon import compare_optimizers

    return compare_optimizers(args, Result)


CASES = {
    "train": case_train_speed,
    "equal-time": case_equal_time,
    "decode": case_decode,
    "decode-long": case_decode_long,
    "decode-static": case_decode_static,
    "beam": case_beam,
    "bpe": case_bpe,
    "help": case_help,
    "eval-text": case_eval_text,
    "eval-choice": case_eval_choice,
    "chart": case_chart,
    "formats": case_formats,
    "lora": case_lora,
    "muon": case_muon,
}


def machine() -> str:
    return (
        f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"python {platform.python_version()}, device cpu, {torch.get_num_threads()} threads"
    )


def table(results: list[Result]) -> str:
    rows = ["| case | gptcli | peer | ratio | target | met |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        peer = "" if r.peer is None else f"{r.peer:,.3g} {r.unit} ({r.peer_name})"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        met = {True: "yes", False: "**no**", None: ""}[r.passed]
        rows.append(f"| {r.case} | {r.ours:,.3g} {r.unit} | {peer} | {ratio} | {r.target} | {met} |")
    notes = [f"- {r.case}: {n}" for r in results for n in r.notes]
    return "\n".join([*rows, "", *notes])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="shorter runs; skip the equal-time training case"
    )
    parser.add_argument("--only", help="comma-separated cases: " + ", ".join(CASES))
    parser.add_argument("--repeats", type=int, default=3, help="alternating repetitions per case")
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout to run beside (never copied here)")
    parser.add_argument("--corpus", type=Path, help="tinyshakespeare.txt, for the equal-time and BPE cases")
    parser.add_argument("--no-write", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    names = (
        args.only.split(",") if args.only else [c for c in CASES if not (args.quick and c == "equal-time")]
    )
    results: list[Result] = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results += CASES[name](args)
        gc.collect()
    report = table(results)
    print(report)
    if not args.no_write:
        cmd = "python bench/run.py " + " ".join(sys.argv[1:])
        stamp = time.strftime("%Y-%m-%d %H:%M")
        with open(ROOT / "bench" / "RESULTS.md", "a", encoding="utf-8") as f:
            f.write(f"\n## bench/run.py, {stamp}\n\n`{cmd}`\n\n{machine()}\n\n{report}\n")


if __name__ == "__main__":
    main()
