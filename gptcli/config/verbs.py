"""What each verb takes, declared once: a dataclass per verb whose fields are its arguments
and options, in --help's order. The Typer options are generated from them
(gptcli/cli/declare.py); pretrain and finetune add the run config's own fields
(ModelConfig, TrainConfig, ...) as flags that override it.

No torch, no Typer: `gptcli --help` reads these.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptcli.config.knobs import NON_NEGATIVE, POSITIVE, SEED_MAX, Range, check_fields, knob
from gptcli.config.run import LORA, RUN
from gptcli.errors import UsageError

TOP_P = Range(0, 1, lo_open=True)  # (0, 1]: a nucleus of some mass


# --- what several verbs take ------------------------------------------------------------------


def ckpt_knob(**kw: Any) -> Any:
    help = kw.pop(
        "help",
        "A run dir (its best/ checkpoint), a checkpoint dir such as RUN/last, a Hugging Face GPT-2 "
        "dir or hub name (gpt2), or a .gguf file",
    )
    shown = kw.pop("shown", "the newest run under ./runs")
    return knob(None, flag="--ckpt", help=help, shown=shown, complete="runs", **kw)


def base_knob(**kw: Any) -> Any:
    help = kw.pop("help", "For a LoRA run whose base checkpoint has moved: where it is now")
    return knob(None, flag="--base", help=help, shown="where the run says", **kw)


def compile_knob() -> Any:
    return knob(
        None,
        flag="--compile/--no-compile",
        help="Decode with a static KV cache and a compiled step (CUDA graphs on CUDA); --no-compile: "
        "fully eager",
        shown="the fastest measured, compiled on CUDA, not on the CPU",
    )


def device_knob(**kw: Any) -> Any:
    return knob("auto", flag="--device", help="auto | cpu | cuda | cuda:N | mps", **kw)


def dtype_knob(**kw: Any) -> Any:
    return knob("auto", flag="--dtype", help="auto | fp32 | bf16 | fp16: the weights' type", **kw)


def temp_knob() -> Any:
    return knob(
        1.0,
        check=NON_NEGATIVE,
        flag="--temp",
        help="Temperature: sample from q ∝ p^(1/temp); 0 = greedy (argmax)",
    )


def top_k_knob() -> Any:
    return knob(None, check=POSITIVE, flag="--top-k", help="Sample only among the k likeliest tokens")


def top_p_knob() -> Any:
    return knob(None, check=TOP_P, flag="--top-p", help="Sample only within the smallest set of mass top-p")


def quantize_knob() -> Any:
    return knob(
        None,
        choices=("int8",),
        flag="--quantize",
        help="int8: weight-only int8 with a scale per output row, quantized at load (decoding on "
        "the CPU reads half of bf16's bytes per token)",
        shown="off",
    )


def json_knob(help: str = "Print JSON instead of tables", **kw: Any) -> Any:
    return knob(False, flag="--json", help=help, **kw)


def save_knob() -> Any:
    return knob(
        None,
        flag="--save",
        help="Also write FILE.json, FILE.png (matplotlib) or FILE.html (interactive)",
        shown="none",
    )


def config_knob() -> Any:
    return knob(
        [],
        flag="--config",
        short="-c",
        help="YAML config (see examples/configs)",
        shown="none",
        panel=RUN,
        metavar="<path>",
    )


def one_config(paths: list[Path]) -> Path | None:
    """The config file given (None: none). Given twice, refused: the second would replace
    the first whole, silently (a run of another shape than the first file says)."""
    if len(paths) > 1:
        raise UsageError(
            f"--config is given {len(paths)} times ({', '.join(str(p) for p in paths)}); give one file, "
            "with the others' settings in it or as flags"
        )
    return paths[0] if paths else None


def run_dir_knob(shown: str) -> Any:
    return knob(None, flag="--out", short="-o", help="Run directory", shown=shown, panel=RUN)


def resume_knob() -> Any:
    return knob(
        False, flag="--resume", help="Continue the run in --out (else the newest run) exactly", panel=RUN
    )


def new_data_knob() -> Any:
    help = "With --resume: continue on data other than the run's, on purpose (the run records it)"
    return knob(False, flag="--new-data", help=help, panel=RUN)


def prompt_argument(help: str) -> Any:
    return knob(..., argument=True, help=help)


class Settings:
    """A verb's settings: every field checked against its declared range or choices."""

    def validate(self) -> Any:
        check_fields(self)
        return self


