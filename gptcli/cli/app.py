"""The `gptcli` Typer app: registers the verbs and is the one error boundary.

Every failure leaves here as one line on stderr and an exit code: 2 for bad input (usage
errors and gptcli.errors.UsageError), 130 for Ctrl-C, 1 for anything else. `--debug`
(or GPTCLI_DEBUG=1) shows the traceback instead. Nothing here imports torch: verbs import
the core lazily, so `gptcli --help` stays fast. A verb's module, its settings and its
command are made only when it runs (or its own --help shows): `gptcli --help` lists the
verbs from VERBS alone.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption

from gptcli import __version__
from gptcli.cli import render
from gptcli.errors import GptcliError, compiler_failed, unforeseen
from gptcli.messages import printable

if TYPE_CHECKING:
    from gptcli.cli.declare import Overrides

_debug = os.environ.get("GPTCLI_DEBUG", "") not in ("", "0")

# Click's base exception, reached through Typer's public API: Typer re-exports Click's
# BadParameter, whose ancestors include it, whether Click is installed on its own (typer
# before 0.29) or vendored inside Typer (typer._click, a private module, since 0.29)
ClickException = next(c for c in typer.BadParameter.__mro__ if c.__name__ == "ClickException")


def _not_a_directory(name: str) -> str:
    """The line for a path that goes through a file as if it were a directory (--out
    notes.txt/run, GPTCLI_CACHE_DIR=notes.txt/cache)."""
    from pathlib import Path

    from gptcli.files import in_the_way

    blocker = in_the_way(name)
    what = "a part of it is not a directory"
    if blocker is not None:
        what = f"{printable(str(blocker), 200)} is a file, not a directory"
    cache = os.environ.get("GPTCLI_CACHE_DIR")
    in_cache = cache and Path(os.path.abspath(name)).is_relative_to(os.path.abspath(cache))
    via = " (under GPTCLI_CACHE_DIR)" if in_cache else ""
    return f"cannot write {printable(name, 200)}: {what}{via}; give a path under a directory"


def _is_no_args_help(e: BaseException) -> bool:
    """Click's "no arguments: show the help" signal (Click 8.2+; older Clicks print the help
    and exit 0 themselves)."""
    return type(e).__name__ == "NoArgsIsHelpError"


_option_type = getattr(TyperOption, "display_type_rich", None)  # typer 0.29+ draws types itself


def _flag_type(self: TyperOption, ctx: Any) -> str | None:
    """No "<bool>" after --json, --force, --help...: a flag takes no value."""
    return None if self.is_flag else _option_type(self, ctx)


if _option_type is not None:
    TyperOption.display_type_rich = _flag_type  # type: ignore[method-assign]


def _debug_before_the_verb(args: Any) -> bool:
    """Whether --debug comes before the verb: Click makes the verb's command (importing its
    module) before the root's callback reads --debug, so a failure there is shown as asked."""
    for arg in list(args) if args is not None else sys.argv[1:]:
        if arg == "--debug":
            return True
        if not arg.startswith("-"):  # (the verb)
            return False
    return False


class _Summary(TyperCommand):
    """A verb's name and summary, all that `gptcli --help` shows of it, until it is run."""


