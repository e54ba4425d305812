"""Every file gptcli writes goes through here.

The rules, in one place:
- A file is written whole or not at all: into a temporary file beside it, fsynced, then
  renamed over the target, so a reader (or a crash) sees the old content or the new.
- Nothing is written through a link: temporary files are created exclusively (O_EXCL,
  O_NOFOLLOW), a rename replaces a link rather than the file it points to, and appending
  or locking refuses a path that is a link.
- Nothing is replaced that the user did not ask to replace: `replace=False` refuses an
  existing target (the verbs pass their --force here).
- A full disk is one line naming the path and the space needed, and the temporary file is
  removed; temporary files that dead processes left behind are removed by `clean_stale`.

Temporary names are `.NAME.HOST-PID-RAND.tmp` (directories the same, with a `.tmpdir`
ending), so that a later run can tell whose they were.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import re
import shutil
import stat
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import IO, Any

from gptcli.errors import GptcliError, UsageError

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


@functools.cache
def _host() -> str:
    """This machine's short tag in temporary names (made at first use, not at import, which
    `gptcli --help` waits for: hashlib and socket take about 9 ms of it)."""
    import hashlib
    import socket

    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


# what ran out, by errno, and in the words of libraries that wrap the error (safetensors)
_FULL = {
    errno.ENOSPC: "no space left on the device to write",
    getattr(errno, "EDQUOT", errno.ENOSPC): "the disk quota is reached: no room to write",
    errno.EFBIG: "the file size limit (ulimit -f) is too small to write",
    -1: "the disk is full or the file size limit (ulimit -f) is reached: could not write",  # a short write
}
_SHORT_WRITE = re.compile(r"\d+ requested and \d+ written")  # numpy's words for a write cut short
_FULL_TEXT = {
    "No space left": errno.ENOSPC,
    "StorageFull": errno.ENOSPC,
    "Disk quota exceeded": getattr(errno, "EDQUOT", errno.ENOSPC),
    "File too large": errno.EFBIG,
}
STALE_AFTER = 24 * 3600  # a temporary file of another host is stale after a day


class DiskFull(GptcliError):
    """No space left (or the quota is reached) while writing."""


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _tag() -> str:
    return f"{_host()}-{os.getpid()}-{os.urandom(3).hex()}"


def temp_path(path: Path, suffix: str = ".tmp") -> Path:
    """A name for a temporary file beside path, unique to this process."""
    return path.with_name(f".{path.name}.{_tag()}{suffix}")


def _sizes(n: int | None) -> str:
    if n is None:
        return "more"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def disk_full(
    path: Path, needed: int | None, at_least: bool = False, cause: BaseException | None = None
) -> DiskFull:
    """The one-line error for a full disk (or a reached quota or file size limit, as cause
    says): the path, what it needed (or at least needed, when the whole size is not known),
    and what is free."""
    try:
        free = shutil.disk_usage(path.parent if not path.is_dir() else path).free
        room = f", {_sizes(free)} free"
    except OSError:
        room = ""
    need = f"{'at least ' if at_least and needed else ''}{_sizes(needed)} needed"
    what = _FULL[_full_errno(cause) or errno.ENOSPC]
    fix = "raise the limit" if what.startswith("the file size") else "free some space"
    if what.startswith("the disk is full"):  # (a write cut short: either)
        fix = "free some space or raise the limit"
    return DiskFull(f"{what} {path} ({need}{room}); {fix}, or write somewhere else, and retry")


def _full_errno(e: BaseException | None) -> int | None:
    if e is None:
        return None
    if isinstance(e, OSError) and e.errno is not None:
        return e.errno if e.errno in _FULL else None
    if _SHORT_WRITE.search(str(e)):
        return -1
    return next((code for text, code in _FULL_TEXT.items() if text in str(e)), None)


def is_full(e: BaseException) -> bool:
    """A full disk, a reached quota or file size limit, reported as an OSError or in the
    words of a library that wrapped one."""
    return _full_errno(e) is not None


def _refuse_existing(path: Path, flag: str) -> None:
    if os.path.lexists(path):
        raise UsageError(f"{path} already exists; pass {flag} to replace it, or choose another name")


def check_writable(path: Path, replace: bool, flag: str = "--force") -> None:
    """Fail early, before any work, if writing path would replace a file not meant to be
    replaced, or if its directory is missing. A device, pipe or socket is never replaced
    (--force or not: replacing /dev/null with a file is never what was meant)."""
    try:  # (files sits below data/inputs.py's what_is: its own words for the kinds refused)
        mode = os.lstat(path).st_mode  # (--force replaces a link itself)
    except (FileNotFoundError, NotADirectoryError):
        mode = None
    special = {stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device",
               stat.S_IFIFO: "a named pipe", stat.S_IFSOCK: "a socket"}  # fmt: skip
    if mode is not None and stat.S_IFMT(mode) in special:
        raise UsageError(f"{path} is {special[stat.S_IFMT(mode)]}, not a file; give a file name")
    if os.path.isdir(path) and not os.path.islink(path):  # (never replaced, --force or not)
        raise UsageError(f"{path} is a directory; give a file name")
    if not replace:
        _refuse_existing(path, flag)
    if not path.parent.is_dir():
        check_under_directories(path)
        raise UsageError(f"the directory {path.parent} does not exist; create it first")


def in_the_way(path: str | os.PathLike) -> Path | None:
    """The file a path goes through as if it were a directory (notes.txt in notes.txt/a.html),
    or None: its nearest existing ancestor, when that is not a directory."""
    found = next((p for p in Path(path).parents if p.exists()), None)
    return found if found is not None and not found.is_dir() else None


def check_under_directories(path: Path) -> None:
    """Refuse a path that goes through a file as if it were a directory (notes.txt/a.html),
    naming the file: the OS would say "File exists" or "Not a directory"."""
    blocker = in_the_way(path)
    if blocker is not None:
        raise UsageError(f"{blocker} is a file, not a directory; give a path under a directory")


def fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def open_new(path: Path, mode: int = 0o666) -> IO[bytes]:
    """A new file, created exclusively: never an existing file, never through a link."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, mode)
    return os.fdopen(fd, "wb")