# --- the verbs -----------------------------------------------------------------------------------


@dataclass
class TokenizeSettings(Settings):
    inputs: list[str] = knob(
        ..., argument=True, help="Text to tokenize; with --out, corpus files or directories."
    )
    out: Path | None = knob(
        None,
        flag="--out",
        short="-o",
        help="Encode the corpus into DIR: train.bin, val.bin, tokenizer.json, meta.json",
        shown="none: show the text's tokens",
    )
    tokenizer: str | None = knob(
        None,
        flag="--tokenizer",
        short="-t",
        help="char, gpt2, bpe:N, or a tokenizer.json / run / data dir",
        shown="gpt2 text, char corpus",
    )
    val_fraction: float = knob(
        0.1,
        check=Range(0, 1, hi_open=True),
        flag="--val-fraction",
        help="Share of the corpus, from its end, kept for validation",
    )
    text_column: str = knob(
        "text", flag="--text-column", help="The column of Parquet files that holds the text"
    )
    force: bool = knob(False, flag="--force", help="Replace what --out already holds")
    json_out: bool = json_knob()


@dataclass
class PretrainSettings(Settings):
    """The run's own options; the model, data and training flags override its config."""

    corpus: list[Path] | None = knob(
        None, argument=True, help="Text files, directories of them, or a directory made by `gptcli tokenize`."
    )
    config: list[Path] = config_knob()
    out: Path | None = run_dir_knob("runs/<corpus>-<time>")
    resume: bool = resume_knob()
    new_data: bool = new_data_knob()
    json_out: bool = json_knob("Print the run's summary as JSON (progress lines go to stderr)", panel=RUN)


@dataclass
class FinetuneVerbSettings(Settings):
    """The run's own options; the task, LoRA, model and training flags override its settings."""

    data: list[Path] | None = knob(
        None,
        argument=True,
        help="--task lm: text files/dirs (or a `gptcli tokenize` dir); otherwise a JSONL "
        "file (classify also takes CSV).",
    )
    ckpt: str | None = knob(
        None,
        flag="--ckpt",
        help="The model to start from: a run, checkpoint dir, GPT-2 dir or hub name, or a .gguf file",
        shown="the run's, with --resume",
        panel=RUN,
        complete="runs",
    )
    base: Path | None = base_knob(
        help="With --resume: where a LoRA run's base checkpoint is now, if it moved", panel=LORA
    )
    config: list[Path] = config_knob()
    out: Path | None = run_dir_knob("runs/<data>-<task>-<time>")
    resume: bool = resume_knob()
    new_data: bool = new_data_knob()
    json_out: bool = json_knob("Print the run's summary as JSON (progress lines go to stderr)", panel=RUN)


