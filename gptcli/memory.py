"""Large CPU buffers that the decoding step streams every token (the KV cache, the packed
weights) on transparent huge pages, where Linux gives them on request.

A decoding step reads hundreds of MB; in 4 KB pages that is tens of thousands of TLB misses,
and the CPU's prefetchers stop at every page's end. Most Linux systems hand out 2 MB pages
only to memory that asks for them (/sys/kernel/mm/transparent_hugepage/enabled:
`madvise`), so `empty` asks, before the memory is first touched (GPT-2 124M in bf16 on a
Zen 5, 200 decoding steps: one row 1.03x the steps/s, 16 rows 1.02x; the decoding step
alone in C, 16 rows: 1.05x). Elsewhere (no such call, another OS, another device) it is
torch.empty.
"""

from __future__ import annotations

import ctypes
import sys

import torch

HUGE_PAGE = 2 << 20
_MADV_HUGEPAGE = 14  # from Linux's mman-common.h


def _madvise() -> ctypes._CFuncPtr | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        call = ctypes.CDLL(None).madvise
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    call.restype = ctypes.c_int
    return call


_MADVISE = _madvise()


def advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask for huge pages for the whole 2 MB pages inside t's memory (CPU); whether asked.
    Memory already touched keeps its pages until the kernel merges them."""
    if _MADVISE is None or t.device.type != "cpu":
        return False
    start = -(-t.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (t.data_ptr() + t.untyped_storage().nbytes()) // HUGE_PAGE * HUGE_PAGE
    return end > start and _MADVISE(start, end - start, _MADV_HUGEPAGE) == 0


def empty(
    shape: int | tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """torch.empty, on huge pages where it is large and on a CPU that offers them."""
    t = torch.empty(shape, dtype=dtype, device=device)
    if t.untyped_storage().nbytes() >= 2 * HUGE_PAGE:
        advise_huge_pages(t)
    return t
