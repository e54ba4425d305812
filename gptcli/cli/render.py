"""Everything a person looks at, drawn with Rich: tables, bars, live views, messages.

The only module that imports Rich. Functions take plain data (lists, numbers, strings)
from the CLI modules and write to stdout (results) or stderr (progress, warnings, errors).
Outside a terminal, output is plain text without colours or live widgets.
"""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table
from rich.text import Text

from gptcli import reports


class Stream(io.TextIOBase):
    """sys.stdout or sys.stderr (whichever it is at the time of writing), made safe for a
    long run: characters the stream's encoding cannot show become "?", and once the reader
    has gone (`gptcli pretrain | head`, a closed terminal), a training carries on to its
    end and saves its checkpoints, dropping what it would print (carry_on); other verbs
    just stop, quietly, as `head` meant."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lost = False
        self.carry_on = False  # on a lost reader: False stops the command (quietly), True drops output

    @property
    def target(self) -> Any:
        stream = getattr(sys, self.name)
        # Rich's live display swaps in a proxy that prints through the console, which
        # prints here: write to the stream it proxies, not round in a circle
        return getattr(stream, "rich_proxied_file", stream)

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", None) or "utf-8"

    def isatty(self) -> bool:
        try:
            return not self.lost and self.target.isatty()
        except (ValueError, OSError):
            return False

    def fileno(self) -> int:
        return self.target.fileno()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if not self.lost:
            try:
                try:
                    self.target.write(text)
                except UnicodeEncodeError:
                    self.target.write(text.encode(self.encoding, "replace").decode(self.encoding))
            except (OSError, ValueError) as e:
                self._gone(e)
        return len(text)

    def flush(self) -> None:
        if not self.lost:
            try:
                self.target.flush()
            except (OSError, ValueError) as e:
                self._gone(e)

    def _gone(self, e: BaseException) -> None:
        if isinstance(e, OSError) and e.errno not in (errno.EPIPE, errno.EIO, errno.ECONNRESET):
            raise e
        if isinstance(e, ValueError) and "closed file" not in str(e):
            raise e
        self.lost = True
        # Python flushes the stream once more at exit: point it at /dev/null, so that last
        # flush has nowhere to fail
        with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.target.fileno())
            os.close(devnull)
        if not self.carry_on:
            raise BrokenPipeError(errno.EPIPE, "the reader of the output went away")
        if self.name == "stdout":
            warning("the output was closed (its reader went away); training carries on without printing")


def carry_on_without_output() -> None:
    """From now on, a closed stdout or stderr drops output instead of stopping the command
    (for training, whose checkpoints matter more than its progress lines)."""
    STDOUT.carry_on = STDERR.carry_on = True


# under torchrun only rank 0 talks (errors excepted); every process runs this same CLI
_QUIET = os.environ.get("RANK", "0") != "0"
STDOUT, STDERR = Stream("stdout"), Stream("stderr")
out = Console(file=STDOUT, highlight=False, quiet=_QUIET)
err = Console(file=STDERR, highlight=False)

_VISIBLE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


# --- messages ------------------------------------------------------------------------------


def error(message: str) -> None:
    """One line on stderr: what is wrong and what to do."""
    err.print(Text.assemble(("error: ", "bold red"), message), soft_wrap=True)


def warning(message: str) -> None:
    if not _QUIET:
        err.print(Text.assemble(("warning: ", "bold yellow"), message), soft_wrap=True)


def info(message: str) -> None:
    if not _QUIET:
        err.print(Text(message, style="dim"), soft_wrap=True)


def note(message: str) -> None:
    """A side remark for people at a terminal (where it runs, why); silent in pipes and logs."""
    if err.is_terminal:
        info(message)


class Notes(reports.Notes):
    """What setting up a run says (gptcli.recipes), on stderr: info and warnings always,
    notes and progress bars at a terminal only."""

    def info(self, text: str) -> None:
        info(text)

    def note(self, text: str) -> None:
        note(text)

    def warning(self, text: str) -> None:
        warning(text)

    @contextmanager
    def progress(self, description: str, total: int) -> Iterator[Callable[[int, int], None]]:
        with byte_progress(description, total, show=total > 4 << 20) as update:
            yield update


def print_json(obj: Any) -> None:
    """Machine-readable output: one JSON document on stdout (from rank 0 only under torchrun)."""
    if _QUIET:
        return
    STDOUT.write(json.dumps(obj, ensure_ascii=False) + "\n")
    STDOUT.flush()


# --- tokens --------------------------------------------------------------------------------


def visible_piece(raw: bytes) -> str:
    """A token's bytes as text with whitespace made visible; bytes that are only part of a
    UTF-8 character are shown as <0xNN>."""
    text = raw.decode("utf-8", errors="surrogateescape")
    return "".join(
        f"<0x{ord(c) - 0xDC00:02X}>" if 0xDC80 <= ord(c) <= 0xDCFF else _VISIBLE.get(c, c) for c in text
    )


def token_table(
    tokenizer: str, vocab_size: int, text: str, ids: Sequence[int], pieces: Sequence[bytes]
) -> None:
    """Position, id and piece of every token, the text shaded token by token, and counts."""
    if out.is_terminal and ids:
        shades = ("on grey23", "on dark_blue")
        out.print(
            Text.assemble(*[(visible_piece(p), shades[i % 2]) for i, p in enumerate(pieces)]),
            soft_wrap=True,
        )
    table = Table(title=f"{tokenizer} tokens", title_justify="left", show_edge=False)
    table.add_column("pos", justify="right", style="dim")
    table.add_column("id", justify="right", style="cyan")
    table.add_column("piece", style="bold")
    for pos, (i, p) in enumerate(zip(ids, pieces, strict=True)):
        table.add_row(str(pos), str(i), Text(visible_piece(p)))
    out.print(table)
    ratio = f", {len(text) / len(ids):.2f} chars/token" if ids else ""
    out.print(
        f"{len(ids)} tokens, {len(text)} characters{ratio} "
        f"({tokenizer}, vocabulary {vocab_size:,}; · space, ↵ newline, → tab)"
    )


@contextmanager
def byte_progress(description: str, total: int, show: bool = True) -> Iterator[Callable[[int, int], None]]:
    """A progress bar over bytes on stderr (only in a terminal); yields update(done, total)."""
    progress = Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=err,
        transient=True,
        disable=not (show and err.is_terminal),
    )
    task = progress.add_task(description, total=total)
    with progress:
        yield lambda done, total: progress.update(task, completed=done, total=total)


def tokenize_summary(report: Any, out_dir: str) -> None:
    """The counts of a tokenized corpus (a gptcli.data.TokenizeReport)."""
    table = Table(
        title=Text(f"{'reused' if report.reused else 'wrote'} {out_dir}", style="italic"),
        title_justify="left",
        show_header=False,
        show_edge=False,
    )
    table.add_column(style="dim")
    table.add_column(justify="right")
    rows = [
        ("files", f"{len(report.files):,}"),
        ("documents", f"{report.documents:,}"),
        ("characters", f"{report.chars:,}"),
        ("tokens", f"{report.tokens:,}"),
        ("  train.bin", f"{report.train_tokens:,}"),
        ("  val.bin", f"{report.val_tokens:,}"),
        ("chars / token", f"{report.chars_per_token:.2f}"),
        ("tokenizer", report.tokenizer),
        ("vocabulary", f"{report.vocab_size:,} ({report.dtype})"),
    ]
    if not report.reused:
        rows += [("time", f"{report.seconds:.2f} s"), ("speed", f"{report.mb_per_s:.1f} MB/s")]
    for k, v in rows:
        table.add_row(k, Text(v))
    out.print(table)


# --- training ------------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def _fmt(value: float | None, spec: str = ".4f") -> str:
    return "-" if value is None else format(value, spec)


def loss_chart(
    train: Sequence[tuple[int, float]], val: Sequence[tuple[int, float]], width: int, height: int
) -> Text:
    """Train and val loss against step, drawn with plotext in braille characters."""
    import plotext as plt

    plt.clear_figure()
    plt.plot_size(width, height)
    plt.theme("pro")
    if train:
        plt.plot([s for s, _ in train], [v for _, v in train], label="train", marker="braille", color="cyan")
    if val:
        plt.plot([s for s, _ in val], [v for _, v in val], label="val", marker="braille", color="orange")
    plt.xlabel("step")
    return Text.from_ansi(plt.build())


def batch_line(info: Any) -> str:
    """How the optimizer step's batch is formed: "global batch = 12 x 2 = 6,144 tokens
    (2 processes x 1 micro-step each)" (a gptcli.train.RunInfo)."""
    sequences = info.batch_size * info.grad_accum
    size = f"{info.tokens_per_step:,} tokens" if info.tokens_per_step else f"{sequences:,} examples"
    line = f"global batch = {info.batch_size} x {info.grad_accum} = {size}"
    if info.processes > 1:
        each = info.grad_accum // info.processes
        line += f" ({info.processes} processes x {each} micro-step{'s' if each != 1 else ''} each)"
    return line