@dataclass
class SampleSettings(Settings):
    ckpt: str | None = ckpt_knob()
    base: Path | None = base_knob()
    compile: bool | None = compile_knob()
    prompt: str | None = knob(
        None, flag="--prompt", short="-p", help="Text to continue", shown="start of a document"
    )
    prompt_file: Path | None = knob(
        None, flag="--prompt-file", help="Read the prompt from a file (-: stdin)", shown="none"
    )
    max_new_tokens: int = knob(
        200, check=POSITIVE, flag="--max-new-tokens", short="-n", help="Tokens to generate"
    )
    num_samples: int = knob(
        1, check=POSITIVE, flag="--num-samples", help="Continuations, decoded as one batch"
    )
    temp: float = temp_knob()
    top_k: int | None = top_k_knob()
    top_p: float | None = top_p_knob()
    stop: list[str] = knob(
        [],
        flag="--stop",
        help="End a continuation at this text (repeatable)",
        nonempty="the text that ends one",
    )
    stream: bool | None = knob(
        None, flag="--stream/--no-stream", help="Print tokens as they come", shown="on in a terminal"
    )
    show_probs: int = knob(
        0,
        check=NON_NEGATIVE,
        flag="--show-probs",
        metavar="K",
        help="After each step, show the K likeliest next tokens",
        shown="off",
    )
    seed: int | None = knob(
        None,
        check=Range(0, SEED_MAX),
        flag="--seed",
        help="Seed for reproducible random choices",
        shown="random",
    )
    device: str = device_knob()
    dtype: str = dtype_knob()
    quantize: str | None = quantize_knob()
    json_out: bool = json_knob()

    def validate(self) -> SampleSettings:
        check_fields(self)
        if self.prompt is not None and self.prompt_file is not None:
            raise UsageError("give --prompt or --prompt-file, not both")
        if self.seed is not None and self.seed + self.num_samples - 1 > SEED_MAX:  # (row i: seed + i)
            raise UsageError(
                f"--seed {self.seed} with --num-samples {self.num_samples} seeds its rows up to "
                f"{self.seed + self.num_samples - 1}, past {SEED_MAX}; give --seed "
                f"{SEED_MAX - self.num_samples + 1} or less"
            )
        return self


@dataclass
class ChatSettings(Settings):
    ckpt: str | None = ckpt_knob(shown="the newest chat run under ./runs")
    base: Path | None = base_knob()
    system: str | None = knob(
        None, flag="--system", help="A system message that opens the conversation", shown="none"
    )
    message: str | None = knob(
        None,
        flag="--message",
        short="-m",
        help="Answer this one user message and exit",
        shown="a conversation",
    )
    messages: Path | None = knob(
        None,
        flag="--messages",
        help="Answer the last user turn of a JSON file of {role, content} messages and exit",
        shown="none",
    )
    max_new_tokens: int = knob(
        200, check=POSITIVE, flag="--max-new-tokens", short="-n", help="Most tokens per reply"
    )
    temp: float = temp_knob()
    top_k: int | None = top_k_knob()
    top_p: float | None = top_p_knob()
    show_probs: int = knob(
        0,
        check=NON_NEGATIVE,
        flag="--show-probs",
        metavar="K",
        help="Before each reply, show the K likeliest first tokens",
        shown="off",
    )
    seed: int | None = knob(
        None, check=Range(0, SEED_MAX), flag="--seed", help="Seed for reproducible replies", shown="random"
    )
    device: str = device_knob()
    dtype: str = dtype_knob()
    quantize: str | None = quantize_knob()
    json_out: bool = json_knob("With --message or --messages: print the prompt ids and the reply as JSON")

    def validate(self) -> ChatSettings:
        check_fields(self)
        if self.message is not None and self.messages is not None:
            raise UsageError("give --message or --messages, not both")
        if self.json_out and self.message is None and self.messages is None:
            raise UsageError("--json goes with --message or --messages (a one-off answer)")
        return self


