"""Large CPU buffers the decoding step streams (gptcli/memory.py) ask Linux for huge pages."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import torch

from gptcli import memory
from gptcli.config import ModelConfig
from gptcli.model import KVCache

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/sys/kernel/mm/transparent_hugepage").is_dir(),
    reason="transparent huge pages are Linux's",
)


def vm_flags(address: int) -> set[str]:
    """The kernel's flags for the mapping holding address (hg: huge pages asked for)."""
    lines = Path("/proc/self/smaps").read_text().splitlines()
    inside = False
    for line in lines:
        span = re.match(r"([0-9a-f]+)-([0-9a-f]+) ", line)
        if span:
            inside = int(span[1], 16) <= address < int(span[2], 16)
        elif inside and line.startswith("VmFlags:"):
            return set(line.split()[1:])
    raise AssertionError(f"no mapping holds {address:#x}")


def interior(t: torch.Tensor) -> int:
    """An address in t's first whole huge page."""
    return -(-t.data_ptr() // memory.HUGE_PAGE) * memory.HUGE_PAGE


def test_the_kv_cache_and_large_buffers_ask_for_huge_pages_and_small_ones_do_not():
    config = ModelConfig(n_layer=4, n_head=4, n_embd=256, block_size=512, vocab_size=64)
    cache = KVCache(config, 8, 512, "cpu", torch.bfloat16)  # 8 MB each for keys and values
    for t in (cache.k, cache.v):
        assert "hg" in vm_flags(interior(t))
        assert not t.any()  # zeroed, as a cache starts
    cache.pos = 3
    cache.expand(4)  # the rows of samples, in new memory
    assert "hg" in vm_flags(interior(cache.k)) and "hg" in vm_flags(interior(cache.v))
    big = memory.empty((8 << 20,), torch.uint8)
    assert "hg" in vm_flags(interior(big))
    small = memory.empty((1024,), torch.uint8)
    assert not memory.advise_huge_pages(small)  # no whole huge page inside it