class TrainView:
    """The live training view (a terminal): progress, numbers, and a redrawn loss curve,
    all drawn from the same state at every refresh. Implements gptcli.train.Reporter."""

    def __init__(self, title: str) -> None:
        from rich.live import Live
        from rich.progress import MofNCompleteColumn

        self.title = title
        self.progress = Progress(
            "[progress.description]{task.description}",
            BarColumn(),
            MofNCompleteColumn(),
            "[progress.percentage]{task.percentage:>3.0f}%",
            "[progress.elapsed]{task.fields[elapsed]}",  # the run's time, as the summary counts it
            "left",
            TimeRemainingColumn(),
            console=out,
        )
        self.task = self.progress.add_task("step", total=1, elapsed=_duration(0))
        self.train: list[tuple[int, float]] = []
        self.val: list[tuple[int, float]] = []
        self.stats: dict[str, Any] = {}
        self.header = Text("")
        self.max_time: float | None = None
        self.chart: Text | None = None
        # the live view asks for the whole picture at every refresh, so the bar and the
        # numbers under it always show the same step
        self.live = Live(console=out, refresh_per_second=4, transient=False, get_renderable=self._render)

    def on_start(self, info: Any) -> None:
        self.header = Text.assemble(
            (f"{self.title} ", "bold"),
            (str(info.run_dir), "cyan"),
            f"\n{info.device_reason} · {info.precision_reason} · {info.params / 1e6:.2f}M parameters"
            + (" · torch.compile" if info.compile else ""),
            f"\n{batch_line(info)}",
        )
        self.max_time = info.max_time
        self.progress.update(self.task, total=info.max_iters, completed=info.start_step)
        self.stats["step"] = info.start_step
        self.live.start()

    def on_step(self, r: Any) -> None:
        self.stats.update(step=r.step, lr=r.lr, elapsed=r.elapsed)
        if r.loss is not None:
            self.train.append((r.step, r.loss))
            best = self.stats.get("best_train")
            self.stats.update(
                loss=r.loss,
                best_train=r.loss if best is None else min(best, r.loss),
                tps=r.tokens_per_s,
                mfu=r.mfu,
            )
            self.chart = None

    def on_eval(self, r: Any) -> None:
        self.val.append((r.step, r.metrics["val"]["loss"]))
        self.stats.update(
            val=r.metrics["val"]["loss"], best_val=r.best_val_loss, eval_train=r.metrics["train"]["loss"]
        )
        extra = {k: v for k, v in r.metrics["val"].items() if k != "loss"}
        self.stats["val_extra"] = extra
        if r.improved:
            self.stats["best_step"] = r.step
        self.chart = None

    def on_checkpoint(self, name: str, path: Any, step: int) -> None:
        self.stats[f"saved_{name}"] = step

    def on_end(self, summary: Any) -> None:
        self.stats.update(step=summary.steps, elapsed=summary.elapsed)  # the summary's own figures
        self.live.refresh()

    def close(self) -> None:
        self.live.stop()  # idempotent; restores the cursor also when training failed

    def _render(self) -> Any:
        from rich.console import Group

        s = dict(self.stats)  # one consistent reading, whatever the training thread does meanwhile
        self.progress.update(self.task, completed=s.get("step", 0), elapsed=_duration(s.get("elapsed", 0)))
        numbers = Table.grid(padding=(0, 3))
        for _ in range(4):
            numbers.add_column()
        mfu = "-" if s.get("mfu") is None else f"{100 * s['mfu']:.1f}%"
        best_at = f" @{s['best_step']}" if "best_step" in s else ""
        numbers.add_row(
            f"step [bold]{s.get('step', 0)}[/]",
            f"lr {_fmt(s.get('lr'), '.2e')}",
            f"train [bold cyan]{_fmt(s.get('loss'))}[/] (best {_fmt(s.get('best_train'))})",
            f"val [bold orange1]{_fmt(s.get('val'))}[/] (best {_fmt(s.get('best_val'))}{best_at})",
        )
        extras = "  ".join(f"{k} {v:.4f}" for k, v in s.get("val_extra", {}).items())
        budget = (
            f"time {_duration(s.get('elapsed', 0))} of {_duration(self.max_time)}" if self.max_time else ""
        )
        numbers.add_row(
            f"{_fmt(s.get('tps'), ',.0f')} tok/s",
            f"MFU {mfu}",
            f"saved last @{s['saved_last']}" if "saved_last" in s else "",
            extras or budget,
        )
        parts: list[Any] = [self.header, self.progress, numbers]
        if self.train or self.val:
            chart = self.chart  # read once: the training thread may reset it meanwhile
            if chart is None:
                chart = self.chart = loss_chart(
                    list(self.train), list(self.val), max(40, min(out.width, 110)), 16
                )
            parts.append(chart)
        return Group(*parts)


