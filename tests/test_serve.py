"""`gptcli serve` judged by real clients: the official `openai` package (completions,
token prompts, n and seeds, stop, echo + logprobs, streaming, errors as its own exception
classes), raw HTTP for the SSE bytes and the limits, signals for stopping."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from gptcli.errors import UsageError  # noqa: E402
from gptcli.store.loading import load  # noqa: E402
from tests.helpers import ROOT, run  # noqa: E402

KEY = "sekrit"


class Server:
    """`gptcli serve --port 0 --json` in a process of its own, ready when it prints its URL."""

    def __init__(self, ckpt, *args: str, key: str | None = KEY) -> None:
        cmd = [sys.executable, "-m", "gptcli", "serve", "--ckpt", str(ckpt), "--port", "0", "--json", *args]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("GPTCLI_API_KEY", None)
        if key is not None:
            env["GPTCLI_API_KEY"] = key
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(self.proc.stderr.read())
        ready = json.loads(line)
        self.url, self.model = ready["url"], ready["model"]
        self.client = openai.OpenAI(
            base_url=self.url + "/v1", api_key=key or "none", max_retries=0, timeout=60
        )

    def post(self, path: str, body, key: str | None = KEY, **kw):
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        return httpx.post(self.url + path, content=data, headers=headers, timeout=60, **kw)

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=30)
        finally:
            self.proc.stdout.close()
            self.proc.stderr.close()


@pytest.fixture(scope="module")
def server(trained):
    s = Server(trained, "--max-batch", "4")
    yield s
    s.stop()


def sample_json(trained, *args) -> dict:
    result = run("sample", "--ckpt", trained, "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_completions_through_the_openai_client_are_samples(trained, server):
    c = server.client
    assert [m.id for m in c.models.list().data] == [server.model] == ["run"]
    assert c.models.retrieve("run").id == "run"  # GET /v1/models/{id}, as the client asks for it
    with pytest.raises(openai.NotFoundError, match="no model 'other'; this server serves 'run'"):
        c.models.retrieve("other")
    # greedy: sample --temp 0's text, from a string and from token ids (through a window slide)
    want = sample_json(trained, "-p", "The", "-n", "20", "--temp", "0")
    r = c.completions.create(model=server.model, prompt="The", max_tokens=16, temperature=0)
    assert r.choices[0].text == want["samples"][0]["text"][: len(r.choices[0].text)]
    assert len(r.choices[0].text) == 16 and r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 16
    r = c.completions.create(model=server.model, prompt=want["prompt_ids"], max_tokens=16, temperature=0)
    assert r.choices[0].text == want["samples"][0]["text"][:16]
    # n with a seed: choice i is what sample --seed S+i gives alone
    r = c.completions.create(model=server.model, prompt="The", max_tokens=12, n=3, seed=5)
    for i, choice in enumerate(r.choices):
        assert choice.index == i
        assert (
            choice.text
            == sample_json(trained, "-p", "The", "-n", "12", "--seed", str(5 + i))["samples"][0]["text"]
        )
    # several prompts, a stop string
    r = c.completions.create(
        model=server.model, prompt=["The", "the"], max_tokens=16, temperature=0, stop=["."]
    )
    assert [ch.index for ch in r.choices] == [0, 1]
    for ch in r.choices:
        assert "." not in ch.text and (ch.finish_reason == "stop" or len(ch.text) == 16)


def test_compile_builds_its_graphs_before_answering_and_answers_as_sample_does(trained):
    """--compile: the batch's step through torch.compile, its graphs built before the ready
    line; greedy completions, one alone and two together, are sample --temp 0's (fp32)."""
    s = Server(trained, "--compile", "--dtype", "fp32", "--max-batch", "4")
    try:
        want = sample_json(trained, "-p", "The", "-n", "12", "--temp", "0", "--dtype", "fp32")
        text = want["samples"][0]["text"]
        alone = s.client.completions.create(model=s.model, prompt="The", max_tokens=12, temperature=0)
        assert alone.choices[0].text == text
        two = s.client.completions.create(model=s.model, prompt=["The", "The"], max_tokens=12, temperature=0)
        assert [c.text for c in two.choices] == [text, text]
    finally:
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0
        assert "compiling the decoding step" in s.proc.stderr.read()
        s.proc.stdout.close()
        s.proc.stderr.close()


