"""`gptcli serve`: a model behind the OpenAI-compatible HTTP API, decoding every request
in one continuous batch (gptcli/infer/engine.py, server.py). Its flags are
config.verbs.ServeSettings."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from gptcli.cli import render
from gptcli.cli.common import check_decoding_fits, load_model, start_decoding
from gptcli.config.verbs import ServeSettings
from gptcli.errors import GptcliError, UsageError, need

if TYPE_CHECKING:
    import socket

    from gptcli.store.checkpoint import Loaded

T = TypeVar("T")


def serve(s: ServeSettings) -> None:
    """Serve a model over HTTP, as OpenAI's API (completions, streaming, logprobs).

    gptcli serve                                   newest run, http://127.0.0.1:8000
    gptcli serve --ckpt runs/demo --port 8080 --api-key KEY
    curl http://127.0.0.1:8000/v1/completions -d '{"prompt": "The owl", "max_tokens": 20}'
    """
    need("fastapi", "serve", "gptcli serve")
    uvicorn = need("uvicorn", "serve", "gptcli serve")
    from gptcli.infer.engine import DecodingThread, Engine
    from gptcli.infer.server import Served, create_app

    api_key = s.api_key or os.environ.get("GPTCLI_API_KEY") or None
    if api_key is None and os.environ.get("GPTCLI_API_KEY") == "":  # (meant as a key, not as none)
        raise UsageError("GPTCLI_API_KEY is set but empty; give it a key, or unset it to serve without one")
    if s.max_tokens_limit is not None and s.max_tokens_limit > 1 << 20:
        raise UsageError("--max-tokens-limit over 1,048,576 is not a limit; give a smaller one")
    listener = _listen(s.host, s.port)  # before loading: a taken port fails at once
    decoding = DecodingThread()  # loads the model, then decodes: in one thread (it says why)
    try:
        loaded = _interruptible(decoding.submit(lambda: _load(s)).result)
    except BaseException:
        decoding.stop()
        listener.close()
        raise
    block = loaded.model.config.block_size
    name = s.model_name or _model_name(s.ckpt, loaded.path)
    engine = Engine(
        loaded.model,
        max_batch=s.max_batch,
        max_queue=s.max_queue,
        vocab_size=loaded.tokenizer.vocab_size,
        compile=s.compile,
        thread=decoding,
    )
    if s.compile:
        render.info("compiling the decoding step (once, before the server answers)")
        try:
            _interruptible(engine.warm_up)
        except BaseException:
            _interruptible(engine.close)  # (after a timeout the loop may still be compiling)
            listener.close()
            raise
    served = Served(
        engine,
        loaded.tokenizer,
        name,
        block,
        s.max_tokens_limit or block,
        s.max_batch,
        api_key,
        list(s.cors_origin),
    )
    host, port = listener.getsockname()[:2]
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    if s.host not in ("127.0.0.1", "localhost", "::1") and api_key is None:
        render.warning(
            f"listening on {s.host} without an API key: anyone who can reach it can use it (--api-key)"
        )
    config = uvicorn.Config(
        create_app(served), log_level="warning", access_log=False, timeout_graceful_shutdown=5
    )
    server = _server(config, engine)
    engine.on_fault(server.fail)  # a loop that fails outside any step: the server stops, exit 1
    # the signals are ours from before the ready line: a SIGTERM right after it stops cleanly
    previous = {sig: signal.signal(sig, server.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        if s.json_out:
            render.print_json({"url": url, "model": name})
        else:
            render.serve_banner(url, name, None if api_key is None else "flag" if s.api_key else "env")
        server.run(sockets=[listener])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _interruptible(engine.close)  # (a step may be running: Ctrl-C now leaves at once)
        listener.close()
    if server.failed is not None:
        raise GptcliError(f"{server.failed}; the server stopped")
    if server.stopped_by == signal.SIGINT:
        raise SystemExit(130)


def _load(s: ServeSettings) -> Loaded:
    """The model, checked to fit --max-batch, its decoding started."""
    loaded = load_model(s.ckpt, s.device, s.dtype, base=s.base, quantize=s.quantize, decoding=True)
    check_decoding_fits(loaded.model, s.max_batch, f"--max-batch {s.max_batch}")
    if not s.compile:
        start_decoding(loaded)
    return loaded


def _interruptible(wait: Callable[[], T]) -> T:
    """wait(), for what the decoding thread does (loading the model, compiling, finishing a
    step); Ctrl-C leaves at once, with the exit status 130. (That thread cannot be stopped
    inside torch, and a process whose daemon thread is still in torch when the interpreter
    ends is aborted by the C++ runtime: so the process ends here, without the interpreter's
    finalization.)"""
    try:
        return wait()
    except KeyboardInterrupt:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # (a second Ctrl-C while flushing)
        try:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
        finally:
            os._exit(130)


def _listen(host: str, port: int) -> socket.socket:
    """A listening socket, so the port is known (--port 0) and taken before anything else."""
    import socket  # (here: every other verb, and `gptcli --help`, starts without it)

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: not an address this machine can listen on ({e.strerror})") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        raise UsageError(
            f"cannot listen on {host}:{port} ({e.strerror}); try another --port, or 0 for a free one"
        ) from None
    sock.listen(128)
    return sock


def _model_name(ckpt: str | None, path: Path) -> str:
    """The run directory's name (a checkpoint inside it counts as the run), the directory's
    for Hugging Face, the file's stem for GGUF, the hub name itself."""
    if ckpt is not None and not Path(ckpt).exists():
        return ckpt  # a hub name
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return path.stem
    return path.parent.name if path.name in ("best", "last") else path.name


def _server(config, engine):
    """uvicorn's server, stopped by SIGINT or SIGTERM (stop, the handler serve() installs):
    the engine closes first (requests in flight end with a final event), then the port is
    released; the signal is remembered."""
    import uvicorn

    class Server(uvicorn.Server):
        stopped_by: int | None = None
        failed: str | None = None  # why the engine failed, which stopped the server

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:  # serve() has put stop() in place
            yield

        def stop(self, sig: int, frame: object) -> None:
            if self.stopped_by is not None:  # a second signal: stop waiting for requests
                self.force_exit = True
            self.stopped_by = sig
            self.should_exit = True
            threading.Thread(target=engine.close, daemon=True).start()

        def fail(self, why: str) -> None:
            self.failed = why
            self.should_exit = True

    return Server(config)
