"""The OpenAI-compatible HTTP API over the engine (engine.py): /v1/completions (streamed
or not, echo and logprobs for scoring), /v1/chat/completions (a chat model's template,
gptcli/infer/conversation.py, makes the prompt), /v1/models, /health, /tokenize,
/detokenize, and the playground page at / (playground.html).

Requests are checked here, field by field, and every refusal is OpenAI's error body with
its status. Built on FastAPI (the `serve` extra), imported only when a server is made.
"""

# no `from __future__ import annotations`: FastAPI reads the handlers' annotations (Request),
# which live inside create_app, at run time
import asyncio
import hmac
import json
import math
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptcli.config.knobs import SEED_MAX
from gptcli.data.chat import TooLong, check_messages
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.infer.completion import TextStream, encode_prompt
from gptcli.infer.conversation import chat_prompt, reply_room
from gptcli.infer.engine import Engine, Event, QueueFull, Scored, Sequence, Unavailable
from gptcli.infer.generate import Sampling, row_generators
from gptcli.messages import printable

PLAYGROUND = Path(__file__).with_name("playground.html")
MAX_LOGPROBS = 20  # OpenAI allows 5; lm-evaluation-harness and the playground ask for more
MAX_STOPS = 16
MAX_STOP_CHARS = 256
MAX_BODY = 1 << 20  # bytes


class ApiError(Exception):
    """A refusal, as OpenAI's error body {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    @property
    def kind(self) -> str:
        return {
            401: "authentication_error",
            404: "not_found_error",
            413: "invalid_request_error",
            429: "rate_limit_error",
        }.get(self.status, "invalid_request_error" if self.status < 500 else "server_error")

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


@dataclass
class Served:
    """The model behind the server and the server's limits."""

    engine: Engine
    tokenizer: Tokenizer
    name: str
    block_size: int
    max_tokens_limit: int
    max_batch: int
    api_key: str | None = None
    cors_origins: list[str] = field(default_factory=list)
    created: int = field(default_factory=lambda: int(time.time()))


# --- checking a request ----------------------------------------------------------------------


@dataclass
class Completion:
    """A checked /v1/completions request."""

    prompts: list[list[int]]
    max_tokens: int
    sampling: Sampling
    n: int
    stops: list[str]
    seed: int | None
    stream: bool
    include_usage: bool
    echo: bool
    logprobs: int | None
    chat: bool = False  # a /v1/chat/completions request: its answers take chat's shapes


def _int(body: dict, name: str, default: int | None, lo: int, hi: int) -> int | None:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise ApiError(400, f"'{name}' must be an integer; got {json.dumps(value)[:40]}", name)
    if not lo <= value <= hi:
        raise ApiError(400, f"'{name}' must be between {lo} and {hi}; got {value}", name)
    return value


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"'{name}' must be a finite number; got {json.dumps(value)[:40]}", name)
    if value < lo or value > hi or (lo_open and value == lo):
        raise ApiError(
            400,
            f"'{name}' must be {'above' if lo_open else 'at least'} {lo} and at most {hi}; got {value}",
            name,
        )
    return float(value)