def test_quantize_int8_answers_as_sample_does_alone_and_batched(trained):
    """--quantize int8: greedy completions, alone and three of different prompts decoded
    together (the int8 products of several rows at once), are sample --quantize int8's."""
    s = Server(trained, "--quantize", "int8", "--dtype", "fp32", "--max-batch", "4")
    try:
        want = {
            p: sample_json(
                trained, "-p", p, "-n", "12", "--temp", "0", "--dtype", "fp32", "--quantize", "int8"
            )["samples"][0]["text"]
            for p in ("The", "the fox dug")
        }
        alone = s.client.completions.create(model=s.model, prompt="The", max_tokens=12, temperature=0)
        assert alone.choices[0].text == want["The"]
        prompts = ["The", "the fox dug", "The"]
        three = s.client.completions.create(model=s.model, prompt=prompts, max_tokens=12, temperature=0)
        assert [c.text for c in three.choices] == [want[p] for p in prompts]
    finally:
        s.proc.send_signal(signal.SIGTERM)
        assert s.proc.wait(timeout=30) == 0
        s.proc.stdout.close()
        s.proc.stderr.close()


def test_echo_logprobs_scores_the_prompt_as_the_model_does(trained, server):
    prompt = "The fox dug a"
    r = server.client.completions.create(
        model=server.model, prompt=prompt, max_tokens=0, echo=True, logprobs=3
    )
    lp = r.choices[0].logprobs
    assert r.choices[0].text == prompt and "".join(lp.tokens) == prompt
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert lp.text_offset == list(range(len(prompt)))
    model = load(trained)
    ids = model.tokenizer.encode(prompt)
    with torch.no_grad():
        logp = model.model(torch.tensor([ids]))[0][0].log_softmax(-1)
    for t in range(1, len(ids)):
        assert lp.token_logprobs[t] == pytest.approx(float(logp[t - 1, ids[t]]), abs=1e-4)
        assert (
            len(lp.top_logprobs[t]) in (3, 4)
            and max(lp.top_logprobs[t].values()) >= lp.token_logprobs[t] - 1e-6
        )
        assert lp.top_logprobs[t][lp.tokens[t]] == lp.token_logprobs[t]  # the token itself is always there
    # echo without logprobs: the prompt's text first, streamed or not
    r = server.client.completions.create(
        model=server.model, prompt="The", max_tokens=4, echo=True, temperature=0
    )
    assert (
        r.choices[0].text.startswith("The") and len(r.choices[0].text) == 7 and r.choices[0].logprobs is None
    )
    chunks = server.client.completions.create(
        model=server.model, prompt="The", max_tokens=4, echo=True, temperature=0, stream=True
    )
    assert "".join(ch.choices[0].text for ch in chunks) == r.choices[0].text
    # with generated tokens: the prompt's scores, then the new ones
    r = server.client.completions.create(
        model=server.model, prompt="The", max_tokens=4, echo=True, logprobs=1, temperature=0
    )
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 3 + 4 and r.choices[0].text.startswith("The")
    # sampled far from the top: each drawn token is still among its top_logprobs (OpenAI's rule)
    r = server.client.completions.create(
        model=server.model, prompt="The", max_tokens=12, logprobs=1, temperature=5, seed=3
    )
    lp = r.choices[0].logprobs
    assert all(
        top[tok] == p for tok, p, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
    )
    assert any(len(top) == 2 for top in lp.top_logprobs)  # (at temperature 5, some are not the top one)
    # suffix "" is the neutral value (no text after the completion), as for the other fields
    assert server.client.completions.create(model=server.model, prompt="The", max_tokens=2, suffix="").choices