class TrainLog:
    """Plain training log (not a terminal): one line per log step and per evaluation.
    Implements gptcli.train.Reporter."""

    def __init__(self, title: str, console: Console | None = None) -> None:
        self.title = title
        self.console = console or out

    def _line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()

    def on_start(self, info: Any) -> None:
        self._line(f"{self.title} {info.run_dir}")
        self._line(
            f"{info.device_reason}; {info.precision_reason}; {info.params / 1e6:.2f}M parameters"
            + ("; torch.compile" if info.compile else "")
        )
        self._line(batch_line(info))

    def on_step(self, r: Any) -> None:
        if r.loss is None:
            return
        mfu = "" if r.mfu is None else f" | mfu {100 * r.mfu:.1f}%"
        self._line(
            f"step {r.step}/{r.max_iters} | loss {r.loss:.4f} | lr {r.lr:.2e} | "
            f"{r.tokens_per_s:,.0f} tok/s{mfu} | {_duration(r.elapsed)}"
        )

    def on_eval(self, r: Any) -> None:
        extra = "".join(f" | val {k} {v:.4f}" for k, v in r.metrics["val"].items() if k != "loss")
        best = " (best)" if r.improved else ""
        self._line(
            f"eval step {r.step}: train {r.metrics['train']['loss']:.4f} | "
            f"val {r.metrics['val']['loss']:.4f}{best}{extra} | {_duration(r.elapsed)}"
        )

    def on_checkpoint(self, name: str, path: Any, step: int) -> None: ...

    def on_end(self, summary: Any) -> None: ...

    def close(self) -> None: ...


