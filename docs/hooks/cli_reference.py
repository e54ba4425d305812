"""MkDocs hook: the CLI reference page (reference/cli.md), generated at build time from the
Typer app itself, every verb and every option with its default and help, so that it
cannot drift from the code. It reads the app's own metadata (the Click commands Typer
builds from the verbs' settings), not a page written by hand."""

from __future__ import annotations

from typing import Any

PAGE = "reference/cli.md"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _type_name(param: Any, ctx: Any) -> str:
    """What --help shows for the option's value: <int>, <path>, K; nothing for a flag."""
    if getattr(param, "is_flag", False):
        return ""
    shown = getattr(param, "display_type_rich", None)  # typer 0.29 draws types itself
    if shown is not None:
        return shown(ctx) or ""
    return param.metavar or param.type.name


def reference() -> str:
    from gptcli.cli.app import VERBS, verb_command
    from gptcli.cli.declare import is_examples

    out = [
        "# CLI reference",
        "",
        "Generated from the Typer app when the docs are built: every verb, its arguments and "
        "options, each option's default as the verb's settings hold it "
        "(`gptcli/config/verbs.py`, and for pretrain and finetune the run config's fields). "
        "`gptcli VERB --help` says the same.",
        "",
        "Global options: `--debug` (show Python tracebacks on errors), `--version` / `-V`, "
        "`--install-completion`, `--help` / `-h`.",
        "",
    ]
    for name in VERBS:
        cmd = verb_command(name)
        ctx = cmd.make_context(f"gptcli {name}", [], resilient_parsing=True)
        summary, *paragraphs = (cmd.help or "").strip().split("\n\n")
        out += [f"## `gptcli {name}`", "", summary.replace("\n", " "), ""]
        for paragraph in paragraphs:
            if is_examples(paragraph):
                out += ["```", *[ln.rstrip() for ln in paragraph.splitlines() if ln.strip()], "```", ""]
            else:
                out += [paragraph, ""]
        args = [p for p in cmd.params if p.param_type_name == "argument"]
        if args:
            out += ["| argument | help |", "| --- | --- |"]
            out += [
                f"| `{p.name.upper()}`{'...' if p.nargs == -1 else ''} | {_escape(p.help or '')} |"
                for p in args
            ]
            out.append("")
        panels: dict[str, list[Any]] = {}
        for p in cmd.params:
            if p.param_type_name == "option":
                panels.setdefault(getattr(p, "rich_help_panel", None) or "Options", []).append(p)
        for panel, params in panels.items():
            out += [f"**{panel}**", "", "| option | value | help |", "| --- | --- | --- |"]
            for p in params:
                names = ", ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
                out.append(f"| {names} | {_escape(_type_name(p, ctx))} | {_escape(p.help or '')} |")
            out.append("")
    return "\n".join(out) + "\n"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=reference()))
    return files
