"""`gptcli chat`: talk to a chat model (one finetuned with --task chat) in the terminal, or
answer one message or a conversation from a file and exit. Its flags are
config.verbs.ChatSettings; the conversation itself is gptcli/infer/conversation.py."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptcli.cli import render
from gptcli.cli.common import load_model, start_decoding, text_arg
from gptcli.config.verbs import ChatSettings
from gptcli.errors import GptcliError, UsageError

if TYPE_CHECKING:
    from gptcli.data.chat import Fitted, Message
    from gptcli.infer.completion import Sampled
    from gptcli.infer.conversation import Conversation

COMMANDS = {
    "/reset": "forget the conversation (the system message stays)",
    "/system TEXT": "set the system message (/system alone removes it)",
    "/save FILE": 'write the conversation to FILE as {"messages": [...]}',
    "/exit": "leave (as does Ctrl-D)",
    "/help": "this list",
}
BLOCK = '"""'  # a line of three quotes opens and closes a message of several lines


def chat(s: ChatSettings) -> None:
    """Talk to a chat model.

    gptcli chat --ckpt runs/animals-chat                    a conversation in the terminal
    gptcli chat --system "Answer in one sentence." --temp 0
    gptcli chat --message "What does the fox dig?" --json   answer once, as JSON
    gptcli chat --messages conversation.json                answer the conversation's last turn
    """
    from gptcli.infer.conversation import Conversation
    from gptcli.infer.generate import Sampling

    sampling = Sampling(s.temp, s.top_k, s.top_p)
    for value, flag in ((s.system, "--system"), (s.message, "--message")):
        if value is not None:
            text_arg(value, flag)
    given = _read_messages(s.messages) if s.messages is not None else None
    if given is not None and s.system is not None and given[0]["role"] == "system":
        raise UsageError(f"{s.messages} has a system message; drop --system or remove it from the file")
    loaded = load_model(s.ckpt, s.device, s.dtype, base=s.base, quantize=s.quantize, chat=True, decoding=True)
    tok = loaded.tokenizer
    if not tok.has_chat:
        raise UsageError(
            f"{loaded.path} has no chat template; make a chat model from it with "
            "`gptcli finetune --ckpt RUN DATA --task chat`"
        )
    convo = Conversation(tok, loaded.model.config.block_size, s.system)
    if given is not None or s.message is not None:
        if given is not None:
            if given[0]["role"] == "system":
                convo.system, given = given[0]["content"], given[1:]
            convo.turns, text = given[:-1], given[-1]["content"]
        else:
            text = s.message or ""
        for content in (convo.system or "", *(m["content"] for m in convo.turns), text):
            tok.encode(content)  # (a text it cannot encode is refused before anything starts)
        start_decoding(loaded)
        _answer_once(loaded.model, convo, text, s, sampling)
    else:
        start_decoding(loaded)
        _talk(loaded.model, convo, s, sampling, str(loaded.path))


def _read_messages(path: Path) -> list[Message]:
    """--messages FILE: a JSON list of messages, or {"messages": [...]}, ending with a user turn."""
    from gptcli.data.chat import check_messages
    from gptcli.data.inputs import check_input, read_json

    check_input(path, "--messages")
    doc = read_json(path, 'it must be a JSON list of {"role", "content"} messages')
    if isinstance(doc, dict) and "messages" in doc:
        doc = doc["messages"]
    messages = check_messages(doc, str(path))
    if messages[-1]["role"] != "user":
        raise UsageError(
            f"{path}: the last message is the {messages[-1]['role']}'s; end with a user turn to answer"
        )
    return messages


class _Callbacks:
    """What a reply shows as it is made: the first token's table, the text, the history cut."""

    def __init__(self, convo: Conversation, stream: bool, sampling: str) -> None:
        self.convo, self.stream, self.sampling = convo, stream, sampling
        self.started, self.context = False, ""

    def fit(self, fitted: Fitted) -> None:
        if fitted.dropped and not self.convo.warned:
            self.convo.warned = True
            render.warning(
                f"the conversation no longer fits the model's context ({self.convo.block_size} tokens, "
                f"room kept for the reply): its oldest turns are left out from now on (the system "
                "message stays)"
            )
        if fitted.cut:
            render.warning(
                f"the message is too long for the model's context; its first {fitted.cut} tokens are left out"
            )
        self.context = self.convo.turns[-1]["content"]

    def step(self, top: Any) -> None:
        from gptcli.cli.sample import show_step

        if not self.started:  # the reply's first token: its table comes before its text
            self.started = True
            show_step(self.convo.tokenizer, self.context, top, self.sampling)

    def text(self, delta: str) -> None:
        if self.stream:
            render.stream_text(delta, style="bold")