def train_reporter(title: str) -> TrainView | TrainLog:
    """The live view in a terminal, plain lines otherwise."""
    return TrainView(title) if out.is_terminal else TrainLog(title)


def train_summary(summary: Any, loss_png: str | None) -> None:
    """The table printed when training ends (a gptcli.train.Summary)."""
    stopped = summary.stop_reason in ("interrupted", "terminated")
    table = Table(
        title="training stopped" if stopped else "training finished",
        title_justify="left",
        show_header=False,
        show_edge=False,
    )
    table.add_column(style="dim")
    table.add_column()
    val = summary.last_eval.get("val", {})
    train = summary.last_eval.get("train", {})
    reasons = {
        "max_iters": "reached max_iters",
        "max_time": "reached max_time",
        "interrupted": "interrupted (Ctrl-C)",
        "terminated": "terminated (SIGTERM)",
    }
    rows = [
        ("run", str(summary.run_dir)),
        (
            "steps",
            f"{summary.steps:,}" + (f" (resumed at {summary.start_step:,})" if summary.start_step else ""),
        ),
        ("stopped", reasons.get(summary.stop_reason, summary.stop_reason)),
        ("time", _duration(summary.elapsed)),
        ("tokens", f"{summary.tokens:,}"),
        ("tokens/s", _fmt(summary.tokens_per_s, ",.0f") + " (mean over the training steps)"),
        ("best val loss", _fmt(summary.best_val_loss)),
    ]
    if summary.last_eval:
        last = "final" if summary.last_eval_step == summary.steps else f"step {summary.last_eval_step:,}"
        rows.append((f"{last} eval train / val", f"{_fmt(train.get('loss'))} / {_fmt(val.get('loss'))}"))
    rows += [(f"val {k}", f"{v:.4f}") for k, v in val.items() if k != "loss"]
    rows += [("checkpoints", f"{summary.run_dir}/best, {summary.run_dir}/last")]
    if loss_png:
        rows.append(("loss curve", loss_png))
    for k, v in rows:
        table.add_row(k, Text(v))
    out.print(table)