@contextlib.contextmanager
def writing(
    path: str | os.PathLike, *, replace: bool = True, size: int | None = None, flag: str = "--force"
) -> Iterator[IO[bytes]]:
    """A binary file object whose content becomes path's when the block ends without an
    error (atomically); on an error path is untouched and the temporary file is gone.
    replace=False refuses an existing path (flag names the option that allows it); size,
    if known, is reported when the disk is full."""
    path = Path(path)
    if not replace:
        _refuse_existing(path, flag)
    tmp = temp_path(path)
    f = open_new(tmp)
    try:
        with f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        _publish_file(tmp, path, replace, flag)
    except BaseException as e:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if is_full(e):
            raise disk_full(path, size, cause=e) from None
        raise


def _publish_file(tmp: Path, path: Path, replace: bool, flag: str) -> None:
    """Rename tmp to path; without replace, never over a file that appeared meanwhile."""
    if replace:
        os.replace(tmp, path)
    else:
        try:
            os.link(tmp, path, follow_symlinks=False)  # fails if path exists: no replacing
        except FileExistsError:
            _refuse_existing(path, flag)
        except OSError:  # a file system without hard links
            _refuse_existing(path, flag)
            os.replace(tmp, path)
        else:
            os.unlink(tmp)
    fsync_dir(path.parent)


def write_file(
    path: str | os.PathLike, data: bytes | str, *, replace: bool = True, flag: str = "--force"
) -> Path:
    """Write data (text is UTF-8) to path atomically; see `writing`."""
    blob = data.encode("utf-8") if isinstance(data, str) else data
    with writing(path, replace=replace, size=len(blob), flag=flag) as f:
        f.write(blob)
    return Path(path)


@contextlib.contextmanager
def writing_path(path: str | os.PathLike, *, replace: bool = True, size: int | None = None) -> Iterator[Path]:
    """For libraries that write by file name (safetensors, matplotlib): a name inside a
    private directory made for it (nobody else can have placed a link there), whose file
    then replaces path atomically."""
    path = Path(path)
    with new_dir(path.parent / f".{path.name}", publish=False, size=size, target=path) as tmp_dir:
        inner = tmp_dir / path.name
        yield inner
        if not is_regular_file(inner):
            raise GptcliError(f"nothing was written for {path}")
        with open(inner, "rb") as f:
            os.fsync(f.fileno())
        _publish_file(inner, path, replace, "--force")


def save_tensors(
    tensors: dict[str, Any], path: str | os.PathLike, metadata: dict[str, str] | None = None
) -> None:
    """safetensors' save_file into a file that replaces path atomically, with the
    permissions of any other new file (save_file makes them private to the owner, which
    breaks runs on shared storage)."""
    from safetensors.torch import save_file

    size = sum(t.numel() * t.element_size() for t in tensors.values())
    with writing_path(path, size=size) as tmp:
        save_file(tensors, tmp, metadata=metadata)
        fix_permissions(tmp)


