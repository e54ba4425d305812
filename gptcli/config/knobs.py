"""Settings as typed dataclasses whose fields say everything about themselves: the values
they may take, their flag and help, their default in words, whether --resume may change
them. Everything else reads these: validation (check_fields), the verbs' options
(gptcli/cli/declare.py), the CLI reference, resume's rules."""

from __future__ import annotations

import difflib
import math
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from gptcli.errors import UsageError
from gptcli.messages import quote

SEED_MAX = 2**63 - 1  # torch.manual_seed takes up to this
FLOAT32_MAX = 3.4028234663852886e38


@dataclass(frozen=True)
class Range:
    """The values a number may take (always finite): lo/hi bounds, each inclusive unless
    open."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def admits(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):  # (an int may be too big for a float)
            return False
        if self.lo is not None and (value < self.lo or (self.lo_open and value == self.lo)):
            return False
        return not (self.hi is not None and (value > self.hi or (self.hi_open and value == self.hi)))

    def describe(self) -> str:
        lo, hi = _number(self.lo), _number(self.hi)
        if self.lo is not None and self.hi is not None:
            return f"in {'(' if self.lo_open else '['}{lo}, {hi}{')' if self.hi_open else ']'}"
        if self.lo is not None:
            return f"{'>' if self.lo_open else '>='} {lo}"
        if self.hi is not None:
            return f"{'<' if self.hi_open else '<='} {hi}"
        return "a finite number"


def _number(x: float | None) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}" if x is not None else ""


POSITIVE = Range(1)  # integers >= 1
SIZE = Range(1, 2**31 - 1)  # a model dimension: positive, and an index torch can take
NON_NEGATIVE = Range(0)
GREATER_THAN_ZERO = Range(0, lo_open=True)
FRACTION = Range(0, 1, hi_open=True)  # [0, 1)
OPEN_FRACTION = Range(0, 1, lo_open=True, hi_open=True)  # (0, 1)


def knob(
    default: Any,
    *,
    check: Range | None = None,
    choices: tuple[str, ...] | None = None,
    flag: str | None = None,
    short: str | None = None,
    help: str = "",
    shown: str | None = None,
    on_resume: bool = False,
    panel: str | None = None,
    metavar: str | None = None,
    argument: bool = False,
    complete: str | None = None,
    given_as: type | None = None,
    nonempty: str | None = None,
) -> Any:
    """A setting and everything the rest of gptcli needs to know about it, written once:

    - check, choices: the values it may take (checked by check_fields); nonempty: what to
      give instead of an empty text (or an empty text among several), which is refused;
    - flag: its command-line flag, e.g. "--max-new-tokens" or "--compile/--no-compile", and
      short, e.g. "-n"; argument: it is a positional argument instead;
    - help: what it does; shown: what its default means when the value does not say
      ("the newest run under ./runs"); the help then ends "(default: ...)" (help_text);
    - panel: the group it is listed under in --help; metavar: the word for its value;
      complete: "runs" to complete it with the run directories under ./runs; given_as: the
      type the command line gives it as, when not its own (a duration as text, "15m");
    - on_resume: whether --resume may change it (only keys that budget or report a run, or
      say where it runs, never its maths).

    The verbs' options are generated from these (gptcli/cli/declare.py)."""
    meta = {
        "check": check,
        "choices": choices,
        "nonempty": nonempty,
        "flag": flag,
        "short": short,
        "help": help,
        "shown": shown,
        "on_resume": on_resume,
        "panel": panel,
        "metavar": metavar,
        "argument": argument,
        "complete": complete,
        "given_as": given_as,
    }
    if default is ...:  # required: a positional argument the verb cannot do without
        return field(metadata=meta)
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata=meta)
    return field(default=default, metadata=meta)


def flag_name(f: Field) -> str:
    """How a message names a setting that comes from the command line: its long flag."""
    flag = f.metadata.get("flag")
    return flag.split("/")[0] if flag else f.name


def field_default(f: Field) -> Any:
    return f.default_factory() if f.default is MISSING else f.default  # type: ignore[misc]


def default_text(f: Field, value: Any = MISSING) -> str:
    """A default as --help says it: what it means (the field's `shown`) when it is the
    field's own default, else the value: off, on, 0.001, a list, none."""
    own = field_default(f) if f.default is not MISSING or f.default_factory is not MISSING else MISSING
    if value is MISSING:
        value = own
    if f.metadata.get("shown") is not None and value == own:
        return f.metadata["shown"]
    if value is None or value is False:
        return "off"
    if value is True:
        return "on"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def help_text(f: Field, value: Any = MISSING) -> str:
    """A setting's --help line: its help and its default (value: another default than the
    field's, e.g. finetuning's)."""
    text = f.metadata.get("help", "")
    if f.metadata.get("argument"):
        return text
    return f"{text.rstrip('.')} (default: {default_text(f, value)})."


def check_fields(obj: Any, section: str | None = None) -> None:
    """Every field of a config dataclass against its declared range or choices; errors
    name section.key (and its flag), or the flag alone for settings that only come from
    the command line (section None)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None or isinstance(value, bool):
            continue
        if section:
            flag = f.metadata.get("flag")
            name = f"{section}.{f.name}" + (f" ({flag})" if flag else "")
        else:
            name = flag_name(f)
        check, choices = f.metadata.get("check"), f.metadata.get("choices")
        instead = f.metadata.get("nonempty")
        if instead and ("" in value if isinstance(value, list | tuple) else value == ""):
            raise UsageError(f"{name} is empty; give {instead}")
        if check is not None and isinstance(value, (int, float)) and not check.admits(value):
            bounded = check.lo is not None or check.hi is not None  # (else it says "a finite number")
            finite = (
                "a finite number "
                if bounded and isinstance(value, float) and not math.isfinite(value)
                else ""
            )
            raise UsageError(f"{name} must be {finite}{check.describe()}, got {value}")
        if choices and value not in choices:
            listed = f"{', '.join(choices[:-1])} or {choices[-1]}" if len(choices) > 1 else choices[0]
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise UsageError(f"{name} must be {listed}, got {quote(value)}{hint}")
