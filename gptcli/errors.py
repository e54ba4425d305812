"""Domain errors: what went wrong in words a user can act on.

Core modules raise these; the CLI's error boundary turns them into one line on stderr
and an exit code (2 for bad input, 1 for other failures).
"""

from __future__ import annotations

import importlib
import shlex
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


def command(*args: object) -> str:
    """A gptcli command line for the user to paste (in a message or hint), each argument
    shell-quoted: a path with a space stays one argument."""
    return " ".join(["gptcli", *(shlex.quote(str(a)) for a in args)])