def test_streaming_gives_the_same_text_and_usage_last(server):
    c = server.client
    whole = (
        c.completions.create(model=server.model, prompt="The", max_tokens=16, temperature=0).choices[0].text
    )
    chunks = list(
        c.completions.create(
            model=server.model,
            prompt="The",
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 16
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"


def test_the_stream_is_server_sent_events_ending_in_done(server):
    with httpx.stream(
        "POST",
        server.url + "/v1/completions",
        json={"prompt": "The", "max_tokens": 5, "stream": True},
        headers={"Authorization": f"Bearer {KEY}"},
        timeout=60,
    ) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(r.iter_raw()).decode()
    events = raw.split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    for e in events[:-2]:
        assert re.fullmatch(r"data: \{.*\}", e), e
        assert json.loads(e[6:])["object"] == "text_completion"


def test_bad_requests_get_openais_errors_and_the_server_keeps_serving(server):
    c = server.client
    for kwargs, words in [
        ({"temperature": -1}, "'temperature' must be at least 0"),
        ({"logprobs": 21}, "'logprobs' must be between 0 and 20"),
        ({"max_tokens": 17}, "'max_tokens' must be between 0 and 16"),
        ({"n": 0}, "'n' must be between 1 and 4"),
        ({"prompt": []}, "'prompt' must be"),
        ({"prompt": ["The"] * 5}, "5 prompts in one request; at most 4 (--max-batch)"),
        ({"prompt": ["The"] * 2, "n": 3}, "n x prompts is 6; at most 4"),
        ({"prompt": [10**6]}, "token id 1000000 is outside the vocabulary"),
        ({"prompt": "x" * 17}, "the prompt has 17 tokens; this model attends to at most 16"),
        ({"prompt": "Ä"}, "not in this char tokenizer's vocabulary"),
        ({"echo": True, "logprobs": 0, "max_tokens": 14}, "which scoring needs"),
        ({"best_of": 3}, "'best_of' is not supported"),
        ({"stop": ["x" * 257]}, "each of at most 256 characters"),
        ({"n": 2, "seed": 2**63 - 1}, f"'seed' must be between 0 and {2**63 - 2}"),  # (choice i: seed + i)
    ]:
        args = {"model": server.model, "prompt": "The", **kwargs}
        with pytest.raises(openai.BadRequestError, match=re.escape(words)):
            c.completions.create(**args)
    with pytest.raises(openai.NotFoundError, match="the model 'nope' does not exist"):
        c.completions.create(model="nope", prompt="The")
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError, match="a valid API key is needed"):
        wrong.completions.create(model=server.model, prompt="The")
    assert server.post("/v1/completions", {"prompt": "The"}, key=None).status_code == 401
    with pytest.raises(openai.BadRequestError, match="has no chat template; use /v1/completions"):
        c.chat.completions.create(model=server.model, messages=[{"role": "user", "content": "hi"}])
    # malformed bodies, an oversized one, an unknown path: OpenAI's error body every time
    for body, status in [
        (b"[" * 100_000 + b"]" * 100_000, 400),
        (b"{bad", 400),
        (b"[1, 2]", 400),
        (b'{"prompt": "x", "n": "2"}', 400),
        (b"x" * (1 << 20 | 1), 413),
    ]:
        r = server.post("/v1/completions", body)
        assert r.status_code == status and set(r.json()["error"]) == {"message", "type", "param", "code"}
    nothing = server.post("/v2/nothing", {})
    assert nothing.status_code == 404 and "no such path: /v2/nothing; see GET /v1/models" in nothing.text
    # a lone surrogate the error quotes back: its JSON escape, not a failure to write it
    gone = server.post("/v1/completions", {"model": "\ud800", "prompt": "The", "max_tokens": 2})
    assert gone.status_code == 404 and "\ud800" in gone.json()["error"]["message"]
    for i in range(100):
        assert server.post("/v1/completions", b"{" * (i % 7 + 1)).status_code == 400
    assert c.completions.create(model=server.model, prompt="The", max_tokens=2).choices[0].text


def test_tokenize_and_detokenize(server):
    ids = server.post("/tokenize", {"prompt": "The fox"}).json()
    assert ids["count"] == 7 and ids["max_model_len"] == 16
    assert server.post("/detokenize", {"tokens": ids["tokens"]}).json() == {"prompt": "The fox"}
    assert server.post("/detokenize", {"tokens": [-1]}).status_code == 400
    assert server.post("/tokenize", {"prompt": "Ä"}).status_code == 400


def test_a_full_server_says_429_and_a_client_that_leaves_frees_its_slot(trained):
    s = Server(trained, "--max-batch", "1", "--max-queue", "0", "--max-tokens-limit", "1000000", key=None)
    try:
        long = {"prompt": "The", "max_tokens": 1000000, "stream": True}
        with httpx.stream("POST", s.url + "/v1/completions", json=long, timeout=60) as r:
            chunks = r.iter_raw()  # kept: a dropped iterator closes the stream
            next(chunks)  # decoding
            busy = s.post("/v1/completions", {"prompt": "The", "max_tokens": 1}, key=None)
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert busy.json()["error"]["type"] == "rate_limit_error"
        deadline = time.time() + 20  # the client went away: its sequence is cancelled
        while httpx.get(s.url + "/health").json()["active"] and time.time() < deadline:
            time.sleep(0.1)
        assert httpx.get(s.url + "/health").json() == {
            "status": "ok",
            "model": "run",
            "active": 0,
            "waiting": 0,
        }
        # the same for a request that is not streamed: its client leaves before the answer
        port = int(s.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port)) as gone:
            body = json.dumps({"prompt": "The", "max_tokens": 1000000}).encode()
            head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            gone.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
            deadline = time.time() + 20
            while not httpx.get(s.url + "/health").json()["active"] and time.time() < deadline:
                time.sleep(0.05)
            assert httpx.get(s.url + "/health").json()["active"] == 1
        deadline = time.time() + 20
        while httpx.get(s.url + "/health").json()["active"] and time.time() < deadline:
            time.sleep(0.1)
        assert httpx.get(s.url + "/health").json()["active"] == 0
        assert s.post("/v1/completions", {"prompt": "The", "max_tokens": 1}, key=None).status_code == 200
    finally:
        assert s.stop(signal.SIGINT) == 130