# --- sampling ------------------------------------------------------------------------------


def stream_text(text: str, style: str = "") -> None:
    """Print text with no newline, at once (streaming generation)."""
    out.print(text, end="", style=style, soft_wrap=True, markup=False, highlight=False)
    out.file.flush()


def sample_text(prompt: str, continuation: str, index: int | None = None) -> None:
    """A prompt (dimmed) and its continuation (bright)."""
    if index is not None:
        out.rule(f"sample {index}", style="dim")
    out.print(Text.assemble((prompt, "dim"), (continuation, "bold")), soft_wrap=True)


def _bar(prob: float, width: int = 24) -> str:
    full = prob * width
    return "█" * int(full) + ("▌" if full - int(full) >= 0.5 else "")


def probs_table(
    context: str,
    rows: Sequence[tuple[Any, ...]],
    title: str | None = None,
    column: str = "token",
    sampling: str | None = None,
) -> None:
    """The most likely next tokens (or labels) after context: (rank, name, probability,
    chosen) rows, with bars; the chosen one is marked. With `sampling` (how sampling
    reshaped the distribution, e.g. "T=0.7, top-k 3"), rows carry a fifth value, q, the
    probability the token was drawn with, shown beside the model's p."""
    table = Table(
        title=title or Text.assemble(("…" if len(context) > 48 else "", "dim"), (context[-48:], "dim"), " →"),
        title_justify="left",
        caption=f"p: model, q: drawn from ({sampling})" if sampling else None,
        caption_justify="left",
        show_edge=False,
        pad_edge=False,
    )
    table.add_column("#", justify="right", style="dim")
    table.add_column(column)
    table.add_column("p" if sampling else "prob", justify="right")
    if sampling:
        table.add_column("q", justify="right")
    table.add_column("", style="green")
    for rank, piece, prob, chosen, *q in rows:
        cells = [str(rank), Text(piece, style="bold green" if chosen else ""), f"{prob:.4f}"]
        if sampling:
            cells.append(f"{q[0]:.4f}")
        table.add_row(*cells, _bar(prob) + (" ◀" if chosen else ""))
    out.print(table)


# --- beam search ---------------------------------------------------------------------------


def beam_table(prompt: str, rows: Sequence[dict[str, Any]]) -> None:
    """The n-best hypotheses: rank, text (prompt dimmed, continuation bright), total
    log-probability, length-normalised score, length, and whether it ended."""
    table = Table(show_edge=False, pad_edge=False, title="beam search", title_justify="left")
    table.add_column("#", justify="right", style="dim")
    table.add_column("text", ratio=1)
    table.add_column("log p", justify="right")
    table.add_column("score", justify="right", style="bold")
    table.add_column("len", justify="right")
    table.add_column("ended", justify="center")
    for rank, r in enumerate(rows, 1):
        table.add_row(
            str(rank),
            Text.assemble((prompt, "dim"), (r["text"], "bold")),
            f"{r['logprob']:.3f}",
            f"{r['score']:.4f}",
            str(len(r["ids"])),
            "✓" if r["finished"] else "✗",
        )
    out.print(table)


# --- attention heatmaps ---------------------------------------------------------------------

# viridis, from 0 (dark) to 1 (bright)
_SCALE = [(68, 1, 84), (59, 82, 139), (33, 145, 140), (94, 201, 98), (253, 231, 37)]
_SHADES = " ░▒▓█"


