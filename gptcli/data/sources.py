"""Reading text as users keep it: plain text, JSONL documents, either of them compressed
(.gz, .zst), and Parquet shards (FineWeb's, nanochat's), streamed, never read whole.

A document is a whole plain-text file, one line of a JSONL file ({"text": ...}), or one
row of a Parquet file (its --text-column). Every reader checks UTF-8 and names the file,
line or row of what it cannot read. zstandard and pyarrow are optional extras.
"""

from __future__ import annotations

import codecs
import io
import json
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gptcli.errors import UsageError, doing, need
from gptcli.messages import printable

READ_BYTES = 1 << 20  # bytes read per step while streaming a file
PARQUET_ROWS = 1024  # rows read per batch from a Parquet file
ZSTD_SLICE = 512  # compressed bytes decompressed at a time: at most 16 MiB out (see _Zstd)
COMPRESSED = (".gz", ".zst")

OnBytes = Callable[[int], None]


def _decode_error(path: Path, offset: int, reason: str) -> UsageError:
    return UsageError(
        f"{path}: {reason} at byte offset {offset}; the file must be UTF-8 text "
        f"(convert it, e.g. iconv -f latin1 -t utf-8, or remove the file)"
    )


class _Counting(io.RawIOBase):
    """A file's bytes as read, reported to on_bytes (the progress of a compressed file is
    its compressed bytes)."""

    def __init__(self, f: IO[bytes], on_bytes: OnBytes | None) -> None:
        self.f, self.on_bytes = f, on_bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self.f.readinto(buffer)
        if n and self.on_bytes is not None:
            self.on_bytes(n)
        return n or 0


def _decompressed(path: Path, raw: IO[bytes]) -> IO[bytes]:
    suffix = path.suffix.lower()
    if suffix == ".gz":
        try:  # the gzip extra: ISA-L decompresses about 3x faster, so a .gz corpus tokenizes
            from isal.igzip import IGzipFile  # at plain text's pace (same bytes, same errors)
        except ImportError:
            from gzip import GzipFile as IGzipFile
        return IGzipFile(fileobj=raw, mode="rb")
    if suffix == ".zst":
        zstd = need("zstandard", "zstd", f"{path} (zstd)")
        return io.BufferedReader(_Zstd(zstd.ZstdDecompressor(), raw), READ_BYTES)
    return raw


class _Zstd(io.RawIOBase):
    """The text of a zstd file of one frame or more. One that ends inside a frame raises
    EOFError, as gzip does: zstandard's stream_reader ends there without a word, and the
    corpus would be cut short in silence. Its decompressobj gives all a piece of input
    holds at once, and a zstd block of 4 bytes may hold 128 KiB: fed ZSTD_SLICE bytes at a
    time, it never holds more than 16 MiB (a 270 KB file of one repeated line may hold GBs)."""

    def __init__(self, decompressor: Any, raw: IO[bytes]) -> None:
        self.decompressor, self.raw = decompressor, raw
        self.frame = decompressor.decompressobj()
        self.inside = False  # whether the current frame has begun
        self.input, self.used = b"", 0  # compressed bytes read, and how many were fed
        self.pending, self.at = memoryview(b""), 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self.at == len(self.pending):
            if self.used == len(self.input):
                self.input, self.used = self.raw.read(READ_BYTES), 0
                if not self.input:
                    if self.inside:
                        raise EOFError("it ends inside a frame")
                    return 0
            piece = self.input[self.used : self.used + ZSTD_SLICE]
            self.used += len(piece)
            self.pending, self.at = memoryview(self._decompress(piece)), 0
        n = min(len(buffer), len(self.pending) - self.at)
        buffer[:n] = self.pending[self.at : self.at + n]
        self.at += n
        return n

    def _decompress(self, piece: bytes) -> bytes:
        out = []
        while piece:
            self.inside = True
            out.append(self.frame.decompress(piece))
            if not self.frame.eof:
                break
            piece = self.frame.unused_data  # the next frame's start, if any
            self.frame, self.inside = self.decompressor.decompressobj(), False
        return b"".join(out)


def _compression_error(path: Path, e: Exception) -> UsageError | None:
    """A one-line error for a damaged or mislabelled compressed file, else None."""
    import gzip
    import zlib

    kind = {".gz": "gzip", ".zst": "zstd"}.get(path.suffix.lower())
    if kind is None:
        return None
    if isinstance(e, (gzip.BadGzipFile, EOFError)):
        return UsageError(f"{path}: not a complete {kind} file ({e or 'it ends too early'}); check the file")
    isal_error = getattr(sys.modules.get("isal.isal_zlib"), "error", ())
    zstd_error = getattr(sys.modules.get("zstandard"), "ZstdError", ())
    if (
        isinstance(e, zlib.error)
        or (isal_error and isinstance(e, isal_error))
        or (zstd_error and isinstance(e, zstd_error))
    ):
        # zlib says "Error -3 while decompressing data: invalid distance too far back", ISA-L
        # "Error -3 Invalid lookback distance found": keep what went wrong
        why = re.sub(r"^(error )?-?\d* ?(while decompressing data: )?", "", str(e), flags=re.I) or "damaged"
        return UsageError(
            f"{path}: the {kind} data is damaged ({why.strip()}); the file is corrupt: download or "
            "compress it again"
        )
    return None


