"""Configs: shipped YAMLs load, precedence, and errors that say what to fix."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from gptcli.config import Config, flag_overrides, load_config, parse_duration
from gptcli.errors import UsageError

CONFIGS = sorted((Path(__file__).parents[1] / "examples" / "configs").glob("*.yaml"))


def test_the_expected_configs_ship():
    names = {p.name for p in CONFIGS}
    assert {"shakespeare-char-cpu.yaml", "shakespeare-char.yaml", "gpt2-124m.yaml", "demo.yaml"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_shipped_yaml_loads(path):
    config = load_config(path)
    raw = yaml.safe_load(path.read_text())
    for section, values in raw.items():
        for key, value in values.items():
            got = getattr(getattr(config, section), key)
            assert got == value, (section, key)


def test_shakespeare_char_cpu_is_nanogpts_cpu_run():
    c = load_config(CONFIGS[[p.name for p in CONFIGS].index("shakespeare-char-cpu.yaml")])
    assert (c.model.n_layer, c.model.n_head, c.model.n_embd, c.model.block_size) == (4, 4, 128, 64)
    assert (c.train.batch_size, c.train.max_iters, c.train.lr, c.model.dropout) == (12, 2000, 1e-3, 0.0)
    assert c.data.tokenizer == "char"


def test_pretraining_defaults_to_muon_but_adamw_under_fsdp_and_for_finetuning():
    from gptcli.config import FINETUNE_DEFAULTS

    assert load_config().train.optimizer == "muon"
    # FSDP splits the matrices Muon orthogonalizes whole
    assert load_config(None, {"train": {"fsdp": True}}).train.optimizer == "adamw"
    assert load_config(None, {"train": {"optimizer": "adamw"}}).train.optimizer == "adamw"
    assert FINETUNE_DEFAULTS.optimizer == "adamw"
    with pytest.raises(UsageError, match="--optimizer muon does not run under --fsdp"):
        load_config(None, {"train": {"fsdp": True, "optimizer": "muon"}})


def test_precedence_defaults_then_yaml_then_flags(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("model:\n  n_layer: 3\n  n_head: 4\n  n_embd: 64\ntrain:\n  lr: 0.002\n")
    c = load_config(path, flag_overrides(n_layer=5, lr=None, batch_size=7))
    assert c.model.n_layer == 5  # flag beats YAML
    assert c.model.n_embd == 64  # YAML beats default
    assert c.train.lr == 0.002  # a flag left unset does not override
    assert c.train.batch_size == 7
    assert c.model.block_size == Config().model.block_size  # default


def test_numbers_with_an_exponent_are_numbers(tmp_path):
    """`lr: 1e-3` is a number (YAML 1.2, Python, JSON), not the string YAML 1.1 reads;
    words and strings that only start like one stay text."""
    from gptcli.config.yaml_input import load

    path = tmp_path / "c.yaml"
    path.write_text("train:\n  lr: 1e-3\n  min_lr: 5E-5\n  weight_decay: .5e-1\n")
    c = load_config(path, flag_overrides())
    assert (c.train.lr, c.train.min_lr, c.train.weight_decay) == (0.001, 5e-5, 0.05)
    assert load("a: 1e\nb: e5\nc: '1e-3'\nd: 1e-3x", "x") == {"a": "1e", "b": "e5", "c": "1e-3", "d": "1e-3x"}


def test_config_round_trips_through_yaml(tmp_path):
    c = load_config(None, flag_overrides(n_layer=2, max_time="15m", tokenizer="gpt2"))
    assert c.train.max_time == 900.0
    path = tmp_path / "saved.yaml"
    path.write_text(c.to_yaml())
    assert load_config(path) == c


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("model:\n  n_layers: 4\n", "unknown key 'model.n_layers' in .*did you mean 'n_layer'"),
        ("modle:\n  n_layer: 4\n", "unknown key 'modle' at the top .*did you mean the section 'model:'"),
        ("n_layr: 4\n", r"unknown key 'n_layr' at the top .*did you mean 'model.n_layer'"),
        ("n_layer: 4\n", r"unknown key 'n_layer' at the top .*did you mean 'model.n_layer'"),
        ("warmup: 4\n", r"did you mean 'train.warmup_iters'"),
        ("train:\n  max_time: .nan\n", r"train.max_time \(--max-time\) must be a finite number > 0, got nan"),
        ("train:\n  lr: .inf\n", r"train.lr \(--lr\) must be a finite number > 0, got inf"),
        ("model:\n  dropout: 1.0\n", r"model.dropout \(--dropout\) must be in \[0, 1\), got 1.0"),
        ("train:\n  lr: fast\n", "train.lr must be a number, got 'fast'"),
        ("model:\n  n_layer: 2.5\n", "model.n_layer must be an integer"),
        ("model:\n  bias: 'yes'\n", "model.bias must be true or false"),
        ("model:\n  n_embd: 100\n  n_head: 6\n", r"n_embd \(100\) must be divisible by model.n_head \(6\)"),
        ("train:\n  lr: -0.001\n", r"train.lr \(--lr\) must be > 0"),
        ("train:\n  min_lr: 0.1\n  lr: 0.01\n", "min_lr .* must not exceed"),
        ("train:\n  dtype: float8\n", r"train.dtype \(--dtype\) must be"),
        ("model: [1, 2]\n", "section 'model' .* must be a mapping"),
        ("train:\n  max_time: soon\n", "bad duration"),
        ("{{{\n", "not valid YAML"),
        # the optimizer and schedule keys (gptcli/optim.py)
        (
            "train:\n  optimizer: mun\n",
            r"train.optimizer \(--optimizer\) must be adamw or muon, got 'mun'; did you mean 'muon'\?",
        ),
        (
            "train:\n  schedule: wds\n",
            r"train.schedule \(--schedule\) must be cosine or wsd, got 'wds'; did you mean 'wsd'\?",
        ),
        ("train:\n  muon_lrr: 0.02\n", "unknown key 'train.muon_lrr' in .*did you mean 'muon_lr'"),
        (
            "train:\n  muon_momentum: 1.0\n",
            r"train.muon_momentum \(--muon-momentum\) must be in \[0, 1\), got 1.0",
        ),
        ("train:\n  muon_lr: 0\n", r"train.muon_lr \(--muon-lr\) must be > 0"),
        ("train:\n  muon_ns_steps: 0\n", r"train.muon_ns_steps must be in \[1, 99\], got 0"),
        ("train:\n  muon_ns_steps: 2.5\n", r"train.muon_ns_steps must be an integer, got 2.5"),
        ("train:\n  muon_ns_step: 5\n", "unknown key 'train.muon_ns_step' in .*did you mean 'muon_ns_steps'"),
        ("train:\n  muon_warmup_iters: -1\n", r"train.muon_warmup_iters must be >= 0, got -1"),
        ("train:\n  muon_warmup: 10\n", "unknown key 'train.muon_warmup' .*did you mean 'muon_warmup_iters'"),
        ("train:\n  decay_fraction: 0\n", r"train.decay_fraction \(--decay-fraction\) must be in \(0, 1\]"),
        ("train:\n  decay_fraction: 1.5\n", r"train.decay_fraction \(--decay-fraction\) must be in \(0, 1\]"),
        ("muon_lr: 0.02\n", r"did you mean 'train.muon_lr'"),
        ("train:\n  optimizer: muon\n  fsdp: true\n", "--optimizer muon does not run under --fsdp"),
    ],
)
def test_bad_configs_explain_themselves(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message):
        load_config(path)


def test_yaml_is_data_never_code(tmp_path):
    path = tmp_path / "evil.yaml"
    path.write_text("model: !!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(UsageError, match="not valid YAML"):
        load_config(path)


@pytest.mark.parametrize(
    ("value", "seconds"), [(90, 90.0), ("90", 90.0), ("90s", 90.0), ("15m", 900.0), ("1.5h", 5400.0)]
)
def test_durations(value, seconds):
    assert parse_duration(value) == seconds


def test_settings_named_with_a_flag_have_that_flag():
    """Errors name a setting's flag (key_name) only where pretrain really has it."""
    from gptcli.cli.app import verb_command
    from gptcli.config import SECTIONS

    pretrain = verb_command("pretrain")
    flags = {opt for param in pretrain.params for opt in (*param.opts, *param.secondary_opts)}
    named = [
        f.metadata["flag"] for cls in SECTIONS.values() for f in dataclasses.fields(cls) if f.metadata["flag"]
    ]
    assert len(named) > 20
    for flag in named:
        for name in flag.split("/"):
            assert name in flags, name


