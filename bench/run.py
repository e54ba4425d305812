"""gptcli against its peers, side by side in one run: a table of our figure, the peer's, and
the ratio, appended with the machine's details to bench/RESULTS.md.

    python bench/run.py                       # every case (about 20 minutes on 2 cores)
    python bench/run.py --quick               # shorter runs, no equal-time training case
    python bench/run.py --only decode,beam    # some cases
    python bench/run.py --only decode-isa     # the CPU kernel as built for each instruction set
    python bench/run.py --nanogpt ~/src/nanoGPT --corpus tinyshakespeare.txt
    python bench/run.py --only muon --nanogpt ~/src/nanoGPT --corpus tinyshakespeare.txt
    python bench/run.py --only llama-cpp,serve   # llama.cpp on the model `gptcli export` wrote
    python bench/run.py --only llama-cpp --llama-convert SRC/vendor/llama.cpp/convert_hf_to_gguf.py
    python bench/run.py --only serve --llama-server BUILD/bin/llama-server

The in-repo peer is Hugging Face transformers (a dev dependency). nanoGPT is not part of
this project: give --nanogpt DIR (a checkout of it) to also run its model and loop for the
training cases; its code is imported from there, never copied here. Likewise llama.cpp, for
the llama-cpp and serve cases: llama-cpp-python installed (for serve, with its server's
packages); they run it on the GGUF file gptcli's export writes, or, with --llama-convert
naming the converter in its source, on the converter's.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import platform
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.cases import CASES  # noqa: E402
from bench.common import Result, remove_scratch  # noqa: E402
from gptcli.cpuinfo import cpu_fields  # noqa: E402
from gptcli.runtime import cpu_bf16_feature, cpu_name  # noqa: E402


def run_case(name: str, args: argparse.Namespace) -> list[Result]:
    try:
        return importlib.import_module(f"bench.cases.{CASES[name]}").run(args)
    finally:
        remove_scratch()  # its files (1.5 GB for llama-cpp), before the next case's


def cpu_generation() -> str:
    """The CPU's family and model numbers, and its native bf16 feature: a cloud's "AMD EPYC"
    names Zen 4 (family 25) and Zen 5 (family 26) alike, and their figures differ."""
    fields = cpu_fields()
    if "cpu family" not in fields or "model" not in fields:
        return ""
    bf16 = cpu_bf16_feature() or "no native bf16"
    return f" (family {fields['cpu family']}, model {fields['model']}, {bf16})"


def machine() -> str:
    return (
        f"{cpu_name()}{cpu_generation()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"python {platform.python_version()}, device cpu, {torch.get_num_threads()} threads"
    )


def table(results: list[Result]) -> str:
    rows = ["| case | gptcli | peer | ratio | target | met |", "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        peer = "" if r.peer is None else f"{r.peer:,.3g} {r.unit} ({r.peer_name})"
        ratio = "" if r.ratio is None else f"{r.ratio:.2f}x"
        met = {True: "yes", False: "**no**", None: ""}[r.passed]
        rows.append(f"| {r.case} | {r.ours:,.3g} {r.unit} | {peer} | {ratio} | {r.target} | {met} |")
    notes = [f"- {r.case}: {n}" for r in results for n in r.notes]
    return "\n".join([*rows, "", *notes])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="shorter runs; skip the equal-time training case"
    )
    parser.add_argument("--only", help="comma-separated cases: " + ", ".join(CASES))
    parser.add_argument("--repeats", type=int, default=3, help="alternating repetitions per case")
    parser.add_argument("--nanogpt", type=Path, help="a nanoGPT checkout to run beside (never copied here)")
    parser.add_argument(
        "--llama-convert",
        type=Path,
        help="llama.cpp's convert_hf_to_gguf.py: the llama-cpp and serve cases convert with it "
        "instead of gptcli's GGUF export",
    )
    parser.add_argument(
        "--llama-server",
        type=Path,
        help="llama.cpp's llama-server binary (built from the llama-cpp-python sdist's source), for serve",
    )
    parser.add_argument("--corpus", type=Path, help="tinyshakespeare.txt, for the equal-time and BPE cases")
    parser.add_argument("--no-write", action="store_true", help="print only; do not append to RESULTS.md")
    args = parser.parse_args()
    names = (
        args.only.split(",") if args.only else [c for c in CASES if not (args.quick and c == "equal-time")]
    )
    results: list[Result] = []
    for name in names:
        print(f"running {name} ...", file=sys.stderr, flush=True)
        results += run_case(name, args)
        gc.collect()
    report = table(results)
    print(report)
    if not args.no_write:
        cmd = "python bench/run.py " + " ".join(sys.argv[1:])
        stamp = time.strftime("%Y-%m-%d %H:%M")
        with open(ROOT / "bench" / "RESULTS.md", "a", encoding="utf-8") as f:
            f.write(f"\n## bench/run.py, {stamp}\n\n`{cmd}`\n\n{machine()}\n\n{report}\n")


if __name__ == "__main__":
    main()