def test_a_stream_whose_client_left_before_it_started_is_cancelled(trained):
    """In process, through the app as an ASGI server drives it: the client is gone when the
    response's head is sent, so the stream never starts (its own cancelling never runs); its
    sequence is cancelled all the same, not decoded to max_tokens."""
    import asyncio

    from gptcli.infer.engine import Engine
    from gptcli.infer.server import Served, create_app

    loaded = load(trained)
    engine = Engine(loaded.model.eval(), max_batch=2)
    app = create_app(Served(engine, loaded.tokenizer, "run", 16, 1_000_000, 2))
    body = json.dumps({"prompt": "The", "max_tokens": 1_000_000, "stream": True}).encode()
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
        "method": "POST", "scheme": "http", "path": "/v1/completions", "raw_path": b"/v1/completions",
        "query_string": b"", "root_path": "", "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80),
    }  # fmt: skip
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            raise OSError("the client is gone")

    async def drive() -> list[tuple[int, int]]:
        with contextlib.suppress(Exception):  # (Starlette's ClientDisconnect)
            await app(scope, receive, send)
        seen = [engine.load()]
        for _ in range(100):
            await asyncio.sleep(0.1)
            seen.append(engine.load())
            if seen[-1] == (0, 0):
                break
        return seen

    try:
        seen = asyncio.run(drive())
        assert seen[-1] == (0, 0), seen
    finally:
        engine.close()