def test_the_optimizer_flag_says_each_verbs_default():
    import typing

    from gptcli.cli.training import training_options
    from gptcli.config import FINETUNE_DEFAULTS, TrainConfig

    def help_of(defaults: TrainConfig) -> str:
        return typing.get_args(training_options(defaults)["optimizer"])[1].help

    assert help_of(TrainConfig()).endswith("(default: muon, or adamw under --fsdp).")
    assert help_of(FINETUNE_DEFAULTS).endswith("(default: adamw).")


def test_flags_another_setting_leaves_unused_are_named():
    """--muon-lr in an AdamW run, --decay-fraction under the cosine: a warning each, from the
    flags given (a config file may keep both optimizers' settings); pretrain and finetune
    print them."""
    adamw = load_config(None, {"train": {"optimizer": "adamw"}}).train
    assert adamw.unused({"muon_lr": 0.02, "muon_momentum": 0.9, "lr": 1e-3}) == [
        "--muon-lr is not used: it goes with --optimizer muon, and this run has --optimizer adamw",
        "--muon-momentum is not used: it goes with --optimizer muon, and this run has --optimizer adamw",
    ]
    assert adamw.unused({"decay_fraction": 0.3}) == [
        "--decay-fraction is not used: it goes with --schedule wsd, and this run has --schedule cosine"
    ]
    wsd_muon = load_config(None, {"train": {"schedule": "wsd"}}).train
    assert wsd_muon.unused({"muon_lr": 0.02, "muon_momentum": 0.9, "decay_fraction": 0.3}) == []
