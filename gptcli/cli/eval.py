"""`gptcli eval`: the GPT-2 paper's metrics (perplexity, bits per byte, LAMBADA, zero-shot
multiple choice) and a finetuned head's accuracy, for any checkpoints on any files."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gptcli.cli import render
from gptcli.cli.common import Base, Device, Dtype, Json, complete_runs, load_model
from gptcli.data.inputs import check_input
from gptcli.errors import UsageError


def eval_(
    files: Annotated[list[Path], typer.Argument(help="Text (.txt, .jsonl documents) or JSONL/CSV records.")],
    ckpt: Annotated[
        list[str] | None,
        typer.Option(
            "--ckpt",
            autocompletion=complete_runs,
            help="A run, checkpoint, Hugging Face directory or hub name; repeat it to compare models. "
            "(default: the newest run under ./runs)",
            show_default=False,
        ),
    ] = None,
    base: Base = None,
    task: Annotated[
        str | None,
        typer.Option(
            "--task",
            help="text | lambada | choice (default: from the file, or the head of a finetuned classifier)",
            show_default=False,
        ),
    ] = None,
    stride: Annotated[
        int | None,
        typer.Option(
            "--stride", help="--task text: tokens between windows (default: block_size)", show_default=False
        ),
    ] = None,
    limit: Annotated[
        int | None,
        typer.Option("--limit", help="Score the first N examples (text: windows) only.", show_default=False),
    ] = None,
    per_example: Annotated[
        bool, typer.Option("--per-example", help="With --json: each example's scores too.")
    ] = False,
    device: Device = "auto",
    dtype: Dtype = "auto",
    json_out: Json = False,
) -> None:
    """Score models on files: perplexity and bits per byte, LAMBADA, multiple choice, accuracy.

    gptcli eval --ckpt gpt2 wiki.test.raw
    gptcli eval --ckpt runs/demo --ckpt gpt2 lambada_test.jsonl --task lambada
    gptcli eval --ckpt gpt2 hellaswag_val.jsonl --limit 500 --json
    """
    from gptcli.evals import evaluate, plan

    if limit is not None and limit < 1:
        raise UsageError(f"--limit {limit}: give 1 or more")
    if per_example and not json_out:
        raise UsageError("--per-example goes with --json")
    for f in files:
        check_input(f, "the file to score")
    rows, results, said = [], [], {}
    for spec in ckpt or [None]:
        loaded = load_model(spec, device, dtype, decode=False, base=base)
        name = str(spec) if spec is not None else str(loaded.path)
        for f in files:
            task_, how = plan(loaded.meta, f, task)
            with render.count_progress(f"{f.name}: {task_}") as update:
                result = evaluate(
                    loaded.model, loaded.tokenizer, loaded.meta, f, task_, how, stride, limit, update
                )
            if said.get(f) != (task_, how):  # once a file, unless another model scores it otherwise
                render.info(f"{f}: {task_}, scored {'with the finetuned head' if how == 'head' else how}")
                said[f] = (task_, how)
            for w in result.warnings:
                render.warning(w)
            rows.append((name, str(f), how, result.metrics))
            item = {"ckpt": name, "file": str(f), "scored_by": how, **result.metrics}
            if per_example and result.examples is not None:
                item["examples"] = result.examples
            results.append(item)
    if json_out:
        render.print_json(results[0] if len(results) == 1 else results)
    else:
        render.eval_tables(rows)
