"""Building the CPU decoding kernel (decode.c) into a shared library, in a process of its own.

gptcli/infer/kernels.py runs this module's main in a process of its own (a session of its
own, this gptcli first on its path) and waits for it in a background thread: a command
that ends before the build does (a short `sample`, Ctrl-C) leaves the build running, and
the next command finds the library. Where no Python can be started (an embedded or frozen
interpreter) the same build runs in that thread. The compiler writes into
a private directory whose file then replaces the library's name atomically
(gptcli.files.writing_path), so a reader never sees half a library, and an interrupted
build leaves nothing under that name.

It imports only the standard library and gptcli.files, so that it starts in a tenth of a
second (not torch's second).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

COMPILE_TIMEOUT_S = 300.0  # a compiler that hangs (a wrapper waiting on a license, a network disk): given up


def failure_record(path: Path) -> Path:
    """Where a build that the compiler refused says why, beside the library it did not make:
    the next command says so instead of building again (the same source, compiler and flags
    fail the same way); deleting it tries again."""
    return path.with_name(path.name + ".failed")


NOT_LOADED = "built, but did not load: "  # how a record of a library that did not load begins

# what a compiler says when the machine, not the source, failed it: not recorded, the next
# command tries again (a full disk, a compiler killed for memory)
TRANSIENT = (
    "no space left on device",
    "disk quota exceeded",
    "cannot allocate memory",
    "out of memory",
    "killed signal",
    "resource temporarily unavailable",
)


def digest(text: bytes) -> str:
    """The source's fingerprint, which the build checks before compiling the text it read."""
    return hashlib.sha256(text).hexdigest()


def why_not(errors: str, fallback: str) -> str:
    """The compiler's line that says why: its first error (the next ones follow from it, and
    its last line is often only "compilation terminated."), else its last line."""
    lines = errors.strip().splitlines()
    first = next((line for line in lines if "error" in line.lower()), None)
    return first or (lines[-1] if lines else fallback)


def refused(path: Path) -> str | None:
    """The compiler's error from an earlier build of the library at path, or None."""
    from gptcli import files

    record = failure_record(path)
    if not files.is_regular_file(record):
        return None
    lines = record.read_text(errors="replace").strip().splitlines()
    return lines[0] if lines else "failed"


def build(
    compiler: str, source: Path, path: Path, attempts: list[list[str]], expect: str | None = None
) -> None:
    """Compile source into the library at path with the first set of flags that builds;
    OSError with the compiler's first error when none does (also written to
    failure_record(path), unless the machine rather than the source failed it: TRANSIENT, a
    compiler killed by a signal). expect: digest() of the source the library's name was
    made from; the text compiled is a copy of the source read once and checked against it
    (a source changed meanwhile, by an update, is not built under the old one's name)."""
    from gptcli import files

    path.parent.mkdir(parents=True, exist_ok=True)
    record = failure_record(path)
    files.clean_stale(path.parent, [path.name, record.name])  # what a killed build left
    text = source.read_bytes()
    if expect is not None and digest(text) != expect:  # (not recorded: the next command builds the new one)
        raise OSError(f"{source.name} changed while its library was being built")

    def refuse(why: str) -> OSError:  # recorded: the same build fails the same way next time
        with contextlib.suppress(OSError):
            files.write_file(record, why + "\n")
        return OSError(why)

    with files.writing_path(path) as tmp:
        copy = tmp.parent / source.name  # (in the build's private directory, removed with it)
        copy.write_bytes(text)
        for flags in attempts:
            try:
                done = subprocess.run(
                    [*shlex.split(compiler), *flags, str(copy), "-o", str(tmp), "-lm"],
                    capture_output=True,
                    text=True,
                    check=False,
                    timeout=COMPILE_TIMEOUT_S,
                )
            except subprocess.TimeoutExpired:  # (not recorded as failed: the next command tries again)
                raise OSError(f"{compiler} did not finish in {COMPILE_TIMEOUT_S:.0f} s") from None
            if done.returncode == 0:
                break
        else:
            errors = done.stderr.replace(f"{copy.parent}{os.sep}", "")  # (the copy's name, as the source's)
            why = why_not(errors, f"{compiler} ended with {done.returncode}")
            if done.returncode < 0 or any(sign in errors.lower() for sign in TRANSIENT):
                raise OSError(why)  # (not recorded: the next command tries again)
            raise refuse(why)
        if not files.is_regular_file(tmp):
            raise refuse(f"{compiler} ended with 0 but wrote no library")
    try:  # here, so that a command that ends first still leaves the verdict (a disk mounted noexec)
        ctypes.CDLL(str(path))
    except OSError as e:
        raise refuse(NOT_LOADED + " ".join(str(e).split())) from None


def request(
    compiler: str, source: Path, path: Path, attempts: list[list[str]], expect: str | None = None
) -> str:
    """The one argument of the build process (JSON)."""
    return json.dumps(
        {
            "compiler": compiler,
            "source": str(source),
            "path": str(path),
            "attempts": attempts,
            "expect": expect,
        }
    )


def build_request(text: str) -> None:
    """The build a request (JSON, as `request` writes it) asks for."""
    r = json.loads(text)
    build(r["compiler"], Path(r["source"]), Path(r["path"]), r["attempts"], r.get("expect"))


def main(argv: list[str]) -> int:
    try:
        build_request(argv[0])
    except Exception as e:  # one line for the process that waits (not the user's: it says why)
        with contextlib.suppress(OSError):  # (nobody reading any more)
            sys.stderr.write((str(e).replace("\n", " ") or type(e).__name__) + "\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
