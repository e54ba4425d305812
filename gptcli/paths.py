"""Where gptcli keeps things on disk: the cache (tokenized corpora, measured peaks) and runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """GPTCLI_CACHE_DIR, else $XDG_CACHE_HOME/gptcli, else ~/.cache/gptcli (a relative
    XDG_CACHE_HOME is ignored, as the XDG spec asks: it would move with the working directory)."""
    if env := os.environ.get("GPTCLI_CACHE_DIR"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else Path.home() / ".cache"
    return base / "gptcli"


RUNS_DIR = Path("runs")  # default parent of run directories, relative to the working directory
