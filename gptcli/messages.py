"""The words of gptcli's messages: what came from outside (file names, paths, labels, record
fields, config values, generated tokens) shown safely and named boundedly, and gptcli
command lines for a user to paste.

- `printable(text)` escapes what a terminal would act on instead of showing: C0 and C1
  control characters (ESC starts the sequences that retitle or clear a terminal), DEL,
  the bidirectional overrides that make text read in another order than it is, and lone
  surrogates (bytes of a file name that were not UTF-8 come back as `\\xNN`). Newlines and
  tabs stay. With a limit, a very long text keeps its start and end around a mark that
  says how much was cut. The render layer passes everything it prints through it.
- `one_line(text)`: printable, and its line breaks escaped as well (error, warning and
  info lines).
- `quote(value)` is how a message names a value: bounded whatever the value is (a YAML
  alias bomb, a 1 MB string, a list nested a thousand deep), with its type and size.
- `command_line(*args)`: `gptcli ARGS...`, each argument shell-quoted.
"""

from __future__ import annotations

import re
import reprlib
import shlex
from typing import Any

# C0 but newline and tab, DEL, C1; bidi embeddings, overrides and isolates; lone surrogates
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
_NAMED = {"\r": "\\r", "\x0b": "\\v", "\x0c": "\\f", "\x08": "\\b", "\x00": "\\0"}


def _escape(match: re.Match[str]) -> str:
    c = match.group()
    if c in _NAMED:
        return _NAMED[c]
    code = ord(c)
    if 0xDC80 <= code <= 0xDCFF:  # a byte that was not UTF-8, kept by Python as a surrogate
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def one_line(text: str, limit: int | None = None) -> str:
    """printable(text), with line breaks shown escaped too: a message that names something
    from outside (a file name may hold a newline) stays the one line it is meant to be."""
    return _BREAKS.sub(lambda m: _BROKEN[m.group()], printable(text, limit))


_BREAKS = re.compile("[\n\u2028\u2029]")
_BROKEN = {"\n": "\\n", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def cut(text: str, limit: int) -> str:
    """text, or its start and end around a mark saying how many characters were left out."""
    if len(text) <= limit:
        return text
    head, tail = (limit * 2) // 3, limit // 3
    return f"{text[:head]}…[{len(text) - head - tail:,} characters cut]…{text[len(text) - tail :]}"


def printable(text: str, limit: int | None = None) -> str:
    """text with every character a terminal would act on shown escaped (see the module
    docstring); with limit, cut to about that many characters first."""
    if limit is not None:
        text = cut(text, limit)
    return _UNSAFE.sub(_escape, text)


_repr = reprlib.Repr()
_repr.maxlevel, _repr.maxstring, _repr.maxother = 2, 40, 40
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 3

_KINDS = {list: ("a list", "item"), tuple: ("a list", "item"), dict: ("a mapping", "key"),
          set: ("a set", "item")}  # fmt: skip


def quote(value: Any, limit: int = 60) -> str:
    """A value from outside, as an error message shows it: a string quoted, escaped and cut
    to about limit characters; a list or mapping by its size and a bounded preview; never
    more than a few dozen characters, whatever the value holds."""
    if isinstance(value, str):
        return f"'{printable(value, limit)}'"
    kind = next((k for t, k in _KINDS.items() if isinstance(value, t)), None)
    preview = printable(cut(_repr.repr(value), limit))
    if kind is None:
        return preview
    n = len(value)
    return f"{kind[0]} of {n:,} {kind[1]}{'' if n == 1 else 's'} ({preview})"


def command_line(*args: object) -> str:
    """A gptcli command line for the user to paste (in a message or hint), each argument
    shell-quoted: a path with a space stays one argument."""
    return " ".join(["gptcli", *(shlex.quote(str(a)) for a in args)])
