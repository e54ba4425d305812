"""Domain errors: what went wrong in words a user can act on.

Core modules raise these; the CLI's error boundary turns them into one line on stderr
and an exit code (2 for bad input, 1 for other failures).
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import Iterator
from typing import Any


class GptcliError(Exception):
    """An error the user can fix; `str(err)` is the whole message."""

    exit_code = 1


class UsageError(GptcliError):
    """Bad input: a missing file, a wrong flag value, an incompatible checkpoint, ..."""

    exit_code = 2


def need(module: str, extra: str, what: str) -> Any:
    """Import an optional dependency, or say in one line which gptcli extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise UsageError(f"{what} needs {module.split('.')[0]}: pip install 'gptcli[{extra}]'") from None


@contextlib.contextmanager
def doing(what: str) -> Iterator[None]:
    """Name what gptcli is doing in the block ('reading corpus.txt.gz', 'saving runs/x/last'),
    for the one line an error nobody foresaw ends in: an exception that leaves the block
    carries it (the innermost block names it), GptcliErrors say what they need themselves."""
    try:
        yield
    except GptcliError:
        raise
    except BaseException as e:
        if getattr(e, "gptcli_doing", None) is None:
            with contextlib.suppress(AttributeError, TypeError):
                e.gptcli_doing = what  # type: ignore[attr-defined]
        raise


# "SafetensorError: ", "Error -3 ...": the class names and codes libraries put first
_CLASS_PREFIX = re.compile(r"^(\w+\.)*[A-Z]\w*(Error|Exception|Panic\w*)\b:?\s*")


def reason(e: BaseException) -> str:
    """An exception's own words for a message: its first line, without the class names and
    codes libraries put first (a missing key is named as such)."""
    if isinstance(e, KeyError) and e.args:
        return f"no {e.args[0]!r}"
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    words = _CLASS_PREFIX.sub("", lines[0] if lines else "")
    if words.endswith(":") and len(lines) > 1:  # ("backend='inductor' raised:", then the error)
        words = f"{words} {_CLASS_PREFIX.sub('', lines[1]) or lines[1]}"
    return words[:300] or "no reason given"


def unforeseen(e: BaseException, verb: str | None) -> str:
    """The one line for an error gptcli has no message for: what it was doing (see doing)
    and with which file, and the error's own words without a class name."""
    what = getattr(e, "gptcli_doing", None) or (f"gptcli {verb}" if verb else "gptcli")
    return (
        f"{what} failed unexpectedly: {reason(e)} (this may be a bug: run again with --debug to see "
        "where, and report it)"
    )


def compiler_failed(e: BaseException) -> str | None:
    """The one line for torch.compile's backend failing (torch._dynamo's BackendCompilerFailed),
    else None: most often its cache, damaged by a process stopped while it wrote a compiled
    library there ('file too short'), which then fails every later run."""
    if type(e).__name__ != "BackendCompilerFailed":
        return None
    inner = getattr(e, "inner_exception", None) or e
    utils = sys.modules.get("torch._inductor.runtime.cache_dir_utils")
    cache = utils.cache_dir() if utils is not None else "torch's TORCHINDUCTOR_CACHE_DIR"
    return (
        f"torch's compiler failed ({reason(inner)}); if its cache was damaged (a run stopped while "
        f"compiling), delete {cache} and run again; --no-compile runs without it"
    )
