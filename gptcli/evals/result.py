"""What an evaluation returns: its metrics as the JSON output shows them, each example's
scores (for --per-example), and what the user should know about how it was scored."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Result:
    metrics: dict  # {"task": ..., the task's figures}
    examples: list[dict] | None = None
    warnings: list[str] = field(default_factory=list)