@dataclass
class ServeSettings(Settings):
    ckpt: str | None = ckpt_knob()
    base: Path | None = base_knob()
    host: str = knob("127.0.0.1", flag="--host", help="Address to listen on (0.0.0.0: every interface)")
    port: int = knob(8000, check=Range(0, 65535), flag="--port", help="Port to listen on (0: a free one)")
    model_name: str | None = knob(
        None,
        flag="--model-name",
        help="The model's name in the API",
        shown="the run directory's name",
        nonempty="a name, or leave --model-name out for the run directory's",
    )
    api_key: str | None = knob(
        None,
        flag="--api-key",
        help="Require 'Authorization: Bearer KEY'",
        shown="$GPTCLI_API_KEY, else none",
        nonempty="a key, or leave --api-key out to serve without one",
    )
    max_batch: int = knob(8, check=Range(1, 256), flag="--max-batch", help="Sequences decoded together")
    max_queue: int = knob(
        64, check=Range(0, 1 << 16), flag="--max-queue", help="Sequences waiting, beyond which 429"
    )
    max_tokens_limit: int | None = knob(
        None,
        check=POSITIVE,
        flag="--max-tokens-limit",
        help="The largest max_tokens a request may ask",
        shown="block_size",
    )
    cors_origin: list[str] = knob(
        [], flag="--cors-origin", help="Allow browsers from this origin (repeatable)"
    )
    compile: bool = knob(
        False,
        flag="--compile/--no-compile",
        help="Decode the batch through torch.compile (a few graphs for every batch size and length, "
        "built at start); --no-compile: the C step on the CPU, the model's own code elsewhere",
    )
    device: str = device_knob()
    dtype: str = dtype_knob()
    quantize: str | None = quantize_knob()
    json_out: bool = json_knob(help="Print one JSON line {url, model} once it is ready")


@dataclass
class BeamSettings(Settings):
    prompt: str = prompt_argument("Text to continue.")
    ckpt: str | None = ckpt_knob()
    base: Path | None = base_knob()
    compile: bool | None = compile_knob()
    beams: int = knob(4, check=POSITIVE, flag="--beams", short="-b", help="Hypotheses kept at every step (B)")
    max_new_tokens: int | None = knob(
        None,
        check=POSITIVE,
        flag="--max-new-tokens",
        short="-n",
        help="Longest continuation",
        shown="40, or half the context if shorter",
    )
    length_penalty: float = knob(
        1.0,
        check=Range(),
        flag="--length-penalty",
        help="alpha in sum(log p) / length^alpha: 1 = mean log-likelihood, 0 = plain sum",
    )
    n_best: int | None = knob(
        None, check=POSITIVE, flag="--n-best", help="Hypotheses to show, at most B", shown="B"
    )
    no_repeat_ngram: int = knob(
        0,
        check=NON_NEGATIVE,
        flag="--no-repeat-ngram",
        help="Forbid repeating any n-gram of this size",
        shown="off",
    )
    stop: list[str] = knob(
        [], flag="--stop", help="Text that ends a hypothesis (repeatable)", nonempty="the text that ends one"
    )
    eos: list[str] = knob(
        [], flag="--eos", help="A token, given as its text, that ends a hypothesis (repeatable)"
    )
    device: str = device_knob()
    dtype: str = dtype_knob()
    quantize: str | None = quantize_knob()
    json_out: bool = json_knob()

    def validate(self) -> BeamSettings:
        check_fields(self)
        if self.n_best is not None and self.n_best > self.beams:
            raise UsageError(f"--n-best must be between 1 and --beams ({self.beams}), got {self.n_best}")
        return self


@dataclass
class InspectAttnSettings(Settings):
    prompt: str = prompt_argument("Text whose attention to show.")
    ckpt: str | None = ckpt_knob()
    base: Path | None = base_knob()
    layer: str = knob("all", flag="--layer", short="-l", help="A layer index, or all")
    head: str = knob("all", flag="--head", help="A head index, all, or mean (average over heads)")
    top_k: int = knob(10, check=POSITIVE, flag="--top-k", short="-k", help="Next-token probabilities to list")
    save: Path | None = save_knob()
    force: bool = knob(False, flag="--force", help="Replace the --save file if it exists")
    device: str = device_knob()
    dtype: str = dtype_knob()
    quantize: str | None = quantize_knob()
    json_out: bool = json_knob()


@dataclass
class InspectLensSettings(Settings):
    prompt: str = prompt_argument("Text to look inside.")
    ckpt: str | None = ckpt_knob()
    base: Path | None = base_knob()
    top_k: int = knob(5, check=POSITIVE, flag="--top-k", short="-k", help="Next tokens to list per layer")
    position: str = knob(
        "all", flag="--position", short="-p", help="A token position (-1 = the last), or all"
    )
    track: str | None = knob(
        None, flag="--track", help="Follow one token's probability and rank through the layers", shown="none"
    )
    save: Path | None = save_knob()
    force: bool = knob(False, flag="--force", help="Replace the --save file if it exists")
    device: str = device_knob()
    dtype: str = dtype_knob()
    quantize: str | None = quantize_knob()
    json_out: bool = json_knob()


