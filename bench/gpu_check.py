"""Everything a lent GPU must show, in one call, written to one report to paste into
bench/RESULTS.md (each section with the command that produced it).

    python bench/gpu_check.py --out gpu-report.md [--nanogpt ~/src/nanoGPT]   # on a GPU
    python bench/gpu_check.py --dry-run                                         # CPU, tiny shapes

In the order they run (what matters most first, so that a run stopped by a time limit
keeps it; the report is saved after every section, and one section's failure is written
into it and the next goes on):

- the environment: versions, the GPU, what gptcli picks for it;
- cuda-tests: tests/test_cuda.py;
- training: GPT-2 124M (GPT-2 BPE vocabulary, block 1024, bf16 + compile + SDPA) at each
  micro-batch of --batches until one does not fit: tokens/s, MFU, peak memory, and
  --optimizer muon's tokens/s beside AdamW's; beside nanoGPT's train.py on the same tokens,
  shape and batch when a checkout is given;
- decoding: greedy (batch 1, 200 tokens) and beam search (B=4) of the 124M shape against
  Hugging Face's generate on the same weights, fp32 and bf16, and whether they agree; then
  a bf16 token profiled (its wall time against its kernels' time, the busiest kernels);
- fits: the largest GPT-2 shape that trains on this GPU (with one GPU, FSDP has nothing to
  shard over and is not measured);
- serve: the server's decoding loop alone (1 and 16 sequences, the model's share of a step),
  then the bench's serve case, `gptcli serve` under 1, 4 and 16 concurrent clients;
- decode-host: what the host adds to a compiled bf16 token (generate against the compiled
  step alone), and generate with inductor's freezing beside it;
- demo: `make demo`'s training and sampling on the device;
- suite: the whole test suite with CUDA present.

--skip leaves sections out. --dry-run does each step at tiny shapes on the CPU, saying what
it leaves out, so CI runs the script and it cannot rot.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gptcli.config import ModelConfig, flag_overrides  # noqa: E402
from gptcli.infer.generate import GREEDY, beam_search, generate  # noqa: E402
from gptcli.model import GPT  # noqa: E402

GPT2_124M = ModelConfig(vocab_size=50304, block_size=1024, n_layer=12, n_head=12, n_embd=768)
# GPT-2's vocabulary even here: the dry run builds the same tokenizer the real run does
TINY = ModelConfig(vocab_size=50304, block_size=64, n_layer=2, n_head=2, n_embd=64)
# GPT-2's released shapes, for "the largest that trains here"
SHAPES = {"124M": (12, 12, 768), "350M": (24, 16, 1024), "774M": (36, 20, 1280), "1.5B": (48, 25, 1600)}


class Report:
    """Markdown sections, each with its command (when it ran one) and what came of it."""

    def __init__(self, path: Path) -> None:
        self.lines: list[str] = []
        self.path = path

    def section(self, title: str) -> None:
        self.lines += ["", f"### {title}", ""]
        print(f"\n== {title}", flush=True)

    def save(self) -> None:
        """Written after every section, so a run stopped part-way still leaves its report."""
        self.path.write_text("\n".join(self.lines) + "\n", encoding="utf-8")

    def say(self, text: str) -> None:
        self.lines.append(text)
        print(text, flush=True)

    def command(self, cmd: list[str]) -> None:
        self.say("`" + " ".join(cmd) + "`")

    def table(self, header: list[str], rows: list[list[object]]) -> None:
        self.say("| " + " | ".join(header) + " |")
        self.say("|" + " --- |" * len(header))
        for row in rows:
            self.say("| " + " | ".join(str(c) for c in row) + " |")


def sh(report: Report, cmd: list[str], cwd: Path = ROOT, timeout: int = 3600) -> subprocess.CompletedProcess:
    report.command(cmd)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = (result.stdout + result.stderr).strip()
    if result.returncode != 0:  # the whole of it in the log; the report keeps the end
        print(output, flush=True)
    tail = output.splitlines()[-6:]
    report.say(
        f"exit {result.returncode}"
        + ("" if result.returncode == 0 else ":\n```\n" + "\n".join(tail) + "\n```")
    )
    return result


def gptcli(*args: str) -> list[str]:
    return [sys.executable, "-m", "gptcli", *args]


# --- environment --------------------------------------------------------------------------


def environment(report: Report, device: torch.device) -> None:
    from gptcli import __version__
    from gptcli.runtime import GPU_PEAKS, pick_precision

    report.section("environment")
    transformers = _transformers()
    report.say(f"gptcli {__version__}, python {platform.python_version()} ({sys.executable}), "
               f"torch {torch.__version__}, CUDA {torch.version.cuda}, transformers "
               f"{transformers.__version__ if transformers else 'not installed'}")  # fmt: skip
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = GPU_PEAKS.get(name)
        report.say(f"GPU: {name} x {torch.cuda.device_count()}, bf16 peak {peak / 1e12:.0f} TFLOP/s"
                   if peak else f"GPU: {name}: not in GPU_PEAKS, MFU will show as unknown")  # fmt: skip
    report.say(f"training precision picked: {pick_precision(device).reason}")


# --- tests ------------------------------------------------------------------------------------


@dataclass
class Context:
    work: Path  # a scratch folder, removed at the end
    device: str
    dry_run: bool
    nanogpt: Path | None
    batches: tuple[int, ...]


def cuda_tests(report: Report, ctx: Context) -> None:
    report.section("the CUDA tests")
    if ctx.dry_run:
        report.say("skipped in a dry run: tests/test_cuda.py skips without CUDA")
        return
    sh(report, [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests/test_cuda.py"])


def suite(report: Report, ctx: Context) -> None:
    report.section("the whole suite, with CUDA present")
    if ctx.dry_run:
        report.say("skipped in a dry run: CI runs the suite")
        return
    sh(report, [sys.executable, "-m", "pytest", "-q", "-n", "8", "-p", "no:cacheprovider"])


# --- the demo ---------------------------------------------------------------------------------


def demo(report: Report, ctx: Context) -> None:
    report.section("the demo on the device")
    run, device = ctx.work / "demo", ctx.device
    steps = ["--max-iters", "5", "--eval-interval", "5"] if ctx.dry_run else []
    config = str(ROOT / "examples" / "configs" / "demo.yaml")
    started = time.perf_counter()
    sh(
        report,
        gptcli(
            "pretrain", "examples/demo", "--config", config, "--out", str(run), "--device", device, *steps
        ),
    )
    report.say(f"{time.perf_counter() - started:.0f} s")
    sh(report, gptcli("sample", "--ckpt", str(run), "--num-samples", "3", "--seed", "1", "--device", device))


# --- training ---------------------------------------------------------------------------------


class Rates:
    def __init__(self) -> None:
        self.reports: list = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        return (lambda r: self.reports.append(r)) if name == "on_step" else (lambda *a, **k: None)


def train_run(
    cfg: ModelConfig,
    batch: int,
    steps: int,
    device: str,
    compile_: bool,
    work: Path,
    optimizer: str = "adamw",
) -> dict:
    """gptcli's Trainer on random tokens: median tokens/s and MFU after warm-up, peak memory."""
    from gptcli.config import load_config
    from gptcli.data.tokenizer import CharTokenizer
    from gptcli.tasks import LMTask
    from gptcli.train.trainer import Trainer

    flags = flag_overrides(
        n_layer=cfg.n_layer, n_head=cfg.n_head, n_embd=cfg.n_embd, block_size=cfg.block_size,
        batch_size=batch, max_iters=steps, eval_interval=10**6, eval_iters=1, log_interval=1,
        device=device, dtype="auto", compile=compile_, warmup_iters=0, optimizer=optimizer,
    )  # fmt: skip
    config = load_config(None, flags)
    config.model.vocab_size = cfg.vocab_size
    data = np.random.default_rng(0).integers(0, cfg.vocab_size, 2_000_000).astype(np.uint16)
    tok = CharTokenizer(_distinct_chars(cfg.vocab_size))
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    # each run compiles afresh: Dynamo would otherwise take the second batch size as a sign
    # of a dynamic dimension and compile every later run with a symbolic batch
    torch._dynamo.reset()
    rates = Rates()
    run_dir = Path(tempfile.mkdtemp(dir=work))
    Trainer(GPT(config.model), tok, LMTask(data, data[:100_000], cfg.block_size), config, run_dir).run(
        reporter=rates
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    late = [r for r in rates.reports if r.step > min(5, steps // 2) and r.tokens_per_s]
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    return {
        "tokens_per_s": float(np.median([r.tokens_per_s for r in late])) if late else None,
        "mfu": float(np.median([r.mfu for r in late if r.mfu is not None])) if late and late[0].mfu else None,
        "peak_bytes": peak,
    }


def _distinct_chars(n: int) -> list[str]:
    """n characters a tokenizer file can hold: from U+4E00 on, past the surrogates (which
    UTF-8 cannot encode)."""
    chars = (chr(c) for c in range(0x4E00, 0x110000) if not 0xD800 <= c <= 0xDFFF)
    return [next(chars) for _ in range(n)]


def _fits(fn: Callable[[], dict]) -> dict | None:
    try:
        return fn()
    except Exception as e:  # out of memory, however the device says it
        if "out of memory" in str(e).lower() or type(e).__name__ in ("OutOfMemoryError", "OutOfMemory"):
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
            return None
        raise


def training(report: Report, ctx: Context) -> None:
    work, device, dry_run, nanogpt = ctx.work, ctx.device, ctx.dry_run, ctx.nanogpt
    cfg = TINY if dry_run else GPT2_124M
    steps = 4 if dry_run else 30
    report.section(f"training, {'a tiny shape (dry run)' if dry_run else 'GPT-2 124M, block 1024'}")
    rows, best = [], None
    for batch in (2, 4) if dry_run else ctx.batches:
        got = _fits(lambda b=batch: train_run(cfg, b, steps, device, not dry_run, work))
        if got is None:
            rows.append([batch, "out of memory", "", ""])
        else:
            rows.append([batch, f"{got['tokens_per_s']:,.0f}", _pct(got["mfu"]), _gib(got["peak_bytes"])])
        if got is None:
            break
        if best is None or (got["tokens_per_s"] or 0) > (best[1]["tokens_per_s"] or 0):
            best = (batch, got)
    how = "eager" if dry_run else "compiled"
    shape = f"{cfg.n_layer} layers x {cfg.n_embd}"
    report.say(
        f"gptcli's Trainer, {shape}, {how}, --dtype auto, {steps} steps per batch size "
        "(median of the later steps):"
    )
    report.table(["micro-batch", "tokens/s", "MFU", "peak memory"], rows)
    if best is not None:  # Muon's per-step cost, at the batch AdamW trains fastest at
        muon = train_run(cfg, best[0], steps, device, not dry_run, work, optimizer="muon")
        if muon["tokens_per_s"] and best[1]["tokens_per_s"]:
            ratio = muon["tokens_per_s"] / best[1]["tokens_per_s"]
            report.say(
                f"--optimizer muon at micro-batch {best[0]}: {muon['tokens_per_s']:,.0f} tokens/s "
                f"({ratio:.2f}x AdamW's), peak memory {_gib(muon['peak_bytes'])}"
            )
    if nanogpt is None:
        report.say("nanoGPT: not run (give --nanogpt DIR, a checkout of it, to run its train.py beside)")
    elif best is not None:
        theirs = nanogpt_side_by_side(report, nanogpt, cfg, best[0], steps, device, work)
        if theirs:
            ours = best[1]
            mfu = "" if ours["mfu"] is None else f", {_pct(ours['mfu'] * theirs / ours['tokens_per_s'])} MFU"
            report.say(
                f"nanoGPT at micro-batch {best[0]}: {theirs:,.0f} tokens/s (by gptcli's count{mfu}); "
                f"gptcli {ours['tokens_per_s'] / theirs:.2f}x nanoGPT's tokens/s"
            )


def nanogpt_side_by_side(
    report: Report, nanogpt: Path, cfg: ModelConfig, batch: int, steps: int, device: str, work: Path
) -> float | None:
    """nanoGPT's own train.py on random tokens of the same vocabulary, shape and batch; its
    code runs from its checkout, never copied here."""
    data = work / "nanogpt-data"
    (data / "gptcli").mkdir(parents=True, exist_ok=True)
    tokens = np.random.default_rng(0).integers(0, 50257, 2_000_000).astype(np.uint16)
    tokens.tofile(data / "gptcli" / "train.bin")
    tokens[:100_000].tofile(data / "gptcli" / "val.bin")
    link = nanogpt / "data" / "gptcli"
    if link.is_symlink():  # left by an earlier run, to its removed scratch folder
        link.unlink()
    elif link.exists():
        report.say(f"nanoGPT: not run: {link} exists and is not this script's link (move it away)")
        return None
    link.symlink_to(data / "gptcli")
    cmd = [
        sys.executable, "train.py", "--dataset=gptcli", f"--n_layer={cfg.n_layer}", f"--n_head={cfg.n_head}",
        f"--n_embd={cfg.n_embd}", f"--block_size={cfg.block_size}", f"--batch_size={batch}",
        "--gradient_accumulation_steps=1", f"--max_iters={steps}", "--eval_interval=100000",
        "--log_interval=1", "--eval_iters=1",
        f"--device={device}", "--dtype=bfloat16", "--compile=True", "--bias=True",
        "--always_save_checkpoint=False", "--wandb_log=False", f"--out_dir={work / 'nanogpt-out'}",
    ]  # fmt: skip
    try:
        result = sh(report, cmd, cwd=nanogpt)
    finally:
        link.unlink()
    mfus = [
        float(line.rsplit("mfu", 1)[1].strip(" %")) for line in result.stdout.splitlines() if "mfu" in line
    ]
    times = [
        float(line.split("time")[1].split("ms")[0]) for line in result.stdout.splitlines() if " time " in line
    ]
    if not times:
        return None
    tokens_per_s = batch * cfg.block_size / (np.median(times[len(times) // 2 :]) / 1000)
    report.say(f"nanoGPT: {tokens_per_s:,.0f} tokens/s, its own MFU estimate "
               f"{np.median(mfus[len(mfus) // 2:]):.1f}% (of an A100's peak)")  # fmt: skip
    return float(tokens_per_s)


# --- decoding ---------------------------------------------------------------------------------


def _decoded(ctx: Context) -> ModelConfig:
    """The shape decoded: GPT-2 124M (its vocabulary, block 1024), tiny in a dry run."""
    if ctx.dry_run:
        return TINY
    return ModelConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, n_embd=768)


def decoding(report: Report, ctx: Context) -> None:
    device, dry_run = ctx.device, ctx.dry_run
    transformers = _transformers()
    cfg = _decoded(ctx)
    new = 20 if dry_run else 200
    report.section(
        f"decoding, {'a tiny shape (dry run)' if dry_run else 'GPT-2 124M'}: batch 1, {new} new tokens"
    )
    if transformers is None:
        report.say("skipped: transformers is not installed")
        return
    hf_cfg = transformers.GPT2Config(
        vocab_size=cfg.vocab_size, n_positions=cfg.block_size, n_layer=cfg.n_layer, n_head=cfg.n_head,
        n_embd=cfg.n_embd,
    )  # fmt: skip
    rows = [
        _decode_pair(transformers, hf_cfg, cfg, dtype, device, new)
        for dtype in (torch.float32, torch.bfloat16)
    ]
    header = ["weights", "gptcli tokens/s", "HF generate tokens/s", "ratio", "same tokens", "beam B=4 vs HF",
              "same best beam"]  # fmt: skip
    report.table(header, rows)
    how = "eager"
    if ctx.device == "cuda":
        how = "compiled (a static KV cache, CUDA graphs), as sample and beam decode there"
    report.say(f"Random weights, a 16-token prompt; gptcli {how}; HF generate as it comes. Beams: "
               f"{max(1, new // 4)} new tokens, early stopping.")  # fmt: skip
    _decode_profile(report, cfg, device, new)


def _bf16_model(cfg: ModelConfig, device: str) -> tuple[GPT, list[int]]:
    """A random bf16 model of the shape on the device, and a 16-token prompt for it."""
    torch.manual_seed(0)
    model = GPT(cfg).eval().to(device, torch.bfloat16)
    return model, torch.randint(0, cfg.vocab_size, (16,), generator=torch.Generator().manual_seed(1)).tolist()


def _decode_profile(report: Report, cfg: ModelConfig, device: str, new: int) -> None:
    """Where a bf16 greedy token's time goes, decoded as `sample` does on this device: the
    wall time a token, the device's kernels a token (torch.profiler), and the busiest kernels:
    kernels well under the wall time mean the host (Python, launches, syncs) is what bounds it."""
    from torch.profiler import ProfilerActivity, profile

    model, ids = _bf16_model(cfg, device)
    compiled = device.startswith("cuda")

    def decode() -> None:
        for _ in generate(model, ids, new, sampling=GREEDY, compile=compiled):
            pass

    decode()  # compiled and warm
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if compiled else [])
    with profile(activities=activities) as prof:
        _sync()
        t0 = time.perf_counter()
        decode()
        _sync()
        wall = time.perf_counter() - t0
    kernels = [e for e in prof.key_averages() if getattr(e, "self_device_time_total", 0) > 0]
    busy = sum(e.self_device_time_total for e in kernels) / 1e6  # seconds
    where = "no device kernels (the CPU)"
    if compiled:
        where = f"{busy / new * 1e3:.3f} ms of it in the device's kernels ({100 * busy / wall:.0f}%)"
    report.say(
        f"A bf16 greedy token, profiled ({new} tokens): {wall / new * 1e3:.3f} ms of wall time, {where}"
    )
    top = sorted(kernels, key=lambda e: e.self_device_time_total, reverse=True)[:6]
    rows = [
        [e.key[:60].replace("|", "/"), f"{e.self_device_time_total / 1e3 / new:.3f}", f"{e.count / new:.1f}"]
        for e in top
    ]
    if rows:
        report.table(["kernel", "ms a token", "calls a token"], rows)


def decode_host(report: Report, ctx: Context) -> None:
    """What the host adds to a compiled bf16 greedy token, and one way to cut it, measured
    side by side: generate as `sample` runs it (a sync and Python every token, a step ahead
    of them on the device); the compiled step alone, fed its own token on the device, synced
    once (the host's floor); and generate with inductor's freezing (the weights constants of
    the graph, not ~150 inputs a call: on the CPU that halved a tiny 12-layer step's call,
    2.1 ms to 1.05 ms), with its tokens."""
    import torch._inductor.config as inductor_config

    from gptcli.infer import generate as gen
    from gptcli.model import KVCache

    device = ctx.device
    cfg = _decoded(ctx)
    new = 20 if ctx.dry_run else 200
    report.section(
        f"the host's share of a compiled bf16 token, {'a tiny shape' if ctx.dry_run else 'GPT-2 124M'}"
    )
    model, ids = _bf16_model(cfg, device)
    dev = torch.device(device)

    def decode() -> list[int]:
        return [int(s.tokens[0]) for s in generate(model, ids, new, sampling=GREEDY, compile=True)]

    cache = KVCache(cfg, 1, cfg.block_size, dev, torch.bfloat16, static=True)  # (one: CUDA graphs keep it)

    def steps() -> None:
        cache.reset()
        step = gen.compiled_step(dev)
        token = torch.tensor([[ids[0]]], device=dev)
        with torch.no_grad():
            for _ in range(new):
                token = step(model, token, cache).argmax(-1, keepdim=True)

    def fresh() -> None:  # (the next call compiles again, under the config then in force)
        torch._dynamo.reset()
        gen._compiled_steps.clear()

    try:
        fresh()
        t_gen, tokens = _timed(decode)
        t_steps, _ = _timed(steps)
        fresh()
        with inductor_config.patch(freezing=True):
            t_frozen, frozen = _timed(decode)
    finally:
        fresh()
    report.say(
        f"bf16 greedy, {new} tokens, compiled: generate {new / t_gen:,.0f} tokens/s; "
        f"the compiled step alone (its argmax fed back on the device, one sync) {new / t_steps:,.0f} "
        f"steps/s; generate with inductor's freezing {new / t_frozen:,.0f} tokens/s, "
        f"the same tokens: {_agree(frozen, tokens)}"
    )


# --- serving ----------------------------------------------------------------------------------


def serving(report: Report, ctx: Context) -> None:
    """The bench's serve case (bench/cases/serve.py), here on the GPU: `gptcli serve` under
    1, 4 and 16 concurrent streaming clients."""
    import argparse as _argparse

    from bench.cases import serve
    from bench.run import table

    report.section("gptcli serve, GPT-2 124M, 1, 4 and 16 concurrent clients")
    _engine_alone(report, ctx)
    if ctx.dry_run:
        report.say("the HTTP clients: skipped in a dry run: the bench's serve case measures them on the CPU")
        return
    report.command(["python", "bench/run.py", "--only", "serve", "--quick"])
    results = serve.run(_argparse.Namespace(quick=True, llama_convert=None, llama_server=None))
    report.say(table(results))


def _engine_alone(report: Report, ctx: Context) -> None:
    """The server's decoding loop (gptcli/infer/engine.py) without HTTP, on the model as
    `gptcli serve` loads it: tokens/s for 1 and 16 sequences at once, and how much of each
    step is the model's (timed with the device synchronized around it) and how much the
    loop's own. Beside the HTTP clients' figures, it says whether a slow server is its
    decoding loop or its HTTP side; its first pass, beside the second, what shapes new to
    the process cost (cuDNN's attention built a graph for each new length)."""
    import threading

    from gptcli.cli.common import load_model
    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.infer.engine import Engine, Event, Sequence
    from gptcli.infer.generate import SAMPLE, row_generators
    from gptcli.store.checkpoint import save_checkpoint

    cfg = _decoded(ctx)
    tokens = 16 if ctx.dry_run else 128
    torch.manual_seed(0)
    save_checkpoint(ctx.work / "served", "best", GPT(cfg).eval(), gpt2_tokenizer(), {"task": "lm"})
    loaded = load_model(str(ctx.work / "served"), ctx.device)  # as `gptcli serve` does: --dtype auto
    device = next(loaded.model.parameters()).device
    rows = []
    for clients in (1, 16):
        engine = Engine(loaded.model, max_batch=16, vocab_size=loaded.tokenizer.vocab_size)
        inner, steps = engine.next_logits, []

        def timed(*args, inner=inner, steps=steps, **kwargs):
            _sync()
            t0 = time.perf_counter()
            out = inner(*args, **kwargs)
            _sync()
            steps.append(time.perf_counter() - t0)
            return out

        engine.next_logits = timed
        ended, failed = threading.Semaphore(0), []

        def emit(event: Event, ended: threading.Semaphore = ended, failed: list = failed) -> None:
            if event.kind == "error":
                failed.append(event.message)
            if event.kind in ("done", "error"):
                ended.release()

        walls = []  # a first run (the shapes new to torch and cuDNN), then the one measured
        try:
            for _ in range(2):
                steps.clear()
                seqs = [
                    Sequence([1, 2, 3], tokens, SAMPLE, row_generators(i, 1, device)[0], emit)
                    for i in range(clients)
                ]
                t0 = time.perf_counter()
                engine.submit(seqs)
                for _ in seqs:
                    if not ended.acquire(timeout=600):
                        raise RuntimeError("the engine did not finish")
                walls.append(time.perf_counter() - t0)
                if failed:
                    raise RuntimeError(f"the engine failed: {failed[0]}")
        finally:
            engine.close()
        wall = walls[-1]
        per_step = wall / max(1, len(steps))
        model = sum(steps) / max(1, len(steps))
        figures = [clients * tokens / wall, per_step * 1e3, model * 1e3, (per_step - model) * 1e3]
        rows.append([clients, *(f"{x:,.2f}" for x in figures), f"{clients * tokens / walls[0]:,.2f}"])
    report.say(
        f"The decoding loop alone (no HTTP), {tokens} tokens per sequence, temperature 1; the same "
        "run twice, the second measured (the first's tokens/s last: shapes new to the process)"
    )
    header = ["sequences", "tokens/s", "ms a step", "the model's step, ms", "the rest, ms", "first run"]
    report.table(header, rows)


def _decode_pair(transformers, hf_cfg, cfg: ModelConfig, dtype: torch.dtype, device: str, new: int) -> list:
    """One row: greedy tokens/s of gptcli and HF generate on the same weights, whether
    their tokens agree, and beam search (B=4) speed and best hypothesis."""
    from gptcli.store.hf import hf_to_gptcli_state_dict

    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    ours = GPT(cfg).eval()
    ours.load_state_dict(hf_to_gptcli_state_dict(hf.state_dict()), strict=False)
    hf, ours = hf.to(device, dtype), ours.to(device, dtype)
    prompt = torch.randint(0, cfg.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1))
    ids, on_device = prompt[0].tolist(), prompt.to(device)
    compiled = device.startswith("cuda")  # what sample and beam do by default there
    t_ours, got = _timed(
        lambda: [int(s.tokens[0]) for s in generate(ours, ids, new, sampling=GREEDY, compile=compiled)]
    )
    t_hf, ref = _timed(
        lambda: hf.generate(
            on_device, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0
        )[0, len(ids) :].tolist()
    )
    steps = max(1, new // 4)
    b_ours, beams = _timed(lambda: beam_search(ours, ids, 4, steps, compile=compiled))
    b_hf, hf_beams = _timed(
        lambda: hf.generate(
            on_device,
            num_beams=4,
            max_new_tokens=steps,
            min_new_tokens=steps,
            early_stopping=True,
            do_sample=False,
            pad_token_id=0,
        )
    )
    same_beam = beams[0].ids == hf_beams[0, len(ids) :].tolist()
    speeds = [f"{new / t_ours:,.0f}", f"{new / t_hf:,.0f}", f"{t_hf / t_ours:.2f}x"]
    beam = [f"{b_hf / b_ours:.2f}x", "yes" if same_beam else "no"]
    return [str(dtype).removeprefix("torch."), *speeds, _agree(got, ref), *beam]


def _timed(fn: Callable[[], object]) -> tuple[float, object]:
    fn()  # warm-up (and compilation)
    _sync()
    t0 = time.perf_counter()
    out = fn()
    _sync()
    return time.perf_counter() - t0, out


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _agree(a: list[int], b: list[int]) -> str:
    n = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
    return "all" if n is None else f"first {n}"


# --- what fits --------------------------------------------------------------------------------


def what_fits(report: Report, ctx: Context) -> None:
    work, device = ctx.work, ctx.device
    report.section("the largest GPT-2 shape that trains here (micro-batch 1, block 1024, AdamW)")
    if ctx.dry_run:
        report.say("skipped in a dry run: it needs a GPU's memory to mean anything")
        return
    rows = []
    for name, (n_layer, n_head, n_embd) in SHAPES.items():
        cfg = ModelConfig(vocab_size=50304, block_size=1024, n_layer=n_layer, n_head=n_head, n_embd=n_embd)
        got = _fits(lambda c=cfg: train_run(c, 1, 4, device, False, work))
        rows.append([name, "no (out of memory)" if got is None else f"yes, peak {_gib(got['peak_bytes'])}"])
        if got is None:
            break
    report.table(["shape", "trains on one GPU"], rows)
    report.say("With one GPU, --fsdp has nothing to shard over: sharded training is not measured here.")


# --- the sections, in the order they run: what matters most first, so that a run cut short by
# its time limit keeps it: the CUDA tests, training, decoding, the largest shape, the server, then
# what the host costs a decoded token

SECTIONS: dict[str, Callable[[Report, Context], None]] = {
    "cuda-tests": cuda_tests,
    "training": training,
    "decoding": decoding,
    "fits": what_fits,
    "serve": serving,
    "decode-host": decode_host,
    "demo": demo,
    "suite": suite,
}


# --- the report ----------------------------------------------------------------------------------


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"


def _gib(x: int | None) -> str:
    return "n/a" if x is None else f"{x / 2**30:.1f} GiB"


def _transformers():
    try:
        import transformers

        transformers.logging.set_verbosity_error()
        return transformers
    except ImportError:
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry-run", action="store_true", help="tiny shapes on the CPU: check the script runs"
    )
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout to run beside (never copied here)")
    parser.add_argument("--out", type=Path, default=Path("gpu-report.md"), help="the report to write")
    parser.add_argument(
        "--skip", default="", help="comma-separated sections to leave out: " + ", ".join(SECTIONS)
    )
    parser.add_argument(
        "--batches", default="16,32,64", help="the micro-batches the 124M training tries, in order"
    )
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.dry_run
    if not cuda and not args.dry_run:
        parser.error("no CUDA device: run on a GPU machine, or pass --dry-run")
    skip = {s for s in args.skip.split(",") if s}
    if unknown := skip - set(SECTIONS):
        parser.error(f"--skip: no section {', '.join(sorted(unknown))} (sections: {', '.join(SECTIONS)})")
    device = "cuda" if cuda else "cpu"
    report = Report(args.out)
    report.say(
        f"## bench/gpu_check.py, {time.strftime('%Y-%m-%d %H:%M')}{' (dry run)' if args.dry_run else ''}"
    )
    report.say("")
    report.say("`python bench/gpu_check.py " + " ".join(sys.argv[1:]) + "`")
    work = Path(tempfile.mkdtemp())
    ctx = Context(work, device, args.dry_run, args.nanogpt, tuple(int(b) for b in args.batches.split(",")))
    try:
        environment(report, torch.device(device))
        report.save()
        for name, section in SECTIONS.items():
            if name in skip:
                continue
            started = time.perf_counter()
            try:
                section(report, ctx)
            except Exception as e:  # one section's failure is part of the report, not its end
                lines = traceback.format_exc().strip().splitlines()
                report.say(f"failed: {type(e).__name__}: {e}\n```\n" + "\n".join(lines[-12:]) + "\n```")
            report.say(f"({name}: {time.perf_counter() - started:.0f} s)")
            report.save()
            gc.collect()  # what a section held (a 1.5B model, say) is not the next one's
            if cuda:
                torch.cuda.empty_cache()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
