"""`gptcli eval`: the GPT-2 paper's metrics (perplexity, bits per byte, LAMBADA, zero-shot
multiple choice) and a finetuned head's accuracy, for any checkpoints on any files."""

from __future__ import annotations

from gptcli.cli import render
from gptcli.cli.common import load_model, weights_of
from gptcli.config.verbs import EvalSettings
from gptcli.data.inputs import check_input


def eval_(s: EvalSettings) -> None:
    """Score models on files: perplexity and bits per byte, LAMBADA, multiple choice, accuracy.

    gptcli eval --ckpt gpt2 wiki.test.raw
    gptcli eval --ckpt runs/demo --ckpt gpt2 lambada_test.jsonl --task lambada
    gptcli eval --ckpt gpt2 hellaswag_val.jsonl --limit 500 --json
    """
    from gptcli.data.records import read_records
    from gptcli.evals import evaluate, labelled, plan
    from gptcli.store.loading import meta_of
    from gptcli.tasks.classify import is_pair

    for f in s.files:
        check_input(f, "the file to score")
    for spec in s.ckpt or []:  # every model found and every file planned before anything is scored
        meta = meta_of(spec)
        for f in s.files:
            plan(meta, f, s.task, limit=s.limit)
    # without --ckpt: the newest classifier for labelled records, else the newest model that writes text
    first = next((f for f in s.files if labelled(f)), None) if not s.ckpt and s.task is None else None
    newest, pairs = ("labels", is_pair(read_records(first)[0])) if first is not None else (None, None)
    rows, results, said, listless = [], [], {}, set()
    for spec in s.ckpt or [None]:
        loaded = load_model(
            spec, s.device, s.dtype, base=s.base, quantize=s.quantize, newest=newest, pairs=pairs
        )
        name = str(spec) if spec is not None else str(loaded.path)
        weights = weights_of(loaded.model, s.quantize)  # (told apart in --json)
        for f in s.files:
            task_, how = plan(loaded.meta, f, s.task, limit=s.limit)
            if s.per_example and task_ == "text" and f not in listless:  # once a file, before scoring it
                render.warning(f"--per-example: {f} is scored as one text, which has no examples to list")
                listless.add(f)
            with render.count_progress(f"{f.name}: {task_}") as update:
                result = evaluate(
                    loaded.model, loaded.tokenizer, loaded.meta, f, task_, how, s.stride, s.limit, update
                )
            if said.get(f) != (task_, how):  # once a file, unless another model scores it otherwise
                render.info(f"{f}: {task_}, scored {'with the finetuned head' if how == 'head' else how}")
                said[f] = (task_, how)
            for w in result.warnings:
                render.warning(w)
            rows.append((name, str(f), how, result.metrics))
            item = {"ckpt": name, "file": str(f), "scored_by": how, **weights, **result.metrics}
            if s.per_example and result.examples is not None:
                item["examples"] = result.examples
            results.append(item)
    if s.json_out:
        render.print_json(results[0] if len(results) == 1 else results)
    else:
        render.eval_tables(rows)