@dataclass
class ClassifySettings(Settings):
    text: list[str] | None = knob(
        None,
        argument=True,
        help="Text to classify (the first of a pair with --text-b), or the context of --choice.",
    )
    ckpt: str | None = ckpt_knob()
    base: Path | None = base_knob()
    text_b: str | None = knob(None, flag="--text-b", help="The second text of a pair", shown="none")
    choice: list[str] = knob(
        [],
        flag="--choice",
        help="A choice for a multiple-choice model (give two or more)",
        nonempty="the text of each choice",
    )
    file: Path | None = knob(
        None,
        flag="--file",
        short="-f",
        help="Score every record of a JSONL/CSV file; accuracy if labelled",
        shown="none",
    )
    device: str = device_knob()
    dtype: str = dtype_knob()
    json_out: bool = json_knob()

    def validate(self) -> ClassifySettings:
        check_fields(self)
        if (not self.text) == (self.file is None):
            raise UsageError("give a text to classify, or --file F.jsonl (one of the two)")
        if self.file is not None and (self.text_b is not None or self.choice):
            raise UsageError(
                "--text-b and --choice go with a text argument; in --file they are record fields"
            )
        return self


@dataclass
class EvalSettings(Settings):
    files: list[Path] = knob(..., argument=True, help="Text (.txt, .jsonl documents) or JSONL/CSV records.")
    ckpt: list[str] | None = ckpt_knob(
        help="A run, checkpoint, Hugging Face directory or hub name, or a .gguf file; repeat it to compare"
    )
    base: Path | None = base_knob()
    task: str | None = knob(
        None,
        flag="--task",
        help="text | lambada | choice | chat",
        shown="from the file, or the head of a finetuned classifier",
    )
    stride: int | None = knob(
        None, flag="--stride", help="--task text: tokens between windows", shown="block_size"
    )
    limit: int | None = knob(
        None, flag="--limit", help="Score the first N examples (text: windows) only", shown="all of them"
    )
    per_example: bool = knob(False, flag="--per-example", help="With --json: each example's scores too")
    device: str = device_knob()
    dtype: str = dtype_knob()
    quantize: str | None = quantize_knob()
    json_out: bool = json_knob()

    def validate(self) -> EvalSettings:
        check_fields(self)
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit {self.limit}: give 1 or more")
        if self.per_example and not self.json_out:
            raise UsageError("--per-example goes with --json")
        return self


@dataclass
class ExportSettings(Settings):
    ckpt: str = knob(..., argument=True, help="A run dir, checkpoint dir, GPT-2 dir, GGUF file or hub name.")
    out: Path = knob(..., argument=True, help="The directory to write (a .gguf file for --to gguf).")
    to: str | None = knob(
        None,
        choices=("hf", "gguf"),
        flag="--to",
        help="Target format: hf (Hugging Face GPT2LMHeadModel) or gguf (llama.cpp)",
        shown="gguf for a .gguf OUT, else hf",
    )
    outtype: str | None = knob(
        None,
        choices=("f32", "f16", "bf16", "q8_0"),
        flag="--outtype",
        help="--to gguf: the weights' type (q8_0: 8-bit blocks, a quarter of f32's size)",
        shown="the checkpoint's: f32, bf16 for bf16 weights, a .gguf source's own type",
    )
    adapters_only: bool = knob(
        False,
        flag="--adapters-only",
        help="A LoRA run: its adapters alone, in PEFT's format (adapter_config.json, "
        "adapter_model.safetensors), not the merged model",
    )
    base: Path | None = base_knob()
    force: bool = knob(
        False, flag="--force", help="Write into an existing, non-empty directory (or replace the .gguf file)"
    )
    json_out: bool = json_knob()
