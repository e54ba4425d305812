"""What the bench cases share: the row type (Result) and the helpers several cases use."""

from __future__ import annotations

import atexit
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from gptcli.config import ModelConfig, load_config
from gptcli.infer.generate import GREEDY, generate
from gptcli.infer.kernels import use_fast_decode
from gptcli.infer.quantize import quantize
from gptcli.model import GPT
from gptcli.reports import Reporter
from gptcli.runtime import keep_freed_memory
from gptcli.store.hf import hf_to_gptcli_state_dict

ROOT = Path(__file__).resolve().parents[1]

_SCRATCH: list[Path] = []


def installed_env(**extra: str) -> dict[str, str]:
    """The environment for timing gptcli as a whole process, as an installed copy starts: with
    Python's bytecode cached (pip compiles it at install; PYTHONDONTWRITEBYTECODE, set in some
    CI images, would leave a work tree's modules compiled from source at every start), so
    that the warm-up run writes it and the timed runs read it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, **extra}


def scratch(prefix: str = "gptcli-bench-") -> Path:
    """A fresh directory for a case's files (models, GGUF files, corpora: a gigabyte or more),
    removed once the case is over (remove_scratch), whether it finished or failed."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    _SCRATCH.append(path)
    return path


@atexit.register
def remove_scratch() -> None:
    """Remove every scratch directory made so far (bench/run.py: after each case; and at exit)."""
    while _SCRATCH:
        shutil.rmtree(_SCRATCH.pop(), ignore_errors=True)


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


def decoding_models(fp32: GPT) -> dict[str, GPT]:
    """fp32's weights as fp32 (fp32 itself), bf16 and int8 (--quantize int8), each decoding
    through the CPU kernel, in a process that keeps the memory it frees (as `gptcli`'s
    decoding verbs have it: cli.common.start_decoding)."""
    keep_freed_memory()
    models = {"fp32": fp32, "bf16": to_bf16(fp32), "int8": to_bf16(fp32)}
    quantize(models["int8"])
    for m in models.values():
        use_fast_decode(m)
    return models


class Rates(Reporter):
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
    rates: the Rates to fill in."""
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
    rates = rates if rates is not None else Rates(skip=warm)
    rates.skip = warm
    run_dir = Path(tempfile.mkdtemp(dir=work))
    Trainer(model, tok, LMTask(data, data[:10_000], cfg.block_size), config, run_dir).run(reporter=rates)
    shutil.rmtree(run_dir, ignore_errors=True)
    return statistics.median(rates.rates), model


def in_child(fn, *args):
    """fn(*args) in a fresh Python process. gptcli's Trainer changes a process-wide setting
    on the CPU (it keeps freed memory, see runtime.keep_freed_memory), which must not reach
    a peer measured after it; each measurement gets a process of its own."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(fn, *args).result()


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


def memory_bandwidth() -> float:
    """Bytes/s read by the best of several sums over a 1 GiB tensor (all threads)."""
    x = torch.ones(1 << 28, dtype=torch.float32)
    best = 0.0
    for _ in range(5):
        t0 = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - t0))
    return best


T = TypeVar("T")


def beside(measure: Callable[[], float], run: Callable[[], T]) -> tuple[T, float]:
    """run()'s result and measure() beside it: the higher of a measurement just before and
    one just after. This shared machine's bandwidth and FMA rate move up to 2x within a
    minute, so a share of a peak measured minutes away measures the neighbours as much as
    the code; each run is also put beside the run's highest measurement (both are written)."""
    before = measure()
    result = run()
    return result, max(before, measure())


def beside_bandwidth(run: Callable[[], float]) -> tuple[float, float]:
    """run()'s result and the memory bandwidth beside it (beside)."""
    return beside(memory_bandwidth, run)


def ours_greedy(model: GPT, prompt: torch.Tensor, n: int, compile: bool = False) -> float:
    t0 = time.perf_counter()
    for _ in generate(model, prompt[0].tolist(), n, sampling=GREEDY, compile=compile):
        pass
    return n / (time.perf_counter() - t0)


def generated_text() -> str:
    sys.path.insert(0, str(ROOT / "examples"))
    import random

    from make_demo_corpus import story

    rng = random.Random(0)
    return "\n".join(story(rng) for _ in range(20000)) + "\n"


def eval_text_source(args) -> str:
    return (args.corpus.read_text(encoding="utf-8") if args.corpus else None) or generated_text()