def _bool(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise ApiError(400, f"'{name}' must be true or false", name)
    return value


def _prompts(body: dict, served: Served) -> list[list[int]]:
    """The prompt field (a string, strings, token ids, lists of token ids) as token ids."""
    if "prompt" not in body:
        raise ApiError(400, "'prompt' is required (a string, a list of strings or of token ids)", "prompt")
    prompt = body["prompt"]
    tok, vocab = served.tokenizer, served.tokenizer.vocab_size
    if isinstance(prompt, str):
        items: list[Any] = [prompt]
    elif (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        items = [prompt]
    elif isinstance(prompt, list) and prompt:
        items = prompt
    else:
        raise ApiError(
            400, "'prompt' must be a string, a list of strings or a non-empty list of token ids", "prompt"
        )
    if len(items) > served.max_batch:  # before encoding any of them
        raise ApiError(
            400, f"{len(items)} prompts in one request; at most {served.max_batch} (--max-batch)", "prompt"
        )
    out = []
    for item in items:
        if isinstance(item, str):
            try:
                ids = encode_prompt(tok, item, served.block_size + len(item) + 1).ids
            except UsageError as e:  # text the tokenizer cannot encode
                raise ApiError(400, str(e), "prompt") from None
        elif (
            isinstance(item, list)
            and item
            and all(isinstance(t, int) and not isinstance(t, bool) for t in item)
        ):
            bad = [t for t in item if not 0 <= t < vocab]
            if bad:
                raise ApiError(
                    400, f"token id {bad[0]} is outside the vocabulary (0 to {vocab - 1})", "prompt"
                )
            ids = list(item)
        else:
            raise ApiError(400, "each prompt must be a string or a non-empty list of token ids", "prompt")
        if len(ids) > served.block_size:
            raise ApiError(
                400,
                f"the prompt has {len(ids)} tokens; this model attends to at most {served.block_size}",
                "prompt",
                "context_length_exceeded",
            )
        out.append(ids)
    return out


def check_completion(body: Any, served: Served) -> Completion:
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model is not None and model != served.name:
        raise ApiError(
            404,
            f"the model '{str(model)[:80]}' does not exist; this server has '{served.name}'",
            "model",
            "model_not_found",
        )
    for name, neutral in (
        ("best_of", 1),
        ("suffix", ""),
        ("presence_penalty", 0),
        ("frequency_penalty", 0),
    ):
        if body.get(name, neutral) not in (neutral, None):
            raise ApiError(400, f"'{name}' is not supported by this server", name)
    if body.get("logit_bias"):
        raise ApiError(400, "'logit_bias' is not supported by this server", "logit_bias")
    prompts = _prompts(body, served)
    max_tokens = _int(body, "max_tokens", min(16, served.max_tokens_limit), 0, served.max_tokens_limit)
    temperature = _number(body, "temperature", 1.0, 0.0, 1e4)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = _int(body, "top_k", None, -1, 1 << 30)
    n = _int(body, "n", 1, 1, served.max_batch)
    assert max_tokens is not None and n is not None
    if n * len(prompts) > served.max_batch:
        raise ApiError(
            400, f"n x prompts is {n * len(prompts)}; at most {served.max_batch} (--max-batch)", "n"
        )
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if stop is not None else []
    if (
        not isinstance(stops, list)
        or not all(isinstance(s, str) and len(s) <= MAX_STOP_CHARS for s in stops)
        or len(stops) > MAX_STOPS
    ):
        each = f"at most {MAX_STOPS}, each of at most {MAX_STOP_CHARS} characters"
        raise ApiError(400, f"'stop' must be a string or a list of strings, {each}", "stop")
    seed = _int(body, "seed", None, 0, SEED_MAX - n + 1)  # (choice i draws from seed + i)
    stream = _bool(body, "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise ApiError(400, "'stream_options' must be an object", "stream_options")
    echo = _bool(body, "echo")
    logprobs = _int(body, "logprobs", None, 0, min(MAX_LOGPROBS, served.tokenizer.vocab_size))
    if echo and logprobs is not None:  # scoring: every token must be seen in one window
        for ids in prompts:
            if len(ids) + max_tokens > served.block_size:
                raise ApiError(
                    400,
                    f"the prompt's {len(ids)} tokens and max_tokens {max_tokens} exceed the "
                    f"{served.block_size} this model attends to, which scoring needs",
                    "max_tokens",
                    "context_length_exceeded",
                )
    sampling = Sampling(temperature, top_k if top_k and top_k > 0 else None, top_p if top_p < 1 else None)
    return Completion(
        prompts, max_tokens, sampling, n, [s for s in stops if s], seed, stream,
        bool(options.get("include_usage")) and stream, echo, logprobs,
    )  # fmt: skip


def check_chat(body: Any, served: Served) -> Completion:
    """A checked /v1/chat/completions request: the messages rendered by the chat template
    (as `gptcli chat` renders them) become the prompt of a completion."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if not served.tokenizer.has_chat:
        raise ApiError(
            400,
            f"the model '{served.name}' has no chat template; use /v1/completions (or finetune "
            "it with --task chat)",
            "messages",
        )
    try:  # (OpenAI's text parts and 'developer' role taken too)
        messages = check_messages(body.get("messages"), "this request")
    except UsageError as e:
        raise ApiError(400, str(e), "messages") from None
    if body.get("echo") or body.get("prompt") is not None:
        raise ApiError(400, "'echo' and 'prompt' belong to /v1/completions", "messages")
    limit_name = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _int(body, limit_name, served.max_tokens_limit, 1, served.max_tokens_limit)
    assert max_tokens is not None
    try:
        fitted = chat_prompt(served.tokenizer, messages, served.block_size, max_tokens)
    except UsageError as e:  # text the tokenizer cannot encode, a system message too long
        code = "context_length_exceeded" if isinstance(e, TooLong) else None
        raise ApiError(400, str(e), "messages", code) from None
    if fitted.cut:
        room = reply_room(served.block_size, max_tokens)
        raise ApiError(
            400,
            f"the last message is {fitted.cut} tokens too long for this model's context "
            f"({served.block_size} tokens, {room} of them kept free for the reply)",
            "messages",
            "context_length_exceeded",
        )
    for name, neutral in (
        ("tools", []),
        ("functions", []),
        ("tool_choice", "none"),
        ("function_call", "none"),
    ):
        if body.get(name, neutral) not in (neutral, None):  # a client would wait for calls never made
            raise ApiError(400, f"'{name}' is not supported by this server: it writes text only", name)
    if body.get("response_format") not in (None, {"type": "text"}):
        raise ApiError(
            400, "'response_format' is not supported by this server: it writes text only", "response_format"
        )
    logprobs = _bool(body, "logprobs")
    top = _int(body, "top_logprobs", None, 0, min(MAX_LOGPROBS, served.tokenizer.vocab_size))
    if top is not None and not logprobs:
        raise ApiError(400, "'top_logprobs' needs 'logprobs': true", "top_logprobs")
    rest = {k: v for k, v in body.items() if k not in ("messages", "max_completion_tokens", "top_logprobs")}
    rest |= {
        "prompt": fitted.rendered.ids,
        "max_tokens": max_tokens,
        "logprobs": (top or 0) if logprobs else None,
    }
    req = check_completion(rest, served)
    req.chat = True
    return req


# --- running one --------------------------------------------------------------------------------


def token_text(tok: Tokenizer, token: int) -> str:
    """A token's text for logprobs: its characters, or `bytes:\\xNN...` when its bytes are
    not UTF-8 on their own (so that keys stay distinct)."""
    raw = tok.token_bytes(token)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class Choice:
    """One continuation of one prompt: its text so far, its tokens' scores, its end."""

    def __init__(self, index: int, served: Served, prompt: list[int], req: Completion) -> None:
        self.index, self.served, self.req = index, served, req
        self.ids = list(prompt)  # the prompt's ids, then the generated ones (for text_offset)
        self.prompt_text = served.tokenizer.decode(prompt)
        self.text = TextStream(served.tokenizer, req.stops)
        self.echoed = not req.echo  # the prompt's text is handed out first, once, with echo
        self.finish: str | None = None
        self.generated = 0
        keys = ("content",) if req.chat else ("tokens", "token_logprobs", "top_logprobs", "text_offset")
        self.logprobs: dict[str, list[Any]] = {k: [] for k in keys}
        self.seq: Sequence | None = None
        self.started = False  # a streamed chat choice's first chunk carries the role

    def _score(self, scored: list[Scored], start: int) -> dict[str, list[Any]]:
        """The logprobs fields for tokens ids[start:start + len(scored)]; a token's offset is
        where its text starts in the prompt's text followed by the completion's. A chat
        request's are OpenAI's chat shape: {"content": [{token, logprob, bytes, top_logprobs}]}."""
        tok = self.served.tokenizer
        part: dict[str, list[Any]] = {k: [] for k in self.logprobs}

        def entry(t: int, lp: float | None) -> dict[str, Any]:
            return {"token": token_text(tok, t), "logprob": lp, "bytes": list(tok.token_bytes(t))}

        for i, s in enumerate(scored):
            if self.req.chat:
                part["content"].append(
                    {**entry(s.id, s.logprob), "top_logprobs": [entry(t, lp) for t, lp in s.top]}
                )
                continue
            part["tokens"].append(token_text(tok, s.id))
            part["token_logprobs"].append(s.logprob)
            # OpenAI's rule: the token itself is always among them (up to logprobs + 1 entries)
            part["top_logprobs"].append(
                None
                if s.logprob is None
                else {token_text(tok, t): lp for t, lp in s.top} | {token_text(tok, s.id): s.logprob}
            )
            part["text_offset"].append(len(tok.decode(self.ids[: start + i])))
        if not self.req.stream:
            for key, values in part.items():
                self.logprobs[key].extend(values)
        return part

    def on_event(self, event: Event) -> tuple[str, dict[str, list[Any]] | None]:
        """The text this event makes final, and the scores it brings."""
        prefix, scores = "", None
        if not self.echoed:
            prefix, self.echoed = self.prompt_text, True
        if event.kind == "prompt":
            if self.req.echo and self.req.logprobs is not None:
                scores = self._score(event.scored, 0)
            return prefix, scores
        if self.finish is not None:
            return prefix, None
        if event.kind == "token":
            token = event.scored[0].id
            self.generated += 1
            self.ids.append(token)
            delta = self.text.push(token)
            if self.req.logprobs is not None and token not in self.served.tokenizer.end_ids:
                scores = self._score(event.scored, len(self.ids) - 1)
            if self.text.done:
                self.finish = "stop"
                if self.seq is not None:
                    self.seq.cancel()
            return prefix + delta, scores
        if event.kind == "done" and event.finish == "cancelled":  # not by us: the server stops
            raise ApiError(
                503, f"the server is stopping; the completion was cut after {self.generated} tokens"
            )
        if event.kind == "done":
            delta = self.text.close("length")
            self.finish = "stop" if event.finish == "stop" else "length"
            return prefix + delta, None
        raise ApiError(500, event.message or "decoding failed")


class Run:
    """One request's choices, decoded by the engine, their events on an asyncio queue."""

    def __init__(self, served: Served, req: Completion, loop: asyncio.AbstractEventLoop) -> None:
        self.served, self.req = served, req
        self.queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()
        self.choices: list[Choice] = []
        seqs = []
        for p, prompt in enumerate(req.prompts):
            gens = (
                row_generators(req.seed, req.n, served.engine.device)
                if not req.sampling.greedy
                else [None] * req.n
            )
            for j in range(req.n):
                index = p * req.n + j
                choice = Choice(index, served, prompt, req)

                def emit(event: Event, index: int = index) -> None:
                    loop.call_soon_threadsafe(self.queue.put_nowait, (index, event))

                choice.seq = Sequence(
                    prompt, req.max_tokens, req.sampling, gens[j], emit,
                    logprobs=req.logprobs, score_prompt=req.echo and req.logprobs is not None,
                    end_ids=served.tokenizer.end_ids,
                )  # fmt: skip
                self.choices.append(choice)
                seqs.append(choice.seq)
        self.prompt_tokens = sum(len(p) for p in req.prompts)
        try:
            served.engine.submit(seqs)
        except QueueFull as e:
            raise ApiError(
                429, f"the server is busy: {e}; try again shortly", code="rate_limit_exceeded"
            ) from e
        except Unavailable as e:
            raise ApiError(503, str(e)) from e

    def cancel(self) -> None:
        for c in self.choices:
            if c.seq is not None:
                c.seq.cancel()

    async def events(self) -> AsyncIterator[tuple[Choice, str, dict | None, bool]]:
        """(choice, text, scores, finished) as the engine reports them, until every choice
        has ended (each counted once)."""
        ended: set[int] = set()
        while len(ended) < len(self.choices):
            index, event = await self.queue.get()
            if index in ended:
                continue
            choice = self.choices[index]
            text, scores = choice.on_event(event)
            done = event.kind in ("done", "error")
            if done:
                ended.add(index)
            yield choice, text, scores, done

    def usage(self) -> dict[str, int]:
        completion = sum(c.generated for c in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": self.prompt_tokens + completion,
        }


# --- the app --------------------------------------------------------------------------------------


def create_app(served: Served) -> Any:
    """The FastAPI app serving `served`."""
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse, Response, StreamingResponse
    from starlette.exceptions import HTTPException

    app = FastAPI(title="gptcli", docs_url=None, redoc_url=None, openapi_url=None)
    if served.cors_origins:
        from fastapi.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=served.cors_origins, allow_methods=["*"], allow_headers=["*"]
        )

    def error(e: ApiError) -> Response:
        headers = {"Retry-After": "1"} if e.status == 429 else None
        return Response(_json(e.body()), status_code=e.status, headers=headers, media_type="application/json")

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, e: ApiError) -> Response:
        return error(e)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, e: HTTPException) -> Response:
        if e.status_code == 404:
            where = "see GET /v1/models and POST /v1/completions, /v1/chat/completions"
            message = f"no such path: {printable(request.url.path, 200)}; {where}"
        else:
            message = str(e.detail)
        return error(ApiError(e.status_code, message))

    @app.exception_handler(Exception)
    async def _crash(request: Request, e: Exception) -> Response:
        return error(ApiError(500, f"the server failed on this request: {e}"))

    def check_key(request: Request) -> None:
        """The API key, when the server has one, compared in constant time."""
        if served.api_key is not None:
            given = request.headers.get("authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {served.api_key}".encode()):
                raise ApiError(
                    401, "a valid API key is needed: 'Authorization: Bearer KEY'", code="invalid_api_key"
                )

    async def read_body(request: Request) -> Any:
        check_key(request)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > MAX_BODY:
            raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY:
                raise ApiError(413, f"the request body is over {MAX_BODY} bytes")
        try:
            return json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON ({e})") from None
        except RecursionError:
            raise ApiError(400, "the request body nests JSON too deeply") from None

    @app.get("/")
    async def playground() -> HTMLResponse:
        """The playground: one self-contained page (no CDN) that streams completions."""
        csp = "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'"
        return HTMLResponse(PLAYGROUND.read_text(encoding="utf-8"), headers={"Content-Security-Policy": csp})

    @app.get("/health")
    async def health() -> dict[str, Any]:
        active, waiting = served.engine.load()
        return {"status": "ok", "model": served.name, "active": active, "waiting": waiting}

    def model_card() -> dict[str, Any]:
        return {"id": served.name, "object": "model", "created": served.created, "owned_by": "gptcli"}

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        check_key(request)
        return {"object": "list", "data": [model_card()]}

    @app.get("/v1/models/{model:path}")
    async def model(request: Request, model: str) -> dict[str, Any]:
        check_key(request)
        if model != served.name:
            said = f"no model {printable(model, 200)!r}; this server serves {served.name!r}"
            raise ApiError(404, said, "model", "model_not_found")
        return model_card()

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await read_body(request)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            raise ApiError(400, "'prompt' must be a string", "prompt")
        try:
            ids = served.tokenizer.encode_prompt(body["prompt"]) if body["prompt"] else []
        except UsageError as e:  # text the tokenizer cannot encode
            raise ApiError(400, str(e), "prompt") from None
        return {"tokens": ids, "count": len(ids), "max_model_len": served.block_size}

    @app.post("/detokenize")
    async def detokenize(request: Request) -> dict[str, Any]:
        body = await read_body(request)
        ids = body.get("tokens") if isinstance(body, dict) else None
        vocab = served.tokenizer.vocab_size
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
        ):
            raise ApiError(400, f"'tokens' must be a list of token ids (0 to {vocab - 1})", "tokens")
        return {"prompt": served.tokenizer.decode(ids)}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Any:
        return await answer(request, check_chat(await read_body(request), served))

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        return await answer(request, check_completion(await read_body(request), served))

    async def answer(request: Request, req: Completion) -> Any:
        run = Run(served, req, asyncio.get_running_loop())
        head = {
            "id": f"{'chatcmpl' if req.chat else 'cmpl'}-{secrets.token_hex(12)}",
            "object": "chat.completion" if req.chat else "text_completion",
            "created": int(time.time()),
            "model": served.name,
        }
        # a client that leaves cancels its sequences: watched until the stream starts (a client
        # gone before it starts never starts it), then by the stream itself
        watcher = asyncio.create_task(_cancel_when_gone(request, run))
        if req.stream:
            if req.chat:
                head["object"] = "chat.completion.chunk"
            events, headers = _stream(run, head, watcher), {"Cache-Control": "no-cache"}
            return StreamingResponse(events, media_type="text/event-stream", headers=headers)
        try:
            async for _ in run.events():
                pass
        finally:
            watcher.cancel()
            run.cancel()
        choices = []
        for c in run.choices:
            logprobs = c.logprobs if req.logprobs is not None else None
            if req.chat:
                message = {"role": "assistant", "content": c.text.text}
                choices.append(
                    {"index": c.index, "message": message, "logprobs": logprobs, "finish_reason": c.finish}
                )
                continue
            text = (c.prompt_text if req.echo else "") + c.text.text
            choices.append({"text": text, "index": c.index, "logprobs": logprobs, "finish_reason": c.finish})
        return {**head, "choices": choices, "usage": run.usage()}

    return app


