"""Everything a person looks at, drawn with Rich: the only place that imports it.

Functions take plain data (lists, numbers, strings, gptcli.reports records) from the CLI
modules and write to stdout (results) or stderr (progress, warnings, errors). By what is
drawn: console.py (the consoles, messages, JSON, progress bars), tokens.py, training.py
(the live view, the log, the summary), decoding.py (samples, probabilities, beams,
predictions), heatmaps.py (attention maps), lens.py (the logit lens), serving.py (the
server's banner). Callers use
`from gptcli.cli import render`.
"""

from gptcli.cli.render.console import (
    STDERR,
    STDOUT,
    Notes,
    Stream,
    byte_progress,
    carry_on_without_output,
    count_progress,
    err,
    error,
    info,
    note,
    out,
    print_json,
    warning,
)
from gptcli.cli.render.decoding import beam_table, predictions_table, probs_table, sample_text, stream_text
from gptcli.cli.render.evals import eval_tables
from gptcli.cli.render.heatmaps import attention_grid, attention_heatmap, token_labels
from gptcli.cli.render.lens import lens_grid, lens_table
from gptcli.cli.render.serving import serve_banner
from gptcli.cli.render.tokens import token_table, tokenize_summary, visible_piece
from gptcli.cli.render.training import (
    TrainLog,
    TrainView,
    batch_line,
    loss_chart,
    train_reporter,
    train_summary,
)

__all__ = [
    "STDERR", "STDOUT", "Notes", "Stream", "TrainLog", "TrainView", "attention_grid",
    "attention_heatmap", "batch_line", "beam_table", "byte_progress", "carry_on_without_output",
    "count_progress", "err", "error", "eval_tables", "info", "lens_grid", "lens_table", "loss_chart",
    "note", "out", "predictions_table", "print_json", "probs_table", "sample_text", "serve_banner",
    "stream_text", "token_labels",
    "token_table", "tokenize_summary", "train_reporter", "train_summary", "visible_piece", "warning",
]  # fmt: skip
