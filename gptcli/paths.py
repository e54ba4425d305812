"""Where gptcli keeps things on disk: the cache (tokenized corpora, measured peaks) and runs."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """GPTCLI_CACHE_DIR, else $XDG_CACHE_HOME/gptcli, else ~/.cache/gptcli."""
    if env := os.environ.get("GPTCLI_CACHE_DIR"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gptcli"


RUNS_DIR = Path("runs")  # default parent of run directories, relative to the working directory