async def _cancel_when_gone(request: Any, run: Run) -> None:
    """A client that disconnects before its completion is ready, or its stream started,
    cancels it."""
    while not await request.is_disconnected():
        await asyncio.sleep(0.25)
    run.cancel()


def _json(obj: Any) -> bytes:
    """obj as JSON in UTF-8; a lone surrogate a request held (and an error quotes) as its
    \\uXXXX escape, which JSON reads back (UTF-8 cannot carry it)."""
    return json.dumps(obj, ensure_ascii=False).encode("utf-8", "backslashreplace")


def _sse(obj: Any) -> bytes:
    return b"data: " + _json(obj) + b"\n\n"


async def _stream(run: Run, head: dict[str, Any], watcher: asyncio.Task) -> AsyncIterator[bytes]:
    """Server-sent events: a chunk per event that brings text, scores or an end; usage
    last when asked for; then [DONE]. A client that goes away cancels its sequences."""
    watcher.cancel()
    try:
        async for choice, text, scores, ended in run.events():
            finish = choice.finish if ended else None
            if not text and scores is None and finish is None:
                continue
            if run.req.chat:  # a delta of the assistant's message, the role in the first
                delta = {"content": text} if text else {}
                if not choice.started:
                    delta = {"role": "assistant", "content": text}
                choice.started = True
                chunk = {"index": choice.index, "delta": delta, "logprobs": scores, "finish_reason": finish}
            else:
                chunk = {"text": text, "index": choice.index, "logprobs": scores, "finish_reason": finish}
            yield _sse({**head, "choices": [chunk]})
        if run.req.include_usage:
            yield _sse({**head, "choices": [], "usage": run.usage()})
        yield b"data: [DONE]\n\n"
    except ApiError as e:
        yield _sse(e.body())
        yield b"data: [DONE]\n\n"
    finally:
        run.cancel()