def _reply(
    model: Any, convo: Conversation, text: str, s: ChatSettings, sampling: Any, calls: _Callbacks
) -> Sampled:
    calls.started = False
    return convo.reply(
        model,
        text,
        max_new_tokens=s.max_new_tokens,
        sampling=sampling,
        seed=s.seed,
        show_probs=s.show_probs,
        on_text=calls.text,
        on_step=calls.step if s.show_probs and not s.json_out else None,  # (--json: in the document)
        on_fit=calls.fit,
    )


def _answer_once(model: Any, convo: Conversation, text: str, s: ChatSettings, sampling: Any) -> None:
    """--message / --messages: one reply, streamed in a terminal, or as JSON."""
    from gptcli.cli.sample import top_k_json
    from gptcli.infer.conversation import chat_prompt

    stream = render.out.is_terminal and not s.json_out
    result = _reply(model, convo, text, s, sampling, _Callbacks(convo, stream, sampling.describe()))
    if s.json_out:
        prompt = chat_prompt(convo.tokenizer, convo.messages[:-1], convo.block_size, s.max_new_tokens)
        finish = "length" if result.finish == "length" else "stop"
        reply = {"text": result.text, "ids": result.ids, "finish": finish}
        if s.show_probs:  # every step, as sample's --json
            reply["top_k"] = [top_k_json(convo.tokenizer, step) for step in result.steps]
        render.print_json({"prompt_ids": prompt.rendered.ids, "reply": reply})
    elif stream:
        render.stream_text("\n")
    else:
        render.out.print(result.text, markup=False, highlight=False, soft_wrap=True)


def _talk(model: Any, convo: Conversation, s: ChatSettings, sampling: Any, name: str) -> None:
    """The conversation in the terminal, until /exit or Ctrl-D."""
    interactive = sys.stdin.isatty()
    calls = _Callbacks(convo, True, sampling.describe())  # one for the conversation: it warns once
    if interactive:
        render.info(f"chatting with {name}: /help lists the commands, Ctrl-C stops a reply, Ctrl-D leaves")
    while True:
        try:
            text = _read_turn(">>> " if interactive else "")
        except EOFError:
            if interactive:
                render.stream_text("\n")
            return
        except KeyboardInterrupt:
            render.stream_text("\n")
            render.info("(Ctrl-D or /exit leaves)")
            continue
        if not text.strip():
            continue
        try:
            text_arg(text, "the message")
            if text.startswith("/"):
                if _command(convo, text.strip()):
                    return
                continue
            _reply(model, convo, text, s, sampling, calls)
            render.stream_text("\n")
        except KeyboardInterrupt:
            render.stream_text("\n")
            render.info("reply stopped")
        except GptcliError as e:  # a message the model cannot take, a file /save cannot write
            render.error(str(e))
        except OSError as e:
            render.error(f"{e.strerror or e}: {e.filename or ''}".rstrip(": "))


def _read_turn(prompt: str) -> str:
    """One message: a line, or the lines between two lines of three quotes."""
    line = _input(prompt)
    if line.strip() != BLOCK:
        return line
    lines = []
    while (line := _input("... " if prompt else "")).strip() != BLOCK:
        lines.append(line)
    return "\n".join(lines)


def _input(prompt: str) -> str:
    if prompt:
        with contextlib.suppress(ImportError):
            import readline  # noqa: F401  (line editing and history in input())
    return input(prompt)


def _command(convo: Conversation, line: str) -> bool:
    """Run a /command; True to leave."""
    from gptcli import files
    from gptcli.store.layout import refuse_inside_checkpoints

    name, _, arg = line.partition(" ")
    arg = arg.strip()
    if name in ("/exit", "/quit", "/bye"):
        return True
    if name == "/help":
        for usage, what in COMMANDS.items():
            render.info(f"{usage:<14} {what}")
    elif name == "/reset":
        convo.turns.clear()
        convo.warned = False
        render.info("the conversation starts again" + (" (the system message stays)" if convo.system else ""))
    elif name == "/system":
        convo.system = arg or None
        render.info("system message set" if arg else "system message removed")
    elif name == "/save":
        if not arg:
            raise UsageError("/save needs a file name: /save FILE")
        path = Path(arg).expanduser()
        if os.path.lexists(path):
            raise UsageError(f"{path} already exists; /save never replaces a file: choose another name")
        refuse_inside_checkpoints(path, "save it outside the checkpoint")
        files.check_writable(path, replace=False)
        document = json.dumps({"messages": convo.messages}, ensure_ascii=False, indent=2) + "\n"
        files.write_file(path, document, replace=False)
        render.info(f"saved {len(convo.messages)} messages to {path}")
    else:
        raise UsageError(f"unknown command {name}; /help lists them")
    return False
