"""What /proc/cpuinfo says about this machine's CPU: its fields and its feature flags, read
once, for the runtime's choices (bf16 or not) and the CPU decoding kernel's build; empty
where there is no such file (macOS, Windows)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def cpu_fields() -> dict[str, str]:
    """The first processor's fields ("model name", "cpu family", "flags", ARM's "Features",
    ...); empty where there is no /proc/cpuinfo."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # (the next processor's block)
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags() -> list[str]:
    """The CPU's feature flags (x86's "flags", ARM's "Features"), in the file's order."""
    fields = cpu_fields()
    return (fields.get("flags") or fields.get("Features") or "").split()


@lru_cache(maxsize=1)
def cpu_bf16_feature() -> str | None:
    """The CPU feature that gives native bf16 matmul (avx512_bf16, amx_bf16, arm bf16), if any."""
    flags = set(cpu_flags())
    for feature in ("amx_bf16", "avx512_bf16", "bf16"):
        if feature in flags:
            return feature
    return None
