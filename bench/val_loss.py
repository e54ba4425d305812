"""Validation loss over a whole val split, every window once: the number to compare runs by.

A training run's own evaluations average a few hundred windows (eval_iters x batch_size),
which is an estimate; this script scores every non-overlapping block_size window.

    python bench/val_loss.py runs/shakes-cpu                    # a gptcli run (its last/)
    python bench/val_loss.py ckpt.pt --data DIR --ckpt-format nanogpt

A nanoGPT ckpt.pt is read with torch.load(weights_only=True) and scored by gptcli's own
model (the parameter names are the same); DIR is a `gptcli tokenize` directory of the same
text and tokenizer (its val split is compared against).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from gptcli.config import ModelConfig
from gptcli.data.corpus import load_split
from gptcli.model import GPT
from gptcli.store.checkpoint import LAST, load_checkpoint


def full_val_loss(model: GPT, val: np.ndarray, batch: int = 256) -> float:
    T = model.config.block_size
    n = (len(val) - 1) // T
    tokens = np.asarray(val[: n * T + 1], dtype=np.int64)
    x = torch.from_numpy(tokens[:-1].reshape(n, T))
    y = torch.from_numpy(tokens[1:].reshape(n, T))
    total = 0.0
    model.eval()
    with torch.no_grad():
        for i in range(0, n, batch):
            total += model(x[i : i + batch], y[i : i + batch])[1].item() * len(x[i : i + batch])
    return total / n


def nanogpt_model(path: Path) -> GPT:
    ckpt = torch.load(path, map_location="cpu", weights_only=True)
    args = ckpt["model_args"]
    cfg = ModelConfig(
        vocab_size=args["vocab_size"], block_size=args["block_size"], n_layer=args["n_layer"],
        n_head=args["n_head"], n_embd=args["n_embd"], dropout=0.0, bias=args["bias"],
    )  # fmt: skip
    model = GPT(cfg)
    state = {k.removeprefix("_orig_mod."): v for k, v in ckpt["model"].items()}
    model.load_state_dict(state)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ckpt", type=Path)
    parser.add_argument("--data", type=Path, help="tokenized dir (default: the run's own data)")
    parser.add_argument("--ckpt-format", choices=["gptcli", "nanogpt"], default="gptcli")
    args = parser.parse_args()
    if args.ckpt_format == "nanogpt":
        model = nanogpt_model(args.ckpt)
        data = args.data
    else:
        loaded = load_checkpoint(args.ckpt / LAST if (args.ckpt / LAST).exists() else args.ckpt)
        model, data = loaded.model, args.data or Path(loaded.meta["data_dir"])
    val = load_split(data, "val")
    print(json.dumps({"ckpt": str(args.ckpt), "val_tokens": len(val), "val_loss": full_val_loss(model, val)}))


if __name__ == "__main__":
    main()
