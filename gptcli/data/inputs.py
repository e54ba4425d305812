"""Files from outside, opened as data: what a path is (a device never ends, a pipe cannot be
read twice), a check before a data file is read, JSON read whole with every failure (not
UTF-8, not JSON, nested deeper than Python follows) turned into one line, its fields'
types checked (check_types), and a prompt file read with bounds."""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Mapping
from typing import Any

from gptcli.errors import UsageError
from gptcli.messages import printable, quote


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


def refuse_if_not_a_file(path: os.PathLike | str, then: str = "", kind: str = "a file") -> None:
    """Something at path that is not a file (a directory, a device, a pipe, a link to
    nothing) refused, saying what it is; nothing there passes (the caller says it is missing)."""
    if os.path.lexists(path) and not os.path.isfile(path):
        shown = printable(str(path), 300)
        raise UsageError(f"{shown} is {what_is(path)}, not {kind}" + (f"; {then}" if then else ""))


def _once_each(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are each given once (as YAML configs must be): a file that
    says two things for one key is not one to guess from."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {quote(key)} appears twice")
        out[key] = value
    return out


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
            return json.load(f, object_pairs_hook=_once_each)
    except OSError as e:
        why = e.strerror or "cannot be read"
    except UnicodeDecodeError as e:
        why = f"not valid JSON: not UTF-8 text at byte {e.start}"
    except ValueError as e:  # json.JSONDecodeError
        why = f"not valid JSON: {str(getattr(e, 'msg', e)).removesuffix(' at')}" + (
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


def check_prompt_file(path: os.PathLike | str) -> None:
    """--prompt-file: anything that can be read (a file, a pipe, a device: read_prompt_file
    bounds what it reads), but not nothing or a directory."""
    shown = printable(str(path), 300)
    if str(path) == "-":  # stdin
        return
    if not os.path.exists(path):
        raise UsageError(f"--prompt-file {shown}: no such file")
    if os.path.isdir(path):
        raise UsageError(f"--prompt-file {shown}: a directory, not a file")


def read_prompt_file(path: os.PathLike | str, limit: int) -> tuple[str, str | None]:
    """The text of a prompt file ("-": stdin), and a warning when not all of it was read: at
    most its last `limit` bytes (the model sees only the end of a long prompt), and from a
    device or pipe at most its first `limit`. One line break at its end, which editors and
    `echo` add, is not part of the prompt (as llama.cpp's --file reads it)."""
    shown = printable(str(path), 300)
    offset, warning = 0, None  # where in the file the bytes read start

    def first_bytes(f: Any) -> bytes:  # of a device or pipe, whose end may never come
        nonlocal warning
        data = f.read(limit + 1)
        if len(data) > limit:
            data = data[:limit]
            warning = f"--prompt-file {shown} is not a plain file; read its first {limit:,} bytes"
        return data

    try:
        if str(path) == "-":
            if sys.stdin is None:
                raise UsageError("--prompt-file -: stdin is closed; give a file, or text on stdin")
            data = first_bytes(sys.stdin.buffer)
        else:
            with open(path, "rb") as f:
                if stat.S_ISREG(os.fstat(f.fileno()).st_mode):  # the file itself, also behind a link
                    size = os.fstat(f.fileno()).st_size
                    f.seek(max(0, size - limit))
                    data = f.read(limit)
                    if size > limit:
                        data = data.lstrip(bytes(range(0x80, 0xC0)))  # start on a whole character
                        warning = (
                            f"--prompt-file {shown} is {size:,} bytes; read its last {len(data):,}, "
                            "more than the model's context holds"
                        )
                    offset = size - len(data)
                else:
                    data = first_bytes(f)
    except OSError as e:
        raise UsageError(f"--prompt-file {shown}: {e.strerror or e}") from None
    data = data.removeprefix(b"\xef\xbb\xbf") if offset == 0 else data  # (a BOM, as Windows editors write)
    whole_end = warning is None or offset > 0  # (the first bytes of a longer pipe end anywhere)
    if whole_end:
        data = data.removesuffix(b"\n").removesuffix(b"\r") if data.endswith(b"\n") else data
    try:
        return data.decode("utf-8"), warning
    except UnicodeDecodeError as e:
        if e.start >= len(data) - 3 and e.reason == "unexpected end of data":  # cut mid-character
            return data[: e.start].decode("utf-8"), warning
        raise UsageError(f"--prompt-file {shown}: not UTF-8 text (byte offset {offset + e.start})") from None


_TYPE_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
               list: "a list", dict: "an object", type(None): "null"}  # fmt: skip


def _is(value: Any, kind: type) -> bool:
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind)


def check_types(data: Mapping[str, Any], schema: Mapping[str, tuple[type, ...]], source: str) -> None:
    """Each key of schema that data has must hold one of the types listed (int excludes
    bool; float accepts integers)."""
    for key, kinds in schema.items():
        if key in data and not any(_is(data[key], k) for k in kinds):
            wanted = " or ".join(_TYPE_NAMES[k] for k in kinds)
            raise UsageError(
                f"{source}: '{key}' must be {wanted}, got {json.dumps(data[key])[:60]}; the file is damaged"
            )