def test_sigterm_stops_it_cleanly_and_frees_the_port(trained):
    s = Server(trained, key=None)
    port = int(s.url.rsplit(":", 1)[1])
    assert s.stop(signal.SIGTERM) == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))  # released


def patched_serve(patch: str, ckpt, *args: str) -> subprocess.Popen:
    """`gptcli serve --port 0 --json` in a child process, after the Python code patch has run."""
    code = f"{patch}\nfrom gptcli.cli.app import main\nmain()"
    cmd = [sys.executable, "-c", code, "serve", "--ckpt", str(ckpt), "--port", "0", "--json", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("GPTCLI_API_KEY", None)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


SLOW_LOAD = """
import sys, time, torch
import gptcli.cli.serve as serve_verb
real = serve_verb.load_model
def load_model(*args, **kwargs):  # a big checkpoint's stand-in: torch at work in the loading thread
    loaded = real(*args, **kwargs)
    print("loading", file=sys.stderr, flush=True)
    x, end = torch.randn(256, 256), time.time() + 60
    while time.time() < end:
        x = torch.tanh(x @ x)
    return loaded
serve_verb.load_model = load_model
"""


def test_ctrl_c_while_the_model_loads_exits_130_at_once(trained):
    """The loading thread cannot be stopped inside torch; the process must still end as
    Ctrl-C ends a verb (130), not be aborted by the C++ runtime at the interpreter's end."""
    proc = patched_serve(SLOW_LOAD, trained)
    try:
        for line in proc.stderr:  # (whatever loading says first)
            if line == "loading\n":
                break
        else:
            raise AssertionError("the model never started loading")
        time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert (proc.returncode, out, err) == (130, "", "")


def test_a_decoding_loop_that_fails_outside_any_step_ends_its_requests_and_the_server(trained):
    """A fault of the engine's loop itself (not of one step, which fails only its sequences):
    the request waiting on it gets an error at once, and the server stops with exit status 1
    and says why, instead of answering every later request that it is busy."""
    patch = """
from gptcli.infer.engine import Engine
class Panic(BaseException):  # (as a Rust library's panic: not an Exception)
    pass
def _iterate(self, joining):
    raise Panic("injected")
Engine._iterate = _iterate
"""
    proc = patched_serve(patch, trained)
    try:
        url = json.loads(proc.stdout.readline())["url"]
        r = httpx.post(url + "/v1/completions", json={"prompt": "The", "max_tokens": 3}, timeout=30)
        assert r.status_code == 500 and "the decoding loop stopped (Panic: injected)" in r.text, r.text
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert err == "error: the decoding loop stopped (Panic: injected); the server stopped\n", err


def test_serve_refuses_a_taken_port_and_says_which_extra_is_missing(trained, monkeypatch):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        result = run("serve", "--ckpt", trained, "--port", sock.getsockname()[1])
    assert result.exit_code == 2 and "cannot listen on 127.0.0.1:" in result.output
    monkeypatch.setitem(sys.modules, "fastapi", None)
    result = run("serve", "--ckpt", trained)
    assert result.exit_code == 2 and "pip install 'gptcli[serve]'" in result.output


def test_serve_loads_its_model_in_the_thread_that_decodes_and_says_what_is_wrong_with_it(
    trained, monkeypatch, tmp_path
):
    import gptcli.cli.serve as serve_verb

    result = run("serve", "--ckpt", tmp_path / "nowhere", "--port", "0")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith("error: ") and "nowhere" in result.output
    loaded_in = []

    def load_model(*args, **kwargs):
        loaded_in.append(threading.current_thread().name)
        raise UsageError("stop here")

    monkeypatch.setattr(serve_verb, "load_model", load_model)
    before = set(threading.enumerate())
    result = run("serve", "--ckpt", trained, "--port", "0")
    assert result.exit_code == 2 and result.output.strip() == "error: stop here", result.output
    assert loaded_in == ["gptcli-engine"]  # the engine's thread (DecodingThread says why)
    for thread in set(threading.enumerate()) - before:  # which ends when the loading fails
        thread.join(timeout=30)
        assert not thread.is_alive(), thread.name


def test_a_client_that_sends_half_a_body_and_hangs_blocks_no_one(server):
    with socket.create_connection(("127.0.0.1", int(server.url.rsplit(":", 1)[1]))) as hung:
        hung.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{"prompt":')
        r = server.client.completions.create(model=server.model, prompt="The", max_tokens=3, temperature=0)
        assert len(r.choices[0].text) == 3


def test_a_request_that_fails_inside_is_a_500_and_the_next_one_is_served(trained):
    """In process (an injected failure in the model), through the app itself."""
    from fastapi.testclient import TestClient

    from gptcli.infer.engine import Engine
    from gptcli.infer.server import Served, create_app

    loaded = load(trained)
    model = loaded.model.eval()
    engine = Engine(model, max_batch=2)
    served = Served(engine, loaded.tokenizer, "run", 16, 16, 2)
    try:
        client = TestClient(create_app(served))
        real = model.next_logits
        model.next_logits = lambda *a, **k: (_ for _ in ()).throw(RuntimeError("injected"))
        r = client.post("/v1/completions", json={"prompt": "The", "max_tokens": 3})
        assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
        assert "decoding failed: injected" in r.json()["error"]["message"]
        model.next_logits = real
        r = client.post("/v1/completions", json={"prompt": "The", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and len(r.json()["choices"][0]["text"]) == 3
    finally:
        engine.close()


def test_cors_is_off_unless_origins_are_named(trained):
    from fastapi.testclient import TestClient

    from gptcli.infer.engine import Engine
    from gptcli.infer.server import Served, create_app

    loaded = load(trained)
    engine = Engine(loaded.model.eval(), max_batch=1)
    try:
        preflight = {"Origin": "http://ui.example", "Access-Control-Request-Method": "POST"}
        closed = TestClient(create_app(Served(engine, loaded.tokenizer, "run", 16, 16, 1)))
        r = closed.options("/v1/completions", headers=preflight)
        assert "access-control-allow-origin" not in r.headers
        assert (
            "access-control-allow-origin"
            not in closed.get("/health", headers={"Origin": "http://ui.example"}).headers
        )
        served = Served(engine, loaded.tokenizer, "run", 16, 16, 1, cors_origins=["http://ui.example"])
        opened = TestClient(create_app(served))
        r = opened.options("/v1/completions", headers=preflight)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://ui.example"
        other = opened.options("/v1/completions", headers={**preflight, "Origin": "http://evil.example"})
        assert other.headers.get("access-control-allow-origin") != "http://evil.example"
    finally:
        engine.close()


def test_a_completion_cut_by_the_server_stopping_is_a_503(trained):
    import threading

    from fastapi.testclient import TestClient

    from gptcli.infer.engine import Engine
    from gptcli.infer.server import Served, create_app

    loaded = load(trained)
    engine = Engine(loaded.model.eval(), max_batch=1)
    client = TestClient(create_app(Served(engine, loaded.tokenizer, "run", 16, 10**6, 1)))
    got = {}
    body = {"prompt": "The", "max_tokens": 10**6}
    worker = threading.Thread(target=lambda: got.setdefault("r", client.post("/v1/completions", json=body)))
    worker.start()
    deadline = time.time() + 30
    while engine.load()[0] == 0 and time.time() < deadline:
        time.sleep(0.05)
    engine.close()
    worker.join(30)
    r = got["r"]
    assert (
        r.status_code == 503
        and "the server is stopping; the completion was cut" in r.json()["error"]["message"]
    )


def test_chat_completions_answer_as_gptcli_chat_does(chat_run):
    """/v1/chat/completions through the openai client, streamed and not, equal `gptcli chat
    --temp 0`; logprobs in chat's shape; what it refuses."""
    s = Server(chat_run, "--max-batch", "4")
    try:
        c = s.client
        for convo in (
            [{"role": "user", "content": "the mole"}],
            [{"role": "system", "content": "be brief"}, {"role": "user", "content": "the fox"}],
            [  # OpenAI's text parts and 'developer' role: the same conversation as chat's
                {"role": "developer", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "the fox"}]},
            ],
            [
                {"role": "user", "content": "the otter"},
                {"role": "assistant", "content": "The otter left a den."},
                {"role": "user", "content": "the badger"},
            ],
        ):
            path = chat_run.parent / f"convo-{len(convo)}.json"
            path.write_text(json.dumps(convo))
            result = run("chat", "--ckpt", chat_run, "--messages", path, "--temp", "0", "--json", "-n", "40")
            ours = json.loads(result.stdout)["reply"]
            r = c.chat.completions.create(model=s.model, messages=convo, temperature=0, max_tokens=40)
            assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
            assert r.choices[0].message.content == ours["text"] and r.choices[0].finish_reason == "stop"
            assert r.usage.completion_tokens == len(ours["ids"]) + 1  # and the end of turn
            chunks = list(
                c.chat.completions.create(
                    model=s.model, messages=convo, temperature=0, max_tokens=40, stream=True
                )
            )
            assert chunks[0].choices[0].delta.role == "assistant"
            assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == ours["text"]
            assert chunks[-1].choices[0].finish_reason == "stop"
        r = c.chat.completions.create(
            model=s.model, messages=convo, temperature=0, max_tokens=40, logprobs=True, top_logprobs=3
        )
        content = r.choices[0].logprobs.content
        assert "".join(t.token for t in content) == r.choices[0].message.content
        assert all(
            len(t.top_logprobs) == 3 and t.top_logprobs[0].logprob >= t.logprob - 1e-6 for t in content
        )
        for kwargs, words in [
            ({"messages": []}, "this request: 'messages' must be a non-empty list"),
            ({"messages": [{"role": "bot", "content": "x"}]}, "'bot'; use system (or developer), user"),
            ({"messages": [{"role": "user", "content": "Ä"}]}, "not in this char tokenizer's vocabulary"),
            (  # (a reply's room: at most an eighth of the block)
                {"messages": [{"role": "user", "content": "the " * 200}]},
                "too long for this model's context (96 tokens, 12 of them kept free for the reply)",
            ),
            ({"messages": convo, "top_logprobs": 2}, "needs 'logprobs': true"),
            (
                {"messages": convo, "response_format": {"type": "json_object"}},
                "'response_format' is not supported",
            ),
            (
                {"messages": convo, "tools": [{"type": "function", "function": {"name": "f"}}]},
                "'tools' is not",
            ),
        ]:
            with pytest.raises(openai.BadRequestError, match=re.escape(words)):
                c.chat.completions.create(model=s.model, **kwargs)
    finally:
        assert s.stop() == 0


def test_a_request_without_max_tokens_takes_16_or_the_servers_limit(trained):
    from gptcli.infer.server import Served, check_completion

    tokenizer = load(trained).tokenizer
    for limit, want in ((10, 10), (1000, 16)):
        served = Served(None, tokenizer, "run", 16, limit, 2)  # type: ignore[arg-type] (no engine needed)
        assert check_completion({"prompt": "The"}, served).max_tokens == want


def test_the_banner_never_repeats_a_key_given_on_the_command_line():
    from gptcli.cli import render

    shown = {}
    for key_from in ("env", "flag", None):
        with render.out.capture() as captured:
            render.serve_banner("http://127.0.0.1:8000", "run", key_from)
        shown[key_from] = captured.get()
    assert 'Bearer $GPTCLI_API_KEY"' in shown["env"]
    assert 'api_key=os.environ["GPTCLI_API_KEY"]' in shown["env"]
    assert 'Bearer KEY"' in shown["flag"] and "KEY: the key given to --api-key" in shown["flag"]
    assert "Bearer" not in shown[None] and 'api_key="none"' in shown[None]
