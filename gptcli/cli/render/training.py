"""The training views: the live view at a terminal, plain log lines elsewhere, both
Reporters (gptcli.reports), and the summary table at the end."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from gptcli import reports
from gptcli.cli.render.console import duration, fmt, out, text
from gptcli.cli.render.evals import headline
from gptcli.messages import printable

METRIC_NAMES = {"bpb": "bits per byte", "f1": "macro-F1"}  # how the views name task metrics


class Series:
    """A curve's (step, value) points, kept in arrays that grow by doubling, so that adding
    a point and drawing the curve cost the same at step 100 and at step 100,000."""

    def __init__(self, points: Sequence[tuple[int, float]] = ()) -> None:
        import numpy as np  # here, not at the top: `gptcli --help` imports this module

        self.steps = np.zeros(max(64, len(points)), np.int64)
        self.values = np.zeros(len(self.steps), np.float64)
        self.n = 0
        for step, value in points:
            self.append(step, value)

    def __len__(self) -> int:
        return self.n

    def append(self, step: int, value: float) -> None:
        if self.n == len(self.steps):
            import numpy as np

            self.steps = np.concatenate([self.steps, np.zeros_like(self.steps)])
            self.values = np.concatenate([self.values, np.zeros_like(self.values)])
        self.steps[self.n], self.values[self.n] = step, value
        self.n += 1

    def downsample(self, n: int) -> tuple[list[int], list[float]]:
        """At most n points: consecutive points averaged in n groups of nearly equal size
        (the chart has no more columns than that, so the curve looks the same)."""
        import numpy as np

        count = self.n  # read once: the training thread may append meanwhile
        steps, values = self.steps[:count], self.values[:count]
        if count <= n:
            return steps.tolist(), values.tolist()
        starts = np.linspace(0, count, n + 1).astype(np.int64)
        means = np.add.reduceat(values, starts[:-1]) / np.diff(starts)
        return steps[starts[1:] - 1].tolist(), means.tolist()


def _step_ticks(lo: int, hi: int, count: int = 5) -> list[int]:
    """Whole, round step numbers across [lo, hi]."""
    span = max(1, hi - lo)
    raw = span / count
    unit = 10 ** math.floor(math.log10(raw)) if raw >= 1 else 1
    step = next(m * unit for m in (1, 2, 5, 10) if m * unit >= raw)
    first = math.ceil(lo / step) * step
    return list(range(int(first), hi + 1, int(step))) or [lo]


def loss_chart(train: Series, val: Series, width: int, height: int) -> Text:
    """Train and val loss against step, drawn with plotext in braille characters: the
    series named in the title (a legend box would hide the curve), whole steps on the x axis."""
    import plotext as plt

    plt.clear_figure()
    plt.plot_size(width, height)
    plt.theme("pro")
    columns = 2 * width  # braille: two dots per character
    ends = []
    for series, color in ((train, "cyan"), (val, "orange")):
        steps, values = series.downsample(columns)
        if steps:
            plt.plot(steps, values, marker="braille", color=color)
            ends += [steps[0], steps[-1]]
    if ends:
        plt.xticks(_step_ticks(min(ends), max(ends)))
    plt.title("loss: train (cyan), val (orange)")
    plt.xlabel("step")
    return Text.from_ansi(plt.build())


def header(info: reports.RunInfo, sep: str) -> list[str]:
    """What a run says before its first step, after its title and run dir: where it runs
    and in what precision, and how the batch is formed (the live view joins the first
    line's parts with " · ", the log with "; ")."""
    where = [info.device_reason, info.precision_reason, f"{info.params / 1e6:.2f}M parameters"]
    if info.compile:
        where.append("torch.compile (the first step and the first eval wait for its compile)")
    lines = [sep.join(where), batch_line(info)]
    return lines + ([optimizer_line(info, sep)] if info.optimizers else [])


def optimizer_line(info: Any, sep: str) -> str:
    """Each optimizer's learning rate and share of the model, and the schedule: "Muon lr 0.03,
    momentum 0.95: 3.15M parameters in 16 matrices; AdamW lr 0.001: 0.42M; cosine schedule: ..."."""
    parts = []
    for name, o in sorted(info.optimizers.items(), reverse=True):  # muon first, as it holds the most
        label = {"adamw": "AdamW", "muon": "Muon"}.get(name, name)
        momentum = f", momentum {o['momentum']:g}" if "momentum" in o else ""
        momentum += ", Newton-Schulz in fp32" if o.get("newton_schulz") == "fp32" else ""
        share = f"{o['params'] / 1e6:.2f}M parameters"
        share += f" in {o['tensors']} matrices" if name == "muon" else ""
        parts.append(f"{label} lr {o['lr']:g}{momentum}: {share}")
    return sep.join([*parts, info.schedule] if info.schedule else parts)


def batch_line(info: Any) -> str:
    """How the optimizer step's batch is formed: "global batch = 12 x 2 = 6,144 tokens
    (2 processes x 1 micro-step each)" (a gptcli.train.trainer.RunInfo)."""
    sequences = info.batch_size * info.grad_accum
    size = f"{info.tokens_per_step:,} tokens" if info.tokens_per_step else f"{sequences:,} examples"
    line = f"global batch = {info.batch_size} x {info.grad_accum} = {size}"
    if info.processes > 1:
        each = info.grad_accum // info.processes
        line += f" ({info.processes} processes x {each} micro-step{'s' if each != 1 else ''} each)"
    return line


class TrainView(reports.Reporter):
    """The live training view (a terminal): progress, numbers, and a redrawn loss curve,
    all drawn from the same state at every refresh."""

    def __init__(self, title: str) -> None:
        from rich.live import Live
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

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
        self.task = self.progress.add_task("step", total=1, elapsed=duration(0))
        self.train = Series()
        self.val = Series()
        self.stats: dict[str, Any] = {}
        self.header = Text("")
        self.max_time: float | None = None
        self.chart: Text | None = None
        # the live view asks for the whole picture at every refresh, so the bar and the
        # numbers under it always show the same step
        self.live = Live(console=out, refresh_per_second=4, transient=False, get_renderable=self._render)

    def on_start(self, info: Any) -> None:
        lines = "".join(f"\n{line}" for line in header(info, " · "))
        self.header = Text.assemble(
            (f"{self.title} ", "bold"), (printable(str(info.run_dir)), "cyan"), printable(lines)
        )
        self.max_time = info.max_time
        self.progress.update(self.task, total=info.max_iters, completed=info.start_step)
        self.stats["step"] = info.start_step
        self.live.start()

    def on_step(self, r: Any) -> None:
        self.stats.update(step=r.step, lr=r.lr, muon_lr=r.muon_lr, elapsed=r.elapsed)
        if r.loss is not None:
            self.train.append(r.step, r.loss)
            best = self.stats.get("best_train")
            self.stats.update(
                loss=r.loss,
                best_train=r.loss if best is None else min(best, r.loss),
                tps=r.tokens_per_s,
                mfu=r.mfu,
                grad_norm=r.grad_norm,
            )
            self.chart = None

    def on_eval(self, r: Any) -> None:
        self.val.append(r.step, r.metrics["val"]["loss"])
        self.stats.update(
            val=r.metrics["val"]["loss"], best_val=r.best_val_loss, eval_train=r.metrics["train"]["loss"]
        )
        extra = {k: v for k, v in r.metrics["val"].items() if k != "loss"}
        self.stats["val_extra"] = extra
        self.stats["files"] = r.files
        if r.improved:
            self.stats["best_step"] = r.step
        self.chart = None

    def on_checkpoint(self, name: str, path: Any, step: int) -> None:
        self.stats[f"saved_{name}"] = step

    def on_sample(self, r: Any) -> None:
        self.stats["sample"] = r

    def on_end(self, summary: Any) -> None:
        self.stats.update(step=summary.steps, elapsed=summary.elapsed)  # the summary's own figures
        self.live.refresh()

    def close(self) -> None:
        self.live.stop()  # idempotent; restores the cursor also when training failed

    def _render(self) -> Any:
        from rich.console import Group

        s = dict(self.stats)  # one consistent reading, whatever the training thread does meanwhile
        self.progress.update(self.task, completed=s.get("step", 0), elapsed=duration(s.get("elapsed", 0)))
        numbers = Table.grid(padding=(0, 3))
        for _ in range(4):
            numbers.add_column()
        mfu = "-" if s.get("mfu") is None else f"{100 * s['mfu']:.1f}%"
        best_at = f" @{s['best_step']}" if "best_step" in s else ""
        numbers.add_row(
            f"step [bold]{s.get('step', 0)}[/]",
            f"lr {fmt(s.get('lr'), '.2e')}",
            f"train [bold cyan]{fmt(s.get('loss'))}[/] (best {fmt(s.get('best_train'))})",
            f"val [bold orange1]{fmt(s.get('val'))}[/] (best {fmt(s.get('best_val'))}{best_at})",
        )
        extras = "  ".join(f"val {METRIC_NAMES.get(k, k)} {v:.4f}" for k, v in s.get("val_extra", {}).items())
        budget = f"time {duration(s.get('elapsed', 0))} of {duration(self.max_time)}" if self.max_time else ""
        numbers.add_row(
            f"{fmt(s.get('tps'), ',.0f')} tok/s",
            f"MFU {mfu}",
            f"grad norm {fmt(s.get('grad_norm'), '.3g')}",
            f"saved last @{s['saved_last']}" if "saved_last" in s else "",
        )
        muon = "" if s.get("muon_lr") is None else f"Muon lr {s['muon_lr']:.2e}"  # under AdamW's
        if extras or budget or muon:
            numbers.add_row("", muon, Text(extras, style="dim"), budget)
        for label, metrics in s.get("files", {}).items():
            numbers.add_row(text(label, "dim", 80), text(headline(metrics)), "", "")
        parts: list[Any] = [self.header, self.progress, numbers]
        if "sample" in s:
            r = s["sample"]
            line = Text.assemble(
                (f"sample @{r.step}: ", "dim"),
                (printable(one_line(r.prompt)), "dim"),
                printable(one_line(r.text)),
            )
            line.no_wrap, line.overflow = True, "ellipsis"
            parts.append(line)
        if len(self.train) or len(self.val):
            chart = self.chart  # read once: the training thread may reset it meanwhile
            if chart is None:
                chart = self.chart = loss_chart(self.train, self.val, max(40, min(out.width, 110)), 16)
            parts.append(chart)
        return Group(*parts)


class TrainLog(reports.Reporter):
    """Plain training log (not a terminal): one line per log step and per evaluation."""

    def __init__(self, title: str, console: Console | None = None) -> None:
        self.title = title
        self.console = console or out

    def _line(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)
        self.console.file.flush()

    def on_start(self, info: Any) -> None:
        self._line(f"{self.title} {info.run_dir}")
        for line in header(info, "; "):
            self._line(line)

    def on_step(self, r: Any) -> None:
        if r.loss is None:
            return
        mfu = "" if r.mfu is None else f" | mfu {100 * r.mfu:.1f}%"
        norm = "" if r.grad_norm is None else f" | grad norm {r.grad_norm:.3g}"
        self._line(
            f"step {r.step}/{r.max_iters} | loss {r.loss:.4f} | lr {r.lr:.2e}{muon_rate(r.muon_lr)}{norm} | "
            f"{r.tokens_per_s:,.0f} tok/s{mfu} | {duration(r.elapsed)}"
        )

    def on_sample(self, r: Any) -> None:
        self._line(f"sample step {r.step}: {one_line(r.prompt)}{one_line(r.text)}")

    def on_eval(self, r: Any) -> None:
        extra = "".join(
            f" | val {METRIC_NAMES.get(k, k)} {v:.4f}" for k, v in r.metrics["val"].items() if k != "loss"
        )
        extra += "".join(f" | {label}: {headline(m)}" for label, m in r.files.items())
        best = " (best)" if r.improved else ""
        self._line(
            f"eval step {r.step}: train {r.metrics['train']['loss']:.4f} | "
            f"val {r.metrics['val']['loss']:.4f}{best}{extra} | {duration(r.elapsed)}"
        )


def muon_rate(rate: float | None) -> str:
    """Muon's rate beside AdamW's on a step line, in a Muon run."""
    return "" if rate is None else f" (Muon {rate:.2e})"


def one_line(text: str) -> str:
    """A sample's text on one line: line breaks shown as ⏎."""
    return text.replace("\r\n", "⏎").replace("\n", "⏎").replace("\r", "⏎")


def train_reporter(title: str) -> TrainView | TrainLog:
    """The live view in a terminal, plain lines otherwise."""
    return TrainView(title) if out.is_terminal else TrainLog(title)


def train_summary(summary: Any, loss_png: str | None) -> None:
    """The table printed when training ends (a gptcli.train.trainer.Summary)."""
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
        ("time", duration(summary.elapsed)),
        ("tokens", f"{summary.tokens:,}"),
        ("tokens/s", fmt(summary.tokens_per_s, ",.0f") + " (mean over the training steps)"),
        ("best val loss", fmt(summary.best_val_loss)),
    ]
    if summary.last_eval:
        last = "final" if summary.last_eval_step == summary.steps else f"step {summary.last_eval_step:,}"
        rows.append((f"{last} eval train / val", f"{fmt(train.get('loss'))} / {fmt(val.get('loss'))}"))
    rows += [(f"val {METRIC_NAMES.get(k, k)}", f"{v:.4f}") for k, v in val.items() if k != "loss"]
    rows += [(f"{label} ({m['task']})", headline(m)) for label, m in summary.last_files.items()]
    rows += [("checkpoints", f"{summary.run_dir}/best, {summary.run_dir}/last")]
    if loss_png:
        rows.append(("loss curve", loss_png))
    for k, v in rows:
        table.add_row(text(k), text(v))
    out.print(table)
