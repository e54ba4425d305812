"""bench case: `gptcli serve` under 1, 4 and 16 concurrent clients, GPT-2 124M shape.

A random GPT-2 124M saved as a run is served (`--max-batch 16`, the dtype `--dtype auto`
picks); each client streams 128-token completions of its own prompt (temperature 1, its
own seed) one after another. Measured: the aggregate tokens/s over all clients and the
median time to the first streamed token, against one client alone; and, with
llama-cpp-python installed with its server's packages (sse-starlette, starlette-context,
pydantic-settings), llama-cpp-python's OpenAI server (`python -m llama_cpp.server`) on the
same weights in f16 (the GGUF file `gptcli export` writes), under the same 16 clients; with
--llama-server PATH, llama.cpp's own `llama-server --parallel 16` (built from the source the
llama-cpp-python sdist vendors), which batches too.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench.common import ROOT, Result, gpt2_pair, scratch

TOKENS = 128


def _client(client, url: str, seed: int, rounds: int, out: list[tuple[float, int, float, bool]]) -> None:
    """Streams rounds completions; each recorded as (first token s, tokens, seconds, whether
    the stream ended as it should: a server that cuts one is counted, not fatal)."""
    import httpx

    body = {"prompt": f"Request {seed}:", "max_tokens": TOKENS, "seed": seed, "stream": True}
    for r in range(rounds):
        body["seed"] = seed * 100 + r
        t0 = time.perf_counter()
        first, n, ok = None, 0, True
        try:
            with client.stream("POST", url + "/v1/completions", json=body) as resp:
                for line in resp.iter_lines():
                    if line.startswith("data: {"):
                        chunk = json.loads(line[6:])
                        if chunk["choices"] and chunk["choices"][0]["text"]:
                            first = first or time.perf_counter() - t0
                            n += 1
        except httpx.HTTPError:
            ok = False
        out.append((first or 0.0, n, time.perf_counter() - t0, ok))


def measure(url: str, clients: int, rounds: int) -> tuple[float, float, int]:
    """(aggregate tokens/s, median seconds to the first token, streams the server cut) with
    `clients` at once."""
    import httpx

    results: list[tuple[float, int, float, bool]] = []
    # each client's HTTP client made before the clock starts: building one (its TLS
    # context, even for plain HTTP) costs milliseconds of CPU that are the measuring
    # side's, not the server's; on 2 cores, 16 built at once held back every request
    sessions = [httpx.Client(timeout=600) for _ in range(clients)]
    threads = [
        threading.Thread(target=_client, args=(sessions[i], url, i + 1, rounds, results))
        for i in range(clients)
    ]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    for session in sessions:
        session.close()
    cut = sum(1 for *_, ok in results if not ok)
    return sum(n for _, n, _, _ in results) / wall, statistics.median(f for f, *_ in results), cut


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _peer(cmd: list[str], port: int, ready: str, clients: int, rounds: int) -> tuple[float, float, int] | str:
    """A peer's server started by cmd on port, measured once it answers GET ready, then
    stopped; or why it was not measured (it exited, or never answered, or served nothing)."""
    import httpx

    url = f"http://127.0.0.1:{port}"
    # its messages in a file, not a pipe, which a server logging every request would fill
    with tempfile.TemporaryFile(mode="w+") as log:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        try:
            for _ in range(600):
                if proc.poll() is not None:
                    log.seek(0)
                    last = (log.read().strip().splitlines() or ["no message"])[-1]
                    return f"it exited ({proc.returncode}) before answering: {last}"
                try:
                    if httpx.get(url + ready, timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.1)
            else:
                return f"it did not answer {ready} within a minute"
            measure(url, 2, 1)  # warm-up
            found = measure(url, clients, rounds)
            return found if found[0] > 0 else "it streamed no tokens"
        finally:
            proc.terminate()
            proc.wait(timeout=60)


SERVER_PACKAGES = ("sse_starlette", "starlette_context", "pydantic_settings")  # llama_cpp.server's


def llama_server(gguf: Path, clients: int, rounds: int) -> tuple[float, float, int] | str:
    """llama-cpp-python's OpenAI server on gguf, under `clients` at once (or why not)."""
    import importlib.util

    import torch

    missing = [name for name in SERVER_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        return f"its server's packages are not installed ({', '.join(missing)})"

    port = _free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--n_threads", str(torch.get_num_threads()), "--n_ctx", "1024"]
    cmd += ["--interrupt_requests", "False"]  # by default a new request cuts the one being decoded
    return _peer(cmd, port, "/v1/models", clients, rounds)


def llama_cpp_server(binary: Path, gguf: Path, clients: int, rounds: int) -> tuple[float, float, int] | str:
    """llama.cpp's own llama-server on gguf, batching `clients` slots, under `clients` at once."""
    import torch

    port = _free_port()
    slot = TOKENS + 64  # each client's prompt and its completion
    cmd = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--parallel", str(clients), "-c", str(clients * slot), "-t", str(torch.get_num_threads())]
    cmd += ["--cont-batching"]
    return _peer(cmd, port, "/health", clients, rounds)


def run(args) -> list[Result]:
    from bench.cases.llama_cpp import ggufs
    from gptcli.data.tokenizer import gpt2_tokenizer
    from gptcli.store.checkpoint import save_checkpoint

    work = scratch("gptcli-serve-")
    _, model = gpt2_pair()
    save_checkpoint(work / "g124", "best", model, gpt2_tokenizer(), {"task": "lm"})
    files, why_not = ggufs(model, work, getattr(args, "llama_convert", None), kinds=("f16",))
    cmd = [sys.executable, "-m", "gptcli", "serve", "--ckpt", str(work / "g124"), "--port", "0"]
    cmd += ["--json", "--max-batch", "16", "--max-queue", "64"]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
    )
    rounds = 1 if args.quick else 2
    try:
        url = json.loads(proc.stdout.readline())["url"]
        measure(url, 2, 1)  # warm-up: the decoding kernel, the first batch
        one = measure(url, 1, rounds)
        four = measure(url, 4, rounds)
        sixteen = measure(url, 16, rounds)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    notes = [
        f"{TOKENS}-token streamed completions, {rounds} per client; one client {one[0]:.1f} tokens/s, "
        f"first token {one[1] * 1000:.0f} ms; 4 clients {four[0]:.1f} tokens/s ({four[0] / one[0]:.2f}x), "
        f"first token {four[1] * 1000:.0f} ms",
        f"streams gptcli cut short: {one[2] + four[2] + sixteen[2]}",
    ]
    results = [
        Result(
            "gptcli serve, 16 concurrent clients, GPT-2 124M: aggregate tokens/s",
            sixteen[0], one[0], "tokens/s", "one client", ">= 6x", sixteen[0] >= 6 * one[0], notes,
        ),
        Result(
            "gptcli serve, 16 concurrent clients: median time to the first token",
            sixteen[1], one[1], "s", "one client", "<= 3x", sixteen[1] <= 3 * one[1], [],
        ),
    ]  # fmt: skip
    peer = llama_server(files["f16"], 16, rounds) if files else f"no GGUF file: {why_not}"
    if isinstance(peer, str):
        notes.append(f"llama-cpp-python's server not measured: {peer}")
    else:
        results.append(
            Result(
                "gptcli serve against llama-cpp-python's server (f16), 16 concurrent clients",
                sixteen[0], peer[0], "tokens/s", "python -m llama_cpp.server", ">= 3x",
                sixteen[0] >= 3 * peer[0],
                [f"llama_cpp.server's median first token {peer[1]:.2f} s; gptcli's {sixteen[1]:.2f} s; "
                 f"streams it cut short: {peer[2]} of {16 * rounds} (their tokens until then counted)"],
            )
        )  # fmt: skip
    binary = getattr(args, "llama_server", None)
    if files and binary is not None and Path(binary).is_file():
        peer = llama_cpp_server(Path(binary), files["f16"], 16, rounds)
    else:
        peer = "--llama-server PATH names it"
    if isinstance(peer, str):
        notes.append(f"llama.cpp's own llama-server --parallel 16 not measured: {peer}")
    else:
        results.append(
            Result(
                "gptcli serve against llama.cpp's llama-server --parallel 16 (f16), 16 concurrent clients",
                sixteen[0], peer[0], "tokens/s", "llama-server --parallel 16", ">= 1.0x",
                sixteen[0] >= peer[0],
                [f"llama-server's median first token {peer[1]:.2f} s; gptcli's {sixteen[1]:.2f} s; "
                 f"streams it cut short: {peer[2]} of {16 * rounds}"],
            )
        )  # fmt: skip
    return results
