"""Which directory is a gptcli checkpoint or run, by the files in it, and where nothing may
be written because of it: without torch, so that verbs that write files (tokenize) check
their paths without loading it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from gptcli.errors import UsageError

META_FILE = "checkpoint.json"
BEST, LAST = "best", "last"


def is_checkpoint_dir(path: Path) -> bool:
    """A gptcli checkpoint directory: its checkpoint.json."""
    return (path / META_FILE).is_file()


def is_run_dir(path: Path) -> bool:
    """A gptcli run directory: its best/ or last/ checkpoint, or its config and metrics."""
    return any(checkpoint_in(path, name) for name in (BEST, LAST)) or (
        (path / "metrics.jsonl").is_file() and (path / "config.yaml").is_file()
    )


def refuse_inside_checkpoints(
    path: str | os.PathLike, advice: str, runs: Literal["inside", "itself", "no"] = "no"
) -> None:
    """Refuse a path to write (a file or a directory, existing or not) that is or lies in a
    gptcli checkpoint directory, whose files are the checkpoint's and go with it when it is
    replaced; and, as `runs` says, one that is or lies in a run directory (exports), or is
    one (a tokenized directory's files in a run's own). --force or not: what it would replace
    there is the run itself. advice: what to do instead."""
    absolute = Path(os.path.abspath(path))  # (so that ../x from inside a run is seen where it lands)
    around = (absolute, *absolute.parents)
    found, what = next((p for p in around if is_checkpoint_dir(p)), None), "checkpoint"
    if found is None and runs != "no":
        runs_at = around if runs == "inside" else around[:1]
        found, what = next((p for p in runs_at if is_run_dir(p)), None), "run"
    if found is None:
        return
    where = f"is a gptcli {what}" if found == absolute else f"is inside the gptcli {what} {found}"
    raise UsageError(f"{path} {where}; {advice}")


def checkpoint_in(run_dir: Path, name: str) -> Path | None:
    """run_dir/name (best or last), or its .old copy when a crash came between the two
    renames that replace a checkpoint; None if neither is there."""
    return next((d for d in (run_dir / name, run_dir / f"{name}.old") if is_checkpoint_dir(d)), None)
