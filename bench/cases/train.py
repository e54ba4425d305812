"""bench case: training tokens/s of gptcli's Trainer against nanoGPT's loop and HF's model."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import statistics
import time
from pathlib import Path

import torch

from bench.common import Result, in_child, ours_trainer_run, quiet_transformers, scratch
from gptcli.config import ModelConfig
from gptcli.runtime import keep_freed_memory, measured_peak_flops


def train_tokens_per_s(step, batch_tokens: int, steps: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        step()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    return steps * batch_tokens / (time.perf_counter() - t0)


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


def run(args) -> list[Result]:
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
    work = scratch("gptcli-bench-")
    # alternate the runs so that load on this shared machine hits all of them alike
    ours_runs: list[float] = []
    peer_runs: dict[str, list[float]] = {k: [] for k in peers}
    for _ in range(args.repeats):
        rate, flops_per_token = in_child(_ours_rate, cfg, batch, steps, work)
        ours_runs.append(rate)
        for k, (peer, keep) in peers.items():
            peer_runs[k].append(in_child(_peer_rate, peer, args.nanogpt, cfg, batch, steps, keep))
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