def append_line(path: str | os.PathLike, line: str | bytes) -> None:
    """Append one line (text is UTF-8; bytes are kept as they are) to path (created if
    missing), never through a link."""
    path = Path(path)
    fd = _open_no_link(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    blob = line if isinstance(line, bytes) else line.encode("utf-8")
    blob = blob.rstrip(b"\n") + b"\n"
    try:
        with os.fdopen(fd, "ab") as f:
            f.write(blob)
    except OSError as e:
        if is_full(e):
            raise disk_full(path, len(blob), cause=e) from None
        raise


def open_lock_file(path: Path) -> int:
    """A file descriptor for a lock file (created if missing), never through a link."""
    return _open_no_link(path, os.O_RDWR | os.O_CREAT)


def _open_no_link(path: Path, flags: int) -> int:
    try:
        return os.open(path, flags | _NOFOLLOW, 0o666)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise UsageError(
                f"{path} is a symbolic link; gptcli does not write through links: remove it"
            ) from None
        raise


def _fsync_tree(path: Path) -> None:
    for f in path.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    fsync_dir(path)


def _remove(path: Path) -> None:
    """Remove a file, link or directory tree (a link itself, never what it points to)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink(missing_ok=True)
    else:
        shutil.rmtree(path, ignore_errors=True)


def publish_dir(tmp: Path, final: Path) -> None:
    """Move a fully written directory into place: at every moment either final or
    final.old is complete (loaders fall back to .old)."""
    _fsync_tree(tmp)
    old = final.with_name(final.name + ".old")
    if os.path.lexists(final):
        if os.path.lexists(old):
            _remove(old)
        os.rename(final, old)
    os.rename(tmp, final)
    fsync_dir(final.parent)
    if os.path.lexists(old):
        _remove(old)


@contextlib.contextmanager
def new_dir(
    final: Path, *, publish: bool = True, size: int | None = None, target: Path | None = None
) -> Iterator[Path]:
    """A fresh private directory beside final to fill; published as final (see
    publish_dir) when the block ends without an error, removed otherwise. target: what a
    full-disk error names (default final)."""
    tmp = final.with_name(f".{final.name.lstrip('.')}.{_tag()}.tmpdir")
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(final.parent, [final.name.lstrip(".")])  # what a killed process left for the same name
    os.mkdir(tmp, 0o777 & ~_umask())  # exclusive: fails on anything already there, links included
    try:
        yield tmp
        if publish:
            publish_dir(tmp, final)
    except BaseException as e:
        _remove(tmp)
        if is_full(e):
            raise disk_full(target or final, size, cause=e) from None
        raise
    else:
        if not publish:
            _remove(tmp)


def link_or_copy(src: Path, dst: Path) -> None:
    """dst as a hard link to src (published files are never modified in place), or a copy."""
    try:
        os.link(src, dst, follow_symlinks=False)
    except OSError:
        shutil.copyfile(src, dst, follow_symlinks=False)


def fix_permissions(path: Path) -> None:
    """The permissions of any other new file (some writers make files private). Only for
    files in a directory gptcli has just made, where no link can be."""
    os.chmod(path, 0o666 & ~_umask())


# --- what dead processes left behind ---------------------------------------------------

# this version's names, and the names earlier versions used:
# .NAME.HOST-PID-RAND.tmp[dir], .NAME.PID.tmp, .NAME.PID-RAND.tmp, .NAME.tmp-PID (directories)
_TEMP = re.compile(
    r"^\.(?P<name>.+?)\.(?:(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-[0-9a-f]+\.(?P<kind>tmp|tmpdir)"
    r"|(?P<old_pid>\d+)(?:-[0-9a-f]+)?\.tmp|tmp-(?P<old_dir_pid>\d+))$"
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_stale(entry: Path, names: Collection[str]) -> bool:
    """Whether entry is a temporary file or directory that gptcli made for one of names (the
    files it writes there) in a process that is gone."""
    m = _TEMP.match(entry.name)
    if m is None or m["name"] not in names:
        return False
    is_dir = m["kind"] == "tmpdir" or m["old_dir_pid"] is not None
    try:
        if stat.S_ISDIR(entry.lstat().st_mode) != is_dir:
            return False
    except OSError:
        return False
    pid = int(m["pid"] or m["old_pid"] or m["old_dir_pid"])
    if m["host"] is not None and m["host"] != _host():
        try:
            return time.time() - entry.lstat().st_mtime > STALE_AFTER
        except OSError:
            return False
    return pid != os.getpid() and not _alive(pid)


def clean_stale(directory: Path, names: Collection[str]) -> list[Path]:
    """Remove what dead processes left in directory while writing one of names: temporary
    files, and temporary directories (of checkpoints). Nothing else is touched, whatever
    its name."""
    removed = []
    try:
        entries = list(directory.iterdir())
    except OSError:
        return removed
    for entry in entries:
        if is_stale(entry, names):
            _remove(entry)
            removed.append(entry)
    return removed


def is_regular_file(path: Path) -> bool:
    """A plain file (not a link, device, pipe or directory)."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False
