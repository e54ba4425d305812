"""What came from outside (file names, paths, labels, record fields, config values,
generated tokens): shown safely on a terminal, named boundedly in messages, and checked to
be a file before it is read.

Two functions for everywhere such a value is shown:
- `printable(text)` escapes what a terminal would act on instead of showing: C0 and C1
  control characters (ESC starts the sequences that retitle or clear a terminal), DEL,
  the bidirectional overrides that make text read in another order than it is, and lone
  surrogates (bytes of a file name that were not UTF-8 come back as `\\xNN`). Newlines and
  tabs stay. With a limit, a very long text keeps its start and end around a mark that
  says how much was cut. The render layer passes everything it prints through it.
- `quote(value)` is how a message names a value: bounded whatever the value is (a YAML
  alias bomb, a 1 MB string, a list nested a thousand deep), with its type and size.

And `check_input` for every data file a verb reads: a device (/dev/zero never ends), a pipe
or a directory where a file goes is refused, saying what the path is.
"""

from __future__ import annotations

import json
import os
import re
import reprlib
import stat
from typing import Any

from gptcli.errors import UsageError

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


def what_is(path: os.PathLike | str) -> str:
    """What is at path, in words: 'a file', 'a directory', 'a character device' (such as
    /dev/zero, which never ends), 'a named pipe', 'a socket', 'a block device', 'a link to
    nothing' or 'nothing'. Links are followed."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return "a link to nothing" if os.path.islink(path) else "nothing"
    except (OSError, ValueError):
        return "nothing"
    for test, name in _MODES:
        if test(mode):
            return name
    return "not a file"


_MODES = (
    (stat.S_ISREG, "a file"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
)  # fmt: skip


def check_input(path: os.PathLike | str, what: str, directory: bool = False) -> None:
    """Refuse, before reading, an input that is not a file (or, with directory, a
    directory): a device never ends and a pipe cannot be read twice. what names the input
    in the message (e.g. '--file', 'the corpus')."""
    found = what_is(path)
    if found == "a file" or (directory and found == "a directory"):
        return
    wanted = "a file or a directory of files" if directory else "a file"
    shown = printable(str(path), 300)
    if found == "nothing":
        raise UsageError(f"{what} {shown}: no such file{' or directory' if directory else ''}")
    raise UsageError(f"{what} {shown} is {found}, not {wanted}; give {wanted}")


def read_json(path: os.PathLike | str, then: str) -> Any:
    """The JSON document in a file from outside. Whatever is wrong with it (missing, not a
    file, not UTF-8, not JSON, nested deeper than Python can follow) is one line:
    '{path} is unreadable (why); {then}', then saying what that means or what to do."""
    shown = printable(str(path), 300)
    found = what_is(path)
    if found not in ("a file", "nothing"):
        raise UsageError(f"{shown} is {found}, not a file; {then}")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        why = e.strerror or "cannot be read"
    except UnicodeDecodeError as e:
        why = f"not valid JSON: not UTF-8 text at byte {e.start}"
    except ValueError as e:  # json.JSONDecodeError
        why = f"not valid JSON: {getattr(e, 'msg', e)}" + (
            f" at line {e.lineno}" if hasattr(e, "lineno") else ""
        )
    except RecursionError:
        why = "nested too deeply to be a gptcli file"
    raise UsageError(f"{shown} is unreadable ({why}); {then}")


def try_read_json(path: os.PathLike | str) -> Any:
    """The JSON document in a file, or None if there is none to read (see read_json)."""
    try:
        return read_json(path, "")
    except UsageError:
        return None
