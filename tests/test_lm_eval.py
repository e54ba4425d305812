"""lm-evaluation-harness's `local-completions` model against `gptcli serve`: on a multiple
choice task and a LAMBADA-style task written as local JSONL (nothing downloaded), its
numbers equal `gptcli eval`'s on the same model and files. lm-eval is heavy: this file runs
with `make test-lm-eval` (marker lm_eval), not in `make test`."""

from __future__ import annotations

import json
import random

import pytest

pytestmark = pytest.mark.lm_eval
lm_eval = pytest.importorskip("lm_eval")

from tests.helpers import run  # noqa: E402
from tests.test_serve import Server  # noqa: E402

WORDS = [
    "the", "a", "fox", "owl", "rabbit", "dug", "found", "built", "hole", "den", "nest",
    "because", "it", "was", "tired", "cold", "hungry",
]  # fmt: skip


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def eval_json(*args) -> dict:
    result = run("eval", *args, "--json", "--device", "cpu", "--dtype", "fp32")
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_the_harness_through_the_server_gives_gptcli_evals_numbers(hf_gpt2, tmp_path):
    from lm_eval.tasks import TaskManager

    from gptcli.store.hf import export_hf
    from gptcli.store.loading import load

    src = tmp_path / "src"
    hf_gpt2(vocab_size=50257, n_positions=64, n_embd=32, n_head=2).save_pretrained(src)
    loaded = load(src)
    model_dir = tmp_path / "tiny"
    export_hf(loaded.model, loaded.tokenizer, model_dir)  # with GPT-2's tokenizer files
    rng = random.Random(0)
    choice = [
        {
            "context": words(rng, 6),
            "choices": [words(rng, rng.randint(1, 4)) for _ in range(4)],
            "label": i % 4,
        }
        for i in range(16)
    ]
    lambada = [{"text": words(rng, rng.randint(4, 10))} for _ in range(16)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in choice))
    (tmp_path / "l.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lambada))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "choice.yaml").write_text(
        "task: gptcli_choice\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'c.jsonl'}\n"
        "test_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{context}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{label}}'\n"
        "metric_list:\n  - metric: acc\n  - metric: acc_norm\n"
    )
    (tasks / "lambada.yaml").write_text(
        "task: gptcli_lambada\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {tmp_path / 'l.jsonl'}\n"
        "test_split: test\noutput_type: loglikelihood\n"
        "doc_to_text: \"{{text.split(' ')[:-1]|join(' ')}}\"\n"
        "doc_to_target: \"{{' '+text.split(' ')[-1]}}\"\ntarget_delimiter: ''\n"
        "metric_list:\n  - metric: perplexity\n  - metric: acc\n"
    )
    server = Server(model_dir, "--dtype", "fp32", "--max-batch", "16", key=None)
    try:
        args = (
            f"base_url={server.url}/v1/completions,model={server.model},tokenizer={model_dir},"
            "tokenizer_backend=huggingface,tokenized_requests=True,max_length=63,num_concurrent=1"
        )
        done = lm_eval.simple_evaluate(
            model="local-completions",
            model_args=args,
            tasks=["gptcli_choice", "gptcli_lambada"],
            task_manager=TaskManager(include_path=str(tasks)),
            log_samples=True,
        )
        out = done["results"]
    finally:
        server.stop()
    ours_choice = eval_json("--ckpt", model_dir, tmp_path / "c.jsonl", "--task", "choice", "--per-example")
    ours_lambada = eval_json("--ckpt", model_dir, tmp_path / "l.jsonl", "--task", "lambada")
    assert len(done["samples"]["gptcli_choice"]) == 16
    assert out["gptcli_choice"]["acc,none"] == pytest.approx(ours_choice["acc"], abs=1e-9)
    assert out["gptcli_choice"]["acc_norm,none"] == pytest.approx(ours_choice["acc_norm"], abs=1e-9)
    assert out["gptcli_lambada"]["acc,none"] == pytest.approx(ours_lambada["acc"], abs=1e-9)
    assert out["gptcli_lambada"]["perplexity,none"] == pytest.approx(
        ours_lambada["ppl_per_example"], rel=1e-4
    )
    # and every choice's log-likelihood, not only the argmax that accuracy sees
    for sample in done["samples"]["gptcli_choice"]:
        theirs = [float(r[0][0]) for r in sample["resps"]]
        assert theirs == pytest.approx(ours_choice["examples"][sample["doc_id"]]["logprob"], rel=1e-4)
