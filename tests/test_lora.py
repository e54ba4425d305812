"""LoRA: adapters beside a frozen base. Step 0 is the base exactly; only adapters (and a
head) train and are saved; merged equals unmerged; PEFT loads the export with equal
logits; a run refuses a base that changed; resume, compile and bf16 storage."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from gptcli import lora
from gptcli.config import ModelConfig
from gptcli.model import GPT
from gptcli.store import loading
from tests.helpers import assert_usage_error, make_corpus, run

FAST = ["--device", "cpu", "--dtype", "fp32", "--batch-size", "8", "--eval-iters", "2", "--warmup-iters", "2"]
LORA = ["--lora-rank", "4", "--lora-alpha", "8", "--lr", "1e-2"]


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """A base model trained on one corpus, text to finetune on, and a classification set."""
    tmp = tmp_path_factory.mktemp("lora")
    make_corpus(tmp / "c.txt", n_sentences=300)
    make_corpus(tmp / "more.txt", n_sentences=150, seed=5)
    lines = (tmp / "c.txt").read_text().splitlines()[:120]
    (tmp / "animals.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": t.split()[1]}) + "\n" for t in lines)
    )
    mp = pytest.MonkeyPatch()
    mp.setenv("GPTCLI_CACHE_DIR", str(tmp / "cache"))
    try:
        base = run(
            "pretrain", tmp / "c.txt", "--out", tmp / "base", "--n-layer", "2", "--n-head", "2",
            "--n-embd", "32", "--block-size", "32", "--max-iters", "40", "--eval-interval", "40",
            "--lr", "3e-3", *FAST,
        )  # fmt: skip
        assert base.exit_code == 0, base.output
        for name, extra in (
            ("lm", [tmp / "more.txt"]),
            ("cls", [tmp / "animals.jsonl", "--task", "classify"]),
        ):
            result = run(
                "finetune", "--ckpt", tmp / "base", *extra, "--out", tmp / name, *LORA, *FAST,
                "--max-iters", "12", "--eval-interval", "6",
            )  # fmt: skip
            assert result.exit_code == 0, result.output
    finally:
        mp.undo()
    return tmp


def tiny(**kw) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, **kw)).eval()


def test_at_step_zero_the_adapted_model_is_the_base():
    base = tiny()
    adapted = tiny()
    lora.add_adapters(adapted, lora.LoRASettings(rank=4, alpha=8))
    x = torch.randint(0, 50, (2, 16))
    with torch.no_grad():
        assert torch.equal(adapted(x)[0], base(x)[0])  # B = 0: the update is exactly zero
    trained = [n for n, p in adapted.named_parameters() if p.requires_grad]
    assert trained and all(n.endswith((".lora_A", ".lora_B")) for n in trained)
    assert {n.rsplit(".", 2)[-2] for n in trained} == {"c_attn", "c_proj", "c_fc"}
    assert sum(".attn.c_proj." in n for n in trained) == sum(".mlp.c_proj." in n for n in trained) == 4


@pytest.mark.parametrize(
    ("targets", "modules"),
    [(["attn"], {"attn.c_attn"}), (["proj", "mlp"], {"attn.c_proj", "mlp.c_fc", "mlp.c_proj"})],
)
def test_targets_name_exactly_their_modules(targets, modules):
    model = tiny()
    lora.add_adapters(model, lora.LoRASettings(rank=2, alpha=2, targets=targets))
    adapted = {n.split(".", 3)[3] for n, m in model.named_modules() if isinstance(m, lora.LoRALinear)}
    assert adapted == modules


def test_only_adapters_and_the_head_train_and_are_saved(data):
    base = loading.load(data / "base")
    for name, head in (("lm", False), ("cls", True)):
        adapted = loading.load(data / name / "last", merge=False)
        base_state = base.model.state_dict()
        for key, value in adapted.model.state_dict().items():
            if lora.is_trained(key):
                continue
            want = base_state[key][: value.shape[0]] if key.endswith("wpe.weight") else base_state[key]
            assert torch.equal(value, want), key  # the base did not move
        assert any(p.abs().sum() > 0 for n, p in adapted.model.named_parameters() if n.endswith("lora_B"))
        with safe_open(data / name / "last" / "model.safetensors", framework="pt") as f:
            saved = set(f.keys())
        assert saved == set(lora.adapter_shapes(adapted.model))
        assert any(k.startswith("classifier.") for k in saved) == head
        assert all(k.endswith((".lora_A", ".lora_B")) or k.startswith("classifier.") for k in saved)
        with safe_open(data / name / "last" / "train_state.safetensors", framework="pt") as f:
            names = list(f.keys())
        moments = [k for k in names if k.startswith("optimizer.state.") and k.endswith("exp_avg")]
        assert len(moments) == len(saved)  # AdamW holds the adapters (and head) only
        meta = adapted.meta
        assert meta["base_checkpoint"] == str((data / "base" / "best").resolve())
        assert meta["base_sha256"] == loading.weights_sha256(base)
        assert (meta["lora_rank"], meta["lora_alpha"], meta["lora_targets"]) == (
            4,
            8.0,
            ["attn", "proj", "mlp"],
        )


def test_merged_equals_unmerged(data):
    x = torch.randint(0, 20, (3, 32))
    for name in ("lm", "cls"):
        unmerged = loading.load(data / name / "last", merge=False).model
        merged = loading.load(data / name / "last").model
        assert any(p.abs().sum() > 0 for n, p in unmerged.named_parameters() if n.endswith("lora_B"))
        assert not lora.has_adapters(merged)
        with torch.no_grad():
            torch.testing.assert_close(merged(x)[0], unmerged(x)[0], atol=1e-5, rtol=0)
            h_a, h_b = merged.hidden_states(x), unmerged.hidden_states(x)
            if name == "cls":
                torch.testing.assert_close(
                    merged.classifier(h_a[:, -1]), unmerged.classifier(h_b[:, -1]), atol=1e-5, rtol=0
                )


def test_every_verb_loads_a_lora_run(data):
    result = run("sample", "--ckpt", data / "lm", "--max-new-tokens", "8", "--seed", "1", "--json")
    assert result.exit_code == 0, result.output
    assert run("beam", "The fox", "--ckpt", data / "lm", "--max-new-tokens", "4").exit_code == 0
    assert run("inspect-attn", "The fox", "--ckpt", data / "lm", "--json").exit_code == 0
    assert run("inspect-lens", "The fox", "--ckpt", data / "lm", "--json").exit_code == 0
    assert run("eval", data / "more.txt", "--ckpt", data / "lm", "--json").exit_code == 0
    classified = run("classify", "--ckpt", data / "cls", "The fox dug a hole", "--json")
    assert classified.exit_code == 0, classified.output


def test_peft_loads_the_adapters_with_equal_logits(data, tmp_path):
    transformers = pytest.importorskip("transformers")
    peft = pytest.importorskip("peft")
    assert run("export", data / "base", tmp_path / "base-hf").exit_code == 0
    result = run("export", data / "lm" / "last", tmp_path / "adapters", "--adapters-only", "--json")
    assert result.exit_code == 0, result.output
    assert sorted(json.loads(result.stdout)["files"]) == ["adapter_config.json", "adapter_model.safetensors"]
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "base-hf")
    peft_model = peft.PeftModel.from_pretrained(hf, tmp_path / "adapters").eval()
    wrapped = {n for n, m in peft_model.named_modules() if hasattr(m, "lora_A") and not n.endswith("lora_A")}
    assert len(wrapped) == 2 * 4  # c_attn, attn.c_proj, c_fc and mlp.c_proj of both blocks, no more
    ours = loading.load(data / "lm" / "last").model
    x = torch.randint(0, 20, (2, 32))
    with torch.no_grad():
        torch.testing.assert_close(peft_model(x).logits, ours(x)[0], atol=1e-5, rtol=0)
    # and the merged export is the same model for transformers alone
    assert run("export", data / "lm" / "last", tmp_path / "merged").exit_code == 0
    merged = transformers.GPT2LMHeadModel.from_pretrained(tmp_path / "merged").eval()
    with torch.no_grad():
        torch.testing.assert_close(merged(x).logits, ours(x)[0], atol=1e-5, rtol=0)


def test_a_changed_or_missing_base_is_refused_and_a_moved_one_found(data, tmp_path):
    shutil.copytree(data / "base", tmp_path / "base")
    shutil.copytree(data / "lm", tmp_path / "lm")
    meta_file = tmp_path / "lm" / "best" / "checkpoint.json"
    meta = json.loads(meta_file.read_text())
    meta["base_checkpoint"] = str((tmp_path / "base" / "best").resolve())
    meta_file.write_text(json.dumps(meta))
    ok = run("sample", "--ckpt", tmp_path / "lm", "--max-new-tokens", "4", "--seed", "1", "--json")
    assert ok.exit_code == 0, ok.output
    # the base trains on: its weights change under the same path
    again = run("pretrain", "--resume", "--out", tmp_path / "base", "--max-iters", "44", *FAST)
    assert again.exit_code == 0, again.output
    shutil.rmtree(tmp_path / "base" / "best")
    shutil.copytree(tmp_path / "base" / "last", tmp_path / "base" / "best")
    assert_usage_error(run("sample", "--ckpt", tmp_path / "lm"), "is not the base", "changed", "--base")
    # the original, moved elsewhere, is accepted with --base
    shutil.rmtree(tmp_path / "base")
    assert_usage_error(run("sample", "--ckpt", tmp_path / "lm"), "is not there", "--base PATH")
    typo = run("sample", "--ckpt", tmp_path / "lm", "--base", tmp_path / "bsae")  # (not: "pass --base")
    assert_usage_error(typo, "--base ", "bsae: no such file or directory; give where the base of")
    whole = run("sample", "--ckpt", data / "base", "--base", tmp_path / "gone", "-n", "2")  # not a LoRA run
    assert whole.exit_code == 0 and "--base is not used: " in whole.output, whole.output
    assert "is not a LoRA run" in whole.output
    # PEFT's adapters need no base: written from the run alone, the very tensors it trained
    alone = run("export", tmp_path / "lm", tmp_path / "adapters", "--adapters-only", "--base", data / "base")
    assert alone.exit_code == 0, alone.output
    assert "--base is not used: --adapters-only writes the run's adapters alone" in alone.output
    written = load_file(tmp_path / "adapters" / "adapter_model.safetensors")
    trained = {
        f"base_model.model.{n}.weight": p
        for n, p in loading.load(data / "lm", merge=False).model.named_parameters()
        if n.endswith((".lora_A", ".lora_B"))
    }
    assert written.keys() == trained.keys() and len(trained) == 2 * 4 * 2
    assert all(torch.equal(written[k], p.detach().float()) for k, p in trained.items())
    moved = run(
        "sample",
        "--ckpt",
        tmp_path / "lm",
        "--base",
        data / "base",
        "--max-new-tokens",
        "4",
        "--seed",
        "1",
        "--json",
    )
    assert moved.exit_code == 0 and json.loads(moved.stdout) == json.loads(ok.stdout)


def test_resume_continues_exactly(data, tmp_path, monkeypatch):
    """A crash after step 7: the run resumed from its step-5 checkpoint replays steps 6 to 10
    bit for bit, adapters and AdamW moments restored on top of the base."""
    from gptcli.config import FinetuneSettings, flag_overrides
    from gptcli.reports import Reporter
    from gptcli.train.recipes import finetune_trainer, resume_finetuning

    class KeepLast(Reporter):
        def on_checkpoint(self, name: str, path: Path, step: int) -> None:
            if name == "last" and step == 5:
                shutil.copytree(path, tmp_path / "last-at-5")

    monkeypatch.chdir(tmp_path)
    settings = FinetuneSettings(
        task="lm", data=[str(data / "more.txt")], base=str(data / "base"), lora_rank=4, lora_dropout=0.1
    )
    flags = flag_overrides(
        max_iters=10,
        eval_interval=5,
        eval_iters=2,
        log_interval=1,
        batch_size=8,
        device="cpu",
        dtype="fp32",
        lr=1e-2,
    )
    finetune_trainer(settings.validate(), flags=flags, out="r").run(reporter=KeepLast())
    keys = ("kind", "step", "loss", "lr", "grad_norm", "val_loss", "train_loss")

    def trajectory() -> list[tuple]:
        lines = (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()
        return [tuple(r.get(k) for k in keys) for r in map(json.loads, lines)]

    first = trajectory()
    shutil.rmtree(tmp_path / "r" / "last")
    shutil.copytree(tmp_path / "last-at-5", tmp_path / "r" / "last")
    resume_finetuning("r", flags=flags).run(resume=True)
    assert trajectory() == first and len(first) == 10 + 3
    changed = run("finetune", "--resume", "--out", tmp_path / "r", "--max-iters", "12", "--lora-rank", "8")
    assert_usage_error(changed, "--lora-rank is '8', the run's is 4")


def test_compile_sees_one_graph():
    model = tiny()
    lora.add_adapters(model, lora.LoRASettings(rank=4, alpha=8, dropout=0.1))
    model.train()
    x = torch.randint(0, 50, (2, 16))
    explained = torch._dynamo.explain(lambda idx: model(idx, idx)[1])(x)
    assert explained.graph_break_count == 0 and explained.graph_count == 1


def test_bf16_training_holds_the_frozen_base_in_bf16(data, tmp_path):
    from gptcli.config import FinetuneSettings, flag_overrides
    from gptcli.train.recipes import finetune_trainer

    settings = FinetuneSettings(
        task="lm", data=[str(data / "more.txt")], base=str(data / "base"), lora_rank=2
    )
    flags = flag_overrides(
        max_iters=2, eval_interval=2, eval_iters=1, batch_size=4, device="cpu", dtype="bf16"
    )
    trainer = finetune_trainer(settings.validate(), flags=flags, out=tmp_path / "bf16")
    trainer.run()
    adapted = [m for m in trainer.model.modules() if isinstance(m, lora.LoRALinear)]
    assert adapted and all(m.weight.dtype == torch.bfloat16 for m in adapted)
    assert all(m.lora_A.dtype == m.lora_B.dtype == torch.float32 for m in adapted)
    assert loading.load(tmp_path / "bf16").model.transformer.h[0].attn.c_attn.weight.dtype == torch.float32


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--lora-rank", "4", "--lora-targets", "attn,ffn"],
            "--lora-targets attn,ffn: use a comma-separated list of attn, proj, mlp",
        ),
        (["--lora-alpha", "16"], "go with --lora-rank"),
        (["--lora-rank", "-1"], "--lora-rank must be in [0, 65536]"),
        (["--lora-rank", "4", "--lora-dropout", "1"], "--lora-dropout must be in [0, 1)"),
        (["--lora-rank", "4", "--base", "x"], "--base goes with --resume"),
    ],
)
def test_bad_lora_flags(data, tmp_path, args, message):
    result = run(
        "finetune", "--ckpt", data / "base", data / "more.txt", "--out", tmp_path / "r", *args, *FAST
    )
    assert_usage_error(result, message)
    assert not (tmp_path / "r").exists()


def test_adapters_only_needs_a_lora_language_model(data, tmp_path):
    assert_usage_error(run("export", data / "base", tmp_path / "a", "--adapters-only"), "is not a LoRA run")
    assert_usage_error(run("export", data / "cls", tmp_path / "b", "--adapters-only"), "classification head")