def _color(w: float) -> str:
    x = min(max(w, 0.0), 1.0) * (len(_SCALE) - 1)
    i = min(int(x), len(_SCALE) - 2)
    f = x - i
    r, g, b = (round(a + (c - a) * f) for a, c in zip(_SCALE[i], _SCALE[i + 1], strict=True))
    return f"rgb({r},{g},{b})"


def _cell(w: float, masked: bool, numbers: bool) -> Text:
    """One heatmap cell: a shade (and the weight, for short prompts); masked cells are dots."""
    if masked:
        return Text("  · " if numbers else "· ", style="grey35")
    if numbers:
        label = " 1.0" if w >= 0.995 else " " + f"{w:.2f}"[1:]
        return Text(label, style=f"{'black' if w > 0.55 else 'white'} on {_color(w)}")
    shade = _SHADES[min(len(_SHADES) - 1, round(w * (len(_SHADES) - 1)))]
    return Text(shade * 2, style=_color(w))


def attention_heatmap(tokens: Sequence[str], weights: Any, title: str) -> None:
    """One attention map large: query tokens as rows, key tokens as columns, future
    positions masked. weights: (T, T) nested sequence or tensor."""
    T = len(tokens)
    numbers = T <= 16
    table = Table(title=title, title_justify="left", show_edge=False, pad_edge=False, show_lines=False,
                  box=None, padding=(0, 0))  # fmt: skip
    table.add_column("query ↓  key →", justify="right", style="bold", no_wrap=True)
    for tok in tokens:
        label = tok[:6]
        table.add_column(Text("\n".join(label) if numbers else label[:1]), justify="center", no_wrap=True,
                         header_style="cyan", vertical="bottom")  # fmt: skip
    for q in range(T):
        row = [_cell(float(weights[q][k]), k > q, numbers) for k in range(T)]
        table.add_row(Text(f"{tokens[q][:12]} {q:>2} "), *row)
    out.print(table)


def attention_grid(tokens: Sequence[str], maps: Sequence[tuple[str, Any]]) -> None:
    """Many attention maps small, side by side: (title, (T, T) weights) each."""
    from rich.columns import Columns
    from rich.panel import Panel

    T = len(tokens)
    panels = []
    for title, weights in maps:
        lines = Text()
        for q in range(T):
            for k in range(T):
                lines.append_text(_cell(float(weights[q][k]), k > q, numbers=False))
            if q < T - 1:
                lines.append("\n")
        panels.append(Panel(lines, title=title, expand=False, padding=(0, 0), border_style="grey42"))
    out.print(Columns(panels, padding=(0, 1)))
    out.print(Text("rows: queries, columns: keys, · masked (future)   ", style="dim") + _legend())


def _legend() -> Text:
    legend = Text("weight 0 ", style="dim")
    for i in range(5):
        legend.append_text(_cell(i / 4, False, numbers=False))
    return legend + Text(" 1", style="dim")


def token_labels(tokens: Sequence[str]) -> None:
    """The prompt's tokens with their positions, for reading the small maps."""
    out.print(Text("tokens: ", style="dim") + Text("  ".join(f"{i}:{t}" for i, t in enumerate(tokens))),
              soft_wrap=True)  # fmt: skip


def predictions_table(
    rows: Sequence[tuple[str, str, float, str | None]], accuracy: float | None, column: str = "label"
) -> None:
    """(input text, predicted label or choice, its probability, the true one or None) per
    record, and the accuracy over the labelled ones."""
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("#", justify="right", style="dim")
    table.add_column("text", ratio=1, overflow="ellipsis", no_wrap=True)
    table.add_column(f"predicted {column}")
    table.add_column("prob", justify="right")
    table.add_column("true")
    for i, (text, predicted, prob, true) in enumerate(rows, 1):
        mark = "" if true is None else (" ✓" if true == predicted else " ✗")
        style = "" if true is None else ("green" if true == predicted else "red")
        table.add_row(
            str(i), Text(text), Text(predicted, style=style), f"{prob:.3f}", Text(f"{true or ''}{mark}")
        )
    out.print(table)
    if accuracy is not None:
        labelled = sum(true is not None for *_, true in rows)
        out.print(f"accuracy {accuracy:.4f} ({round(accuracy * labelled)}/{labelled})")