class _Boundary(TyperGroup):
    """Runs the app and turns every exception into one line and an exit code. Its verbs are
    listed from VERBS (their help, and suggestions for a mistyped one), their commands made
    when first asked for (verb_command)."""

    _listing = False  # (while its help is drawn)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        for name, verb in VERBS.items():
            self.commands.setdefault(name, _Summary(name=name, help=verb.summary))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if isinstance(found, _Summary) and not self._listing:
            found = self.commands[cmd_name] = verb_command(cmd_name)
        return found

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def main(  # type: ignore[override]
        self,
        args: Any = None,
        prog_name: Any = None,
        complete_var: Any = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        global _debug
        _debug = _debug or _debug_before_the_verb(args)
        try:
            # "gptcli" however it was started (python -m gptcli, torchrun -m gptcli): usage
            # lines and the hints below name the command a user types
            rv = super().main(args, "gptcli", complete_var, standalone_mode=False, **extra)
        except ClickException as e:
            if _is_no_args_help(e):
                e.show()
                code = 2
            else:
                ctx = getattr(e, "ctx", None)
                render.error(f"{e.format_message()} (see '{ctx.command_path if ctx else 'gptcli'} --help')")
                code = e.exit_code
        except GptcliError as e:
            if _debug:
                raise
            oom = _out_of_memory(e, args) if type(e).__name__ == "OutOfMemory" else None
            render.error(oom or str(e))
            code = e.exit_code
        except typer.Abort:
            code = 130
        except OSError as e:
            code = 1
            if e.errno == errno.ENAMETOOLONG and not _debug:  # bad input: a path the file system refuses
                render.error(
                    f"a name in {printable(str(e.filename), 80)} is too long for the file system; "
                    "give a shorter one"
                )
                code = 2
            elif e.errno == errno.ENOTDIR and e.filename and not _debug:  # bad input: a file on the way
                render.error(_not_a_directory(str(e.filename)))
                code = 2
            elif e.errno != errno.EPIPE:
                if _debug:
                    raise
                doing = f" ({e.gptcli_doing})" if getattr(e, "gptcli_doing", None) else ""
                render.error(f"{e.strerror or e}: {e.filename or ''}".rstrip(": ") + doing)
        except BaseException as e:  # Exception, and a Rust library's panic, which derives from BaseException
            if _debug or (not isinstance(e, Exception) and type(e).__name__ != "PanicException"):
                raise
            oom = _out_of_memory(e, args)
            if oom:
                render.error(oom)
                code = 2
            elif said := compiler_failed(e):
                render.error(said)
                code = 1
            else:
                render.error(unforeseen(e, _verb(args)))
                code = 1
        else:
            code = rv if isinstance(rv, int) else 0
        if not standalone_mode:
            return code
        sys.exit(code)


# the knobs that lower memory use, per verb
_SMALLER_BATCH = "lower --batch-size (raise --grad-accum to keep the same batch) or --block-size"
_MEMORY_KNOBS = {
    "pretrain": f"{_SMALLER_BATCH}, or train a smaller model",
    "finetune": _SMALLER_BATCH,
    "sample": "lower --num-samples or --max-new-tokens, or use --dtype bf16",
    "beam": "lower --beams or --max-new-tokens, or use --dtype bf16",
    "inspect-attn": "use a shorter prompt or --dtype bf16",
    "inspect-lens": "use a shorter prompt, --position -1, or --dtype bf16",
    "classify": "classify fewer texts at a time, or use --dtype bf16",
    "eval": "use --dtype bf16, or a smaller model",
}


def _verb(args: Any) -> str | None:
    """The verb of a command line (pretrain, sample, ...), if it has one."""
    argv = list(args) if args is not None else sys.argv[1:]
    return next((a for a in argv if a in _MEMORY_KNOBS or a in ("tokenize", "export")), None)


def _out_of_memory(e: BaseException, args: Any) -> str | None:
    """A one-line message for running out of memory (on a GPU or the CPU), else None."""
    torch = sys.modules.get("torch")
    oom_type = getattr(torch, "OutOfMemoryError", ()) if torch is not None else ()
    text = str(e)
    if not (
        isinstance(e, MemoryError)
        or (oom_type and isinstance(e, oom_type))
        or "out of memory" in text.lower()
        or "can't allocate memory" in text
        or "bad_alloc" in text
        or hasattr(e, "needed")
    ):
        return None
    knobs = _MEMORY_KNOBS.get(_verb(args) or "", "use a smaller model or batch")
    if hasattr(e, "needed"):  # found before allocating: say how much
        return f"{e}; {knobs}"
    where = "the GPU" if "CUDA" in text or "cuda" in text else "this machine"
    return f"out of memory on {where}: {knobs}"


# said, not left to Typer's default: Typer 0.12 compares its default's placeholder with
# "rich", and so joined the lines of a verb's examples into one paragraph
MARKUP = "rich"

app = typer.Typer(
    cls=_Boundary,
    name="gptcli",
    help="Train, finetune, sample and look inside small GPTs.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=MARKUP,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        print(f"gptcli {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    debug: Annotated[bool, typer.Option("--debug", help="Show Python tracebacks on errors.")] = False,
    version: Annotated[
        bool, typer.Option("--version", "-V", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """Train, finetune, sample and look inside small GPTs.

    Start with `gptcli tokenize "The rabbit dug a"`, then `gptcli pretrain corpus.txt`.
    """
    global _debug
    _debug = _debug or debug


@dataclass(frozen=True)
class Verb:
    """Where a verb is: its module under gptcli/cli, its one function there, its settings in
    config/verbs.py, the module's groups of run config flags it overrides, and the first
    paragraph of the function's docstring, which `gptcli --help` lists (a test holds them
    equal)."""

    module: str
    run: str
    settings: str
    summary: str
    overrides: str | None = None


# a new verb is its settings in config/verbs.py, its module here, and one entry
VERBS: dict[str, Verb] = {
    "tokenize": Verb(
        "tokenize",
        "tokenize",
        "TokenizeSettings",
        "Show the tokens of a text, or encode a corpus for training.",
    ),
    "pretrain": Verb(
        "pretrain",
        "pretrain",
        "PretrainSettings",
        "Train a GPT from scratch: live loss curve, checkpoints, exact resume.",
        "PRETRAIN_OVERRIDES",
    ),
    "finetune": Verb(
        "finetune",
        "finetune",
        "FinetuneVerbSettings",
        "Finetune a model: domain text, classification, multiple choice or instructions.",
        "FINETUNE_OVERRIDES",
    ),
    "sample": Verb("sample", "sample", "SampleSettings", "Generate text from a trained model."),
    "beam": Verb("beam", "beam", "BeamSettings", "Search for the likeliest continuations with beam search."),
    "inspect-attn": Verb(
        "inspect_attn",
        "inspect_attn",
        "InspectAttnSettings",
        "Show what every attention head looks at, and what the model predicts next.",
    ),
    "inspect-lens": Verb(
        "inspect_lens",
        "inspect_lens",
        "InspectLensSettings",
        "Show what the model would predict after each layer (the logit lens).",
    ),
    "classify": Verb(
        "classify",
        "classify",
        "ClassifySettings",
        "Classify text with a finetuned classifier, or pick among choices.",
    ),
    "eval": Verb(
        "eval",
        "eval_",
        "EvalSettings",
        "Score models on files: perplexity and bits per byte, LAMBADA, multiple choice, accuracy.",
    ),
    "export": Verb("export", "export", "ExportSettings", "Export a model for other tools."),
    "serve": Verb(
        "serve",
        "serve",
        "ServeSettings",
        "Serve a model over HTTP, as OpenAI's API (completions, streaming, logprobs).",
    ),
    "chat": Verb("chat", "chat", "ChatSettings", "Talk to a chat model."),
}


def verb_parts(name: str) -> tuple[type, Callable[..., None], tuple[Overrides, ...]]:
    """A verb's settings class, its function, and the run config's flags it overrides."""
    from gptcli.config import verbs

    verb = VERBS[name]
    module = importlib.import_module(f"gptcli.cli.{verb.module}")
    overrides = getattr(module, verb.overrides) if verb.overrides else ()
    return getattr(verbs, verb.settings), getattr(module, verb.run), overrides


def verb_command(name: str) -> Any:
    """A verb's Click command, as Typer makes it (a Typer app of that one command)."""
    from gptcli.cli.declare import command

    one = typer.Typer(add_completion=False, rich_markup_mode=MARKUP)
    one.command(name)(command(*verb_parts(name)))
    return typer.main.get_command(one)


def main() -> None:
    # a terminal that is not UTF-8 (a Latin-1 locale, PYTHONIOENCODING=ascii) gets "?" for
    # what it cannot show, from every writer (help screens included), never a traceback
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(AttributeError, ValueError):
            stream.reconfigure(errors="replace")
    app(prog_name="gptcli")
