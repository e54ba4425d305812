"""bench case: LoRA finetuning's memory and step time against full finetuning, GPT-2 medium shape."""

from __future__ import annotations

import shutil
from pathlib import Path

from bench.common import ROOT, Rates, Result, in_child, ours_trainer_run, scratch
from gptcli.config import ModelConfig
from gptcli.model import GPT

GPT2_MEDIUM = ModelConfig(vocab_size=50257, block_size=128, n_layer=24, n_head=16, n_embd=1024)


def _adapt(model: GPT) -> None:
    from gptcli import lora

    lora.add_adapters(model, lora.LoRASettings(rank=8, alpha=16))


def _finetune_probe(rank: int, batch: int, steps: int, work: str) -> tuple[float, int, int]:
    """(seconds per step, peak resident bytes while training, parameters trained) of the
    Trainer finetuning the GPT-2 medium shape, in full or with LoRA adapters of rank 8."""
    rates = Rates(skip=0)
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


def run(args) -> list[Result]:
    """Finetuning the GPT-2 medium shape (355M) on the CPU, batch 2 x 128 tokens, fp32:
    LoRA (rank 8 on every Linear of the blocks) against full finetuning, each in a fresh
    process; then the val loss both reach on the demo finetuning sets."""
    work = scratch()
    steps = 3 if args.quick else 5
    try:
        full_s, full_rss, full_n = in_child(_finetune_probe, 0, 2, steps, str(work))
        lora_s, lora_rss, lora_n = in_child(_finetune_probe, 8, 2, steps, str(work))
        losses = in_child(_demo_finetunes, work, 100 if args.quick else 200)
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