def iter_file_text(path: Path, on_bytes: OnBytes | None = None) -> Iterator[str]:
    """Stream a file's text in pieces (decompressed if it ends in .gz or .zst), failing on
    bytes that are not UTF-8 text; on_bytes hears the bytes read from disk."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    offset = 0  # bytes of text handed to the decoder so far
    with doing(f"reading {printable(str(path), 300)}"), open(path, "rb", buffering=0) as f:
        stream = _decompressed(path, _Counting(f, on_bytes))
        while True:
            try:
                block = stream.read(READ_BYTES)
            except Exception as e:
                err = _compression_error(path, e)
                if err is None:
                    raise
                raise err from None
            final = not block
            nul = block.find(b"\0")
            if nul >= 0:
                raise _decode_error(path, offset + nul, "NUL byte (binary data)")
            try:
                text = decoder.decode(block, final=final)
            except UnicodeDecodeError as e:
                pending = len(e.object) - len(block)  # bytes held over from the last block
                raise _decode_error(path, offset - pending + e.start, "invalid UTF-8") from None
            offset += len(block)
            if text:
                yield text
            if final:
                return


def _iter_lines(pieces: Iterator[str]) -> Iterator[str]:
    buf = ""
    for piece in pieces:
        buf += piece
        *lines, buf = buf.split("\n")
        yield from lines
    if buf:
        yield buf


def iter_jsonl(path: Path, shape: str, on_bytes: OnBytes | None = None) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line of a JSONL file (compressed or not);
    `shape` describes a valid line for the error message."""
    for lineno, line in enumerate(_iter_lines(iter_file_text(path, on_bytes)), 1):
        if lineno == 1:
            line = line.removeprefix(BOM)
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise UsageError(
                f"{path}:{lineno}: not valid JSON ({getattr(e, 'msg', e)}); each line must be {shape}"
            ) from None
        except RecursionError:
            raise UsageError(f"{path}:{lineno}: JSON nested too deeply; each line must be {shape}") from None
        if not isinstance(obj, dict):
            raise UsageError(
                f"{path}:{lineno}: {type(obj).__name__}, not an object; each line must be {shape}"
            )
        bad = _surrogate(obj)
        if bad is not None:
            raise UsageError(
                f"{path}:{lineno}: the text holds {bad}, which is not a character (a lone surrogate "
                "escape); pass UTF-8 text"
            )
        yield lineno, obj


_SURROGATES = re.compile("[\ud800-\udfff]")
BOM = "\ufeff"  # a byte-order mark, which Excel's "CSV UTF-8" and some editors put first


def _surrogate(obj: Any) -> str | None:
    """The first lone surrogate (JSON's "\\ud800", which no UTF-8 text holds) in the strings
    of a parsed record, escaped for a message; None if there is none."""
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            found = _SURROGATES.search(item)
            if found is not None:
                return f"'\\u{ord(found.group()):04x}'"
        elif isinstance(item, dict):
            stack += [*item.keys(), *item.values()]
        elif isinstance(item, list):
            stack += item
    return None


def kind_of(path: Path) -> str:
    """parquet, jsonl or text, by the name once a .gz or .zst ending is set aside."""
    name = path.name.lower()
    for suffix in COMPRESSED:
        name = name.removesuffix(suffix)
    if name.endswith(".parquet"):
        return "parquet"
    return "jsonl" if name.endswith(".jsonl") else "text"


@dataclass(frozen=True)
class Reader:
    """How documents are read from files: which Parquet column holds the text."""

    text_column: str = "text"

    def documents(self, path: Path, on_bytes: OnBytes | None = None) -> Iterator[Iterator[str]]:
        """The documents of one file, each a stream of text pieces (consume them in order)."""
        kind = kind_of(path)
        if kind == "parquet":
            yield from self._parquet(path, on_bytes)
        elif kind == "jsonl":
            shape = '{"text": "..."}'
            for lineno, obj in iter_jsonl(path, shape, on_bytes):
                if not isinstance(obj.get("text"), str):
                    raise UsageError(f'{path}:{lineno}: no "text" string; each line must be {shape}')
                yield iter([obj["text"]])
        else:
            yield iter_file_text(path, on_bytes)

    def _parquet(self, path: Path, on_bytes: OnBytes | None) -> Iterator[Iterator[str]]:
        """One document per row of the text column, read a batch of rows at a time."""
        pq = need("pyarrow.parquet", "parquet", f"{path} (Parquet)")
        import pyarrow as pa

        try:
            f = pq.ParquetFile(path)
        except (pa.ArrowException, OSError) as e:
            raise UsageError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
        names = f.schema_arrow.names
        if self.text_column not in names:
            raise UsageError(
                f"{path}: no column '{self.text_column}' (it has {', '.join(names)}); "
                "choose one with --text-column"
            )
        size, rows, row = path.stat().st_size, max(1, f.metadata.num_rows), 0
        reported = 0
        for batch in f.iter_batches(batch_size=PARQUET_ROWS, columns=[self.text_column]):
            for value in batch.column(0).to_pylist():
                row += 1
                if not isinstance(value, str):
                    what = "null" if value is None else f"not a string ({type(value).__name__})"
                    raise UsageError(f"{path}:row {row}: '{self.text_column}' is {what}")
                yield iter([value])
            if on_bytes is not None:  # progress: the file's size, spread over its rows
                now = size * row // rows
                on_bytes(now - reported)
                reported = now


def iter_documents(path: Path, on_bytes: OnBytes | None = None) -> Iterator[Iterator[str]]:
    """The documents of one file with the default reader (Parquet column "text")."""
    return Reader().documents(path, on_bytes)
