"""The two consoles (results on stdout, everything else on stderr), the one-line
messages, JSON output, progress bars, and the number formats the views share.

Output that is not a terminal gets plain text without colours or live widgets; under
torchrun only rank 0 talks (errors excepted).
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.text import Text

from gptcli import reports
from gptcli.messages import one_line, printable


class Stream(io.TextIOBase):
    """sys.stdout or sys.stderr (whichever it is at the time of writing), made safe for a
    long run: characters the stream's encoding cannot show become "?", and once the reader
    has gone (`gptcli pretrain | head`, a closed terminal), a training carries on to its
    end and saves its checkpoints, dropping what it would print (carry_on); other verbs
    just stop, quietly, as `head` meant."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lost = False
        self.carry_on = False  # on a lost reader: False stops the command (quietly), True drops output

    @property
    def target(self) -> Any:
        stream = getattr(sys, self.name)
        # Rich's live display swaps in a proxy that prints through the console, which
        # prints here: write to the stream it proxies, not round in a circle
        return getattr(stream, "rich_proxied_file", stream)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        try:
            return not self.lost and self.target.isatty()
        except (ValueError, OSError):
            return False

    def fileno(self) -> int:
        return self.target.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                try:
                    self.target.write(text)
                except UnicodeEncodeError:
                    self.target.write(text.encode(self.encoding, "replace").decode(self.encoding))
            except (OSError, ValueError) as e:
                self._gone(e)
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.target.flush()
            except (OSError, ValueError) as e:
                self._gone(e)

    def _gone(self, e: BaseException) -> None:
        if isinstance(e, OSError) and e.errno not in (errno.EPIPE, errno.EIO, errno.ECONNRESET):
            raise e
        if isinstance(e, ValueError) and "closed file" not in str(e):
            raise e
        self.lost = True
        # Python flushes the stream once more at exit: point it at /dev/null, so that last
        # flush has nowhere to fail
        with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.target.fileno())
            os.close(devnull)
        if not self.carry_on:
            raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")
        if self.name == "stdout":
            warning("the output was closed (its reader went away); training carries on without printing")


def carry_on_without_output() -> None:
    """From now on, a closed stdout or stderr drops output instead of stopping the command
    (for training, whose checkpoints matter more than its progress lines)."""
    STDOUT.carry_on = STDERR.carry_on = True


# under torchrun only rank 0 talks (errors excepted); every process runs this same CLI
_QUIET = os.environ.get("RANK", "0") != "0"
STDOUT, STDERR = Stream("stdout"), Stream("stderr")
MESSAGE_LIMIT = 2000  # characters of one error, warning or info line (a 1 MB path is cut)


class _Console(Console):
    """A Console that shows every plain string it draws through outside.printable: what
    came from outside (a file name, a label, generated text) never moves the cursor,
    retitles or clears the terminal. Text objects are built from printable strings by
    the render modules (`text` below)."""

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(printable(text), **kwargs)


out = _Console(file=STDOUT, highlight=False, quiet=_QUIET)
err = _Console(file=STDERR, highlight=False)


def fits(width: int) -> bool:
    """Whether a view of this many columns can be drawn whole: always in a file or a pipe
    (see wide), at a terminal only if it is that wide."""
    return not out.is_terminal or width <= out.width


def wide(width: int) -> Console:
    """The console to draw a view of `width` columns on: the terminal's, or for output that
    is not a terminal (a file or a pipe has no width to fit, where Rich would assume 80 and
    cut a map's rows) one as wide as the view."""
    if out.is_terminal or width <= out.width:
        return out
    return _Console(file=out.file, width=width, highlight=False, quiet=out.quiet, color_system=None)


def text(value: str, style: str = "", limit: int | None = None) -> Text:
    """A Rich Text of a string that may have come from outside: escaped (and cut to limit)."""
    return Text(printable(value, limit), style=style)


# --- messages ------------------------------------------------------------------------------


def error(message: str) -> None:
    """One line on stderr: what is wrong and what to do."""
    err.print(Text.assemble(("error: ", "bold red"), one_line(message, MESSAGE_LIMIT)), soft_wrap=True)


def warning(message: str) -> None:
    if not _QUIET:
        err.print(
            Text.assemble(("warning: ", "bold yellow"), one_line(message, MESSAGE_LIMIT)), soft_wrap=True
        )


def info(message: str) -> None:
    if not _QUIET:
        err.print(Text(one_line(message, MESSAGE_LIMIT), style="dim"), soft_wrap=True)


def note(message: str) -> None:
    """A side remark for people at a terminal (where it runs, why); silent in pipes and logs."""
    if err.is_terminal:
        info(message)


class Notes(reports.Notes):
    """What setting up a run says (gptcli.train.recipes), on stderr: info and warnings always,
    notes and progress bars at a terminal only."""

    def info(self, text: str) -> None:
        info(text)

    def note(self, text: str) -> None:
        note(text)

    def warning(self, text: str) -> None:
        warning(text)

    @contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[int, int], None]]:
        with byte_progress(description, total, show=total > 4 << 20) as update:
            yield update


# what json.dumps(ensure_ascii=False) leaves raw and a terminal may act on (DEL, C1, the
# bidi controls) or cannot write (lone surrogates): written as \uXXXX escapes, which parse
# back to the very same string
_JSON_RAW = re.compile("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def print_json(obj: Any) -> None:
    """Machine-readable output: one JSON document on stdout (from rank 0 only under torchrun).
    Only escapes differ from json.dumps: the data parses back unchanged."""
    if _QUIET:
        return
    doc = _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(obj, ensure_ascii=False))
    STDOUT.write(doc + "\n")
    STDOUT.flush()


@contextmanager
def byte_progress(description: str, total: int, show: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A progress bar over bytes on stderr (only in a terminal); yields update(done, total)."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    description = escape(printable(description, 200))  # a file name is shown, never read as markup
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not (show and err.is_terminal),
    )
    task = progress.add_task(description, total=total)
    with progress:
        yield lambda done, total: progress.update(task, completed=done, total=total)


@contextmanager
def count_progress(description: str, total: int | None = None) -> Iterator[Callable[[int, int], None]]:
    """A progress bar over items (windows, examples) on stderr, only in a terminal;
    yields update(done, total)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    description = escape(printable(description, 200))
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not err.is_terminal,
    )
    task = progress.add_task(description, total=total)
    with progress:
        yield lambda done, total: progress.update(task, completed=done, total=total)


def duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def fmt(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)
