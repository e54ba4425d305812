"""Verbs as declarations: a verb's Typer command is generated from its settings dataclass
(gptcli/config/verbs.py), so that a flag's names, help, default, range and panel are
written once, in the field's knob.

    command(SampleSettings, run)        run(settings): the verb's one function

pretrain and finetune also take flags that override a run config's sections (ModelConfig,
TrainConfig, ...): `Overrides` names the section's fields, the defaults their help shows,
and where they go in --help. Those flags default to None ("not given"), so a YAML value or
a resumed run's is not overridden, and reach run() as {section: {field: value}}.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import re
import shutil
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, Field, dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

import typer

from gptcli.config import flag_name, help_text


@dataclass(frozen=True)
class Overrides:
    """Flags for a run config section's fields: section names it in what run() receives;
    names, the fields (in --help's order; default: every field with a flag and help);
    defaults, the instance whose values --help shows (default: the class's); helps, this
    verb's own (help, what the default means) for a field; before, the settings field
    they are listed before (default: after all of them); panel, for fields without one."""

    section: str
    cls: type
    names: tuple[str, ...] | None = None
    defaults: Any = None
    helps: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    before: str | None = None
    panel: str | None = None

    def fields(self) -> list[Field]:
        by_name = {f.name: f for f in fields(self.cls)}
        if self.names is not None:
            return [by_name[n] for n in self.names]
        return [f for f in by_name.values() if f.metadata.get("flag") and f.metadata.get("help")]


def _base_type(hint: Any) -> Any:
    """int for `int | None`, list[str] for `list[str] | None`."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args and type(None) in typing.get_args(hint) else hint


def _item(hint: Any) -> Any:
    """The type of one value of a repeatable parameter (list[Path]: Path), else None."""
    base = _base_type(hint)
    return typing.get_args(base)[0] if typing.get_origin(base) is list and typing.get_args(base) else None


def _each(hint: Any) -> str | None:
    """The word for one value of a repeatable parameter (list[str]: <str>, as a single one
    shows), else None (Typer's own)."""
    item = _item(hint)
    return f"<{item.__name__.lower()}>" if item is not None else None


def _path(value: Any) -> Path:
    """A path, where an empty one is refused: Path("") is ".", the working directory, so
    `--out ""` (an unset variable in a script) wrote there."""
    if isinstance(value, Path):
        return value
    if not str(value):
        raise typer.BadParameter("is empty; give a path")
    return Path(value)


def _parser(hint: Any) -> Callable[[Any], Any] | None:
    """The parser of a path parameter (single or repeatable), else None (Typer's own)."""
    return _path if Path in (_base_type(hint), _item(hint)) else None


def _complete(name: str | None) -> Callable[[str], list[str]] | None:
    if name is None:
        return None
    from gptcli.cli.common import complete_runs

    return {"runs": complete_runs}[name]


def _parameter(f: Field, hint: Any, *, default: Any, help: str, panel: str | None) -> inspect.Parameter:
    """The Typer parameter of one field."""
    meta = f.metadata
    if meta.get("argument"):  # (its name is its word: text..., corpus...)
        spec: Any = typer.Argument(help=help, show_default=False, parser=_parser(hint))
    else:
        names = [meta["flag"], *([meta["short"]] if meta.get("short") else [])]
        spec = typer.Option(
            *names, help=help, show_default=False, rich_help_panel=panel,
            metavar=meta.get("metavar") or _each(hint), parser=_parser(hint),
            autocompletion=_complete(meta.get("complete")),
        )  # fmt: skip
    return inspect.Parameter(
        f.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=Annotated[hint, spec]
    )


def _settings_parameters(settings: type) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(settings)
    out = []
    for f in fields(settings):
        required = f.default is MISSING and f.default_factory is MISSING
        hint, default = hints[f.name], ... if required else f.default
        if f.default_factory is not MISSING:  # a list: "not given" is None, made [] below
            hint, default = _base_type(hint) | None, None
        out.append(_parameter(f, hint, default=default, help=help_text(f), panel=f.metadata.get("panel")))
    return out


def override_parameters(group: Overrides) -> list[inspect.Parameter]:
    hints = typing.get_type_hints(group.cls)
    out = []
    for f in group.fields():
        hint = f.metadata.get("given_as") or _base_type(hints[f.name])
        value = getattr(group.defaults, f.name) if group.defaults is not None else MISSING
        if f.name in group.helps:
            text, shown = group.helps[f.name]
            help = f"{text} (default: {shown})."
        else:
            help = help_text(f, value)
        panel = f.metadata.get("panel") or group.panel
        out.append(_parameter(f, hint | None, default=None, help=help, panel=panel))
    return out


def fit_examples(doc: str, columns: int) -> str:
    """A verb's docstring for --help on a terminal of `columns`: where an example line
    (gptcli ..., then a note after 2 spaces or more) would not fit, every example goes on two
    lines, the note under the command, rather than wrapped in the middle of either."""
    examples = [re.fullmatch(r"(\s*)(gptcli \S.*?)\s{2,}(\S.*)", line) for line in doc.splitlines()]
    if all(m is None or len(m[0].strip()) <= columns - 4 for m in examples):  # (as shown, aligned)
        return doc
    return "\n".join(
        line if m is None else f"{m[1]}{m[2]}\n{m[1]}    {m[3]}"
        for line, m in zip(doc.splitlines(), examples, strict=True)
    )


def is_examples(paragraph: str) -> bool:
    """Whether a paragraph of a verb's docstring is its examples: command lines (gptcli ...,
    curl ...), each maybe with its note, indented lines under them."""
    return all(line.startswith(("gptcli", "curl ", " ")) for line in paragraph.splitlines())


def prose_on_one_line(doc: str) -> str:
    """A verb's docstring with each paragraph of prose on one line, for the terminal to wrap
    (Typer's rich help keeps a docstring's line breaks: at 80 columns a line of 84 broke in
    two, the rest of the paragraph after it), its examples as written."""
    paragraphs = doc.split("\n\n")
    return "\n\n".join(p if is_examples(p) else " ".join(p.split()) for p in paragraphs)


def help_columns() -> int:
    """The width --help is drawn at: Typer's TERMINAL_WIDTH, else the terminal's (COLUMNS)."""
    with contextlib.suppress(ValueError):
        return int(os.environ.get("TERMINAL_WIDTH", ""))
    return shutil.get_terminal_size().columns


def command(
    settings: type, run: Callable[..., None], overrides: Sequence[Overrides] = ()
) -> Callable[..., None]:
    """A Typer command for a verb: its parameters are settings' fields (then each group of
    overrides), its help run's docstring. Called, it builds and validates the settings and
    calls run(settings), or run(settings, {section: {field: value given}}) with overrides."""
    params = _settings_parameters(settings)
    for group in overrides:
        extra = override_parameters(group)
        at = next((i for i, p in enumerate(params) if p.name == group.before), len(params))
        params[at:at] = extra
    lists = {f.name for f in fields(settings) if f.default_factory is not MISSING}
    own = {f.name for f in fields(settings)}

    @functools.wraps(run)
    def verb(**kwargs: Any) -> None:
        values = {k: ([] if v is None and k in lists else v) for k, v in kwargs.items() if k in own}
        chosen = settings(**values).validate()
        if not overrides:
            return run(chosen)
        given: dict[str, dict[str, Any]] = {}
        for group in overrides:
            for f in group.fields():
                if kwargs.get(f.name) is not None:
                    given.setdefault(group.section, {})[f.name] = kwargs[f.name]
        return run(chosen, given)

    verb.__doc__ = fit_examples(prose_on_one_line(inspect.cleandoc(run.__doc__ or "")), help_columns())
    verb.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    verb.__annotations__ = {p.name: p.annotation for p in params}
    del verb.__wrapped__  # Typer reads the signature above, not run's
    return verb


def flags_of(settings: type, overrides: Sequence[Overrides] = ()) -> dict[str, str]:
    """{field name: its long flag} of a verb, for messages and the docs."""
    out = {f.name: flag_name(f) for f in fields(settings) if f.metadata.get("flag")}
    for group in overrides:
        out |= {f.name: flag_name(f) for f in group.fields()}
    return out
