"""Options and helpers that several verbs share: --ckpt, --device, --json, --seed."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from gptcli.cli import render
from gptcli.errors import UsageError

if TYPE_CHECKING:
    from gptcli.checkpoint import Loaded

Ckpt = Annotated[
    str | None,
    typer.Option(
        "--ckpt",
        help="A run dir (its best/ checkpoint), a checkpoint dir such as RUN/last. "
        "(default: the newest run under ./runs)",
        show_default=False,
    ),
]
Device = Annotated[str, typer.Option("--device", help="auto | cpu | cuda | cuda:N | mps")]
Json = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
Seed = Annotated[
    int | None, typer.Option("--seed", help="Seed for reproducible random choices.", show_default=False)
]


def load_model(ckpt: str | None, device: str = "auto") -> Loaded:
    """Load --ckpt, or the newest run under ./runs (and say which), onto the device."""
    from gptcli.checkpoint import load_checkpoint, newest_run
    from gptcli.runtime import pick_device

    if ckpt is None:
        run = newest_run()
        if run is None:
            raise UsageError(
                "no trained model found under ./runs; train one with `gptcli pretrain CORPUS` "
                "(or `make demo`), or pass --ckpt"
            )
        render.info(f"using the newest run: {run}")
        ckpt = str(run)
    dev, _ = pick_device(device)
    return load_checkpoint(ckpt, dev)
