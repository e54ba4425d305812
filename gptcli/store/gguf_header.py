"""A GGUF file's header, read in one checked pass: its keys and values, and where each
tensor's bytes are.

A GGUF file is untrusted input: every length, count, dimension and offset is checked
against the bytes the file has before anything is allocated from it (a few bytes claiming an
array of 10^18 items, or a tensor of 10^10 rows, stop here). The `gguf` package's own reader
does the same work value by value through numpy views, which takes seconds for GPT-2's
100,000 token and merge strings; this pass takes a tenth of one. Tensor data stays in the
file, mapped read-only, until a tensor is read.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gptcli.errors import UsageError

STRING, ARRAY = 8, 9  # GGUF's value types with a length
INTEGERS = (0, 1, 2, 3, 4, 5, 10, 11)
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
MAX_TENSORS, MAX_KV = 1 << 14, 1 << 12  # GPT-2 XL has 580 tensors; the converter writes ~30 keys
MIN_TENSOR_INFO, MIN_KV = 8 + 4 + 8 + 4 + 8, 8 + 4 + 1  # the bytes each takes in the header, at least
HEADER_LIMIT = 1 << 28  # the header is small: tokens and merges, some MB
MAX_ITEMS = 1 << 22  # an array's items: GPT-2 has 50,257 tokens and 50,000 merges


@dataclass
class Field:
    """One key's value: kind is GGUF's value type; value a number, the bytes of a string, or
    for an array (kind 9) of `item`-typed values a list (of bytes, for strings) or a numpy array."""

    kind: int
    value: Any
    item: int | None = None

    def items(self) -> list[Any] | np.ndarray:
        """An array's values; [] for any other kind."""
        return self.value if self.kind == ARRAY else []

    def text(self) -> str:
        """A string's value; "" for a value that is not a string of UTF-8."""
        if self.kind != STRING:
            return ""
        try:
            return self.value.decode("utf-8")
        except UnicodeDecodeError:
            return ""


@dataclass
class Tensor:
    """A tensor's description: shape in GGUF's order (innermost first), type (ggml's), and
    offset of its bytes from the start of the data."""

    name: str
    shape: tuple[int, ...]
    tensor_type: int
    offset: int


@dataclass
class Header:
    path: Path
    size: int  # the file's bytes
    fields: dict[str, Field] = field(default_factory=dict)
    tensors: list[Tensor] = field(default_factory=list)
    data_start: int = 0

    def data(self, t: Tensor, nbytes: int) -> np.ndarray:
        """Up to nbytes of t's data (uint8, read-only, mapped from the file): fewer where the
        file ends first, which the caller checks against what the tensor's shape needs."""
        start = self.data_start + t.offset
        n = max(0, min(nbytes, self.size - start))
        if n == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(self.path, dtype=np.uint8, mode="r", offset=start, shape=(n,))


def read_header(path: Path) -> Header:
    """The header of the GGUF file at path, every value checked against the file's size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(min(size, HEADER_LIMIT))
    end = len(raw)

    def damaged(what: str) -> UsageError:
        return UsageError(f"{path}: {what}; the file is damaged")

    def take(at: int, fmt: str) -> tuple[Any, int]:
        n = struct.calcsize(fmt)
        if at + n > end:
            raise damaged("its header runs past the end of the file")
        return struct.unpack_from(fmt, raw, at)[0], at + n

    def string(at: int) -> tuple[bytes, int]:
        n, at = take(at, "<Q")
        if n > end - at:
            raise damaged(f"a string of {n} bytes is longer than the file")
        return raw[at : at + n], at + n

    def name(at: int, what: str) -> tuple[str, int]:
        b, at = string(at)
        try:
            return b.decode("utf-8"), at
        except UnicodeDecodeError:
            raise damaged(f"a {what} name is not UTF-8") from None

    if end < 24 or raw[:4] != b"GGUF":
        raise UsageError(f"{path}: not a GGUF file (no GGUF header)")
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", raw, 4)
    if version not in (2, 3):
        raise UsageError(f"{path}: GGUF version {version}; gptcli reads versions 2 and 3")
    if n_tensors > MAX_TENSORS or n_kv > MAX_KV or 24 + n_tensors * MIN_TENSOR_INFO + n_kv * MIN_KV > size:
        raise UsageError(
            f"{path}: its header claims {n_tensors} tensors and {n_kv} keys, more than a file of "
            f"{size} bytes can hold; the file is damaged"
        )
    header = Header(path, size)
    at = 24
    for _ in range(n_kv):
        key, at = name(at, "key")
        kind, at = take(at, "<I")
        if kind == STRING:
            value, at = string(at)
            found = Field(kind, value)
        elif kind == ARRAY:
            item, at = take(at, "<I")
            count, at = take(at, "<Q")
            if count > MAX_ITEMS:
                raise damaged(f"an array claims {count} items")
            if item == STRING:
                if count * 8 > end - at:
                    raise damaged(f"an array claims {count} strings")
                strings = []
                for _ in range(count):  # (string() inlined: 100,000 of them in GPT-2's vocabulary)
                    if at + 8 > end:
                        raise damaged("its header runs past the end of the file")
                    n = struct.unpack_from("<Q", raw, at)[0]
                    if n > end - at - 8:
                        raise damaged(f"a string of {n} bytes is longer than the file")
                    strings.append(raw[at + 8 : at + 8 + n])
                    at += 8 + n
                found = Field(kind, strings, item)
            elif item in SCALARS:
                width = struct.calcsize(SCALARS[item])
                if count * width > end - at:
                    raise damaged(f"an array claims {count} values")
                dtype = np.dtype("<" + SCALARS[item])
                found = Field(kind, np.frombuffer(raw, dtype=dtype, count=count, offset=at).copy(), item)
                at += count * width
            else:
                raise damaged(f"an array of value type {item}")
        elif kind in SCALARS:
            value, at = take(at, "<" + SCALARS[kind])
            found = Field(kind, value)
        else:
            raise damaged(f"a key of value type {kind}")
        if key in header.fields:
            raise damaged(f"the key {key} appears twice")
        header.fields[key] = found
    for _ in range(n_tensors):
        tname, at = name(at, "tensor")
        n_dims, at = take(at, "<I")
        if not 1 <= n_dims <= 4:
            raise damaged(f"a tensor of {n_dims} dimensions")
        dims = []
        for _ in range(n_dims):
            dim, at = take(at, "<Q")
            dims.append(dim)
        values = math.prod(dims)  # (Python's integers: no overflow)
        if values > size * 4:  # at most about 4 values a byte (q8_0: 32 in 34)
            raise damaged(f"a tensor of {values} values is larger than the file")
        kind, at = take(at, "<I")
        offset, at = take(at, "<Q")
        header.tensors.append(Tensor(tname, tuple(dims), kind, offset))
    alignment = header.fields.get("general.alignment")
    if alignment is not None and alignment.kind not in INTEGERS:
        raise damaged("its alignment is not a whole number")
    align = 32 if alignment is None else alignment.value
    if align < 1 or align & (align - 1):
        raise damaged(f"an alignment of {align}")
    if any(t.offset % align for t in header.tensors):
        raise damaged(f"a tensor's data is not aligned to {align} bytes")
    header.data_start = (at + align - 1) // align * align
    return header
