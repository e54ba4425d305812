"""The pictures of the docs, drawn from the demo run (`make docs-figures`, after `make demo`):

- figures/live-view.svg: the live training view's last frame, replayed from
  runs/demo/metrics.jsonl through the view itself and exported by Rich;
- figures/loss.png: runs/demo/loss.png;
- figures/attention.png, figures/lens.png: the pages `inspect-attn --save` and
  `inspect-lens --save` write, as headless chromium draws them (when it is installed).

They are committed, so that building the docs trains nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIGURES = ROOT / "docs" / "figures"
sys.path.insert(0, str(ROOT))


def live_view(run: Path) -> str:
    """The live view after the run's last step, as an SVG of a 100-column terminal."""
    import io

    from rich.console import Console

    from gptcli.cli.render import training
    from gptcli.config import Config, merge
    from gptcli.reports import EvalReport, RunInfo, StepReport, Summary
    from gptcli.train.optim import describe_schedule

    meta = json.loads((run / "last" / "checkpoint.json").read_text())
    config = merge(Config(), meta["config"], "checkpoint.json").validate()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    console = Console(
        record=True, width=100, file=io.StringIO(), force_terminal=True, color_system="truecolor"
    )
    training.out = console  # the view draws on the module's console: this one, recording
    view = training.TrainView("gptcli pretrain →")
    c = config.train
    view.on_start(
        RunInfo(
            run_dir=Path("runs/demo"), device="cpu", device_reason="CPU: AMD EPYC, 2 threads (no GPU found)",
            precision="bf16", precision_reason="bf16 autocast: this CPU has native bf16 matmul (avx512_bf16)",
            params=sum(o["params"] for o in meta["optimizers"].values()),
            tokens_per_step=c.batch_size * c.grad_accum * config.model.block_size, batch_size=c.batch_size,
            grad_accum=c.grad_accum, processes=1, start_step=0, max_iters=c.max_iters, max_time=c.max_time,
            compile=c.compile, optimizers=meta["optimizers"], schedule=describe_schedule(c),
        )
    )  # fmt: skip
    view.live.stop()
    console.export_text(clear=True)  # the first frame, drawn as the live display stopped
    best = None
    for r in records:
        if r["kind"] == "train":
            fields = (r["loss"], r["grad_norm"], r["tokens_per_s"], r["mfu"])
            view.on_step(StepReport(r["step"], c.max_iters, r["elapsed"], r["lr"], r.get("muon_lr"), *fields))
        elif r["kind"] == "eval":
            metrics = {s: {k.removeprefix(f"{s}_"): v for k, v in r.items() if k.startswith(f"{s}_")}
                       for s in ("train", "val")}  # fmt: skip
            improved = best is None or metrics["val"]["loss"] < best
            best = metrics["val"]["loss"] if improved else best
            view.on_eval(EvalReport(r["step"], metrics, best, improved, r["elapsed"]))
    view.on_checkpoint("last", run / "last", c.max_iters)
    view.on_end(Summary(Path("runs/demo"), c.max_iters, 0, records[-1]["elapsed"], 0, "max_iters", best))
    console.print(view._render())
    return console.export_svg(title="gptcli pretrain examples/demo -c examples/configs/demo.yaml")


def page_screenshot(page: Path, png: Path, size: str) -> bool:
    """An HTML page as headless chromium draws it (False without chromium)."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        return False
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={profile}", f"--window-size={size}", f"--screenshot={png}", page.as_uri()],
            check=True, capture_output=True, timeout=120,
        )  # fmt: skip
    return True


def main() -> None:
    run = ROOT / "runs" / "demo"
    if not (run / "last" / "checkpoint.json").is_file():
        sys.exit("make_figures: no runs/demo; run `make demo` first")
    FIGURES.mkdir(exist_ok=True)
    (FIGURES / "live-view.svg").write_text(live_view(run), encoding="utf-8")
    shutil.copy(run / "loss.png", FIGURES / "loss.png")
    gptcli = [sys.executable, "-m", "gptcli"]
    with tempfile.TemporaryDirectory() as tmp:
        for verb, args, name, size in (
            ("inspect-attn", ["The rabbit dug a hole", "--layer", "3"], "attention", "1100,560"),
            ("inspect-lens", ["The rabbit dug a", "--track", " hole"], "lens", "1100,660"),
        ):
            page = Path(tmp) / f"{name}.html"
            cmd = [*gptcli, verb, *args, "--ckpt", str(run), "--save", str(page)]
            subprocess.run(cmd, check=True, capture_output=True, cwd=ROOT)
            if not page_screenshot(page, FIGURES / f"{name}.png", size):
                print(f"no chromium: {name}.png left as it was", file=sys.stderr)
    print(f"wrote {FIGURES}")


if __name__ == "__main__":
    main()
