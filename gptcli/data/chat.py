"""Conversations: the messages format and ChatML, the template that turns them into ids.

A conversation is OpenAI's and Hugging Face's list of messages, `[{"role": "system" |
"user" | "assistant", "content": "..."}, ...]`. ChatML writes each message as

    <|im_start|>{role}\\n{content}<|im_end|>\\n

and a reply is asked for with `<|im_start|>assistant\\n`. ChatML because it is the template
most tools already know (Hugging Face's chat models, llama.cpp's `--chat-template chatml`,
ollama): a gptcli chat model needs no new template anywhere. Only the template emits the
two special ids; the text between them is encoded as plain text, one call per span, as
Hugging Face does, so `apply_chat_template` gives the same ids (CHATML_JINJA is the same
template for it), and a user who types `<|im_end|>` gets those characters, never the id.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from gptcli.data.tokenizer import IM_END, IM_START, Tokenizer
from gptcli.errors import UsageError

ROLES = ("system", "user", "assistant")
Message = dict[str, str]

# the same template as Jinja, for Hugging Face's tokenizer_config.json (and GGUF)
CHATML_JINJA = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _is_text_part(part: object) -> bool:
    """OpenAI's {"type": "text", "text": "..."} part of a message's content."""
    return isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)


def check_messages(value: object, where: str, *, training: bool = False) -> list[Message]:
    """The messages of a conversation, or a one-line error naming where they came from.
    OpenAI's other shapes of the same thing are taken: a content that is a list of text
    parts, and the role 'developer' (its newer name for system). Training (and eval)
    records must also have non-empty contents and an assistant turn to learn from, and may
    not open with the assistant."""
    if not isinstance(value, list) or not value:
        raise UsageError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
    out: list[Message] = []
    for n, m in enumerate(value, 1):
        if not isinstance(m, dict):
            raise UsageError(f"{where}: message {n} is not an object with a role and a content")
        role, content = m.get("role"), m.get("content")
        role = "system" if role == "developer" else role
        if isinstance(content, list) and all(_is_text_part(p) for p in content):
            content = "".join(p["text"] for p in content)
        if role not in ROLES:
            use = "use system (or developer), user or assistant"
            has = "has no role" if role is None else f"has role {role!r}"
            raise UsageError(f"{where}: message {n} {has}; {use}")
        if isinstance(content, list):  # parts, not all of them text
            other = [p for p in content if not _is_text_part(p)]
            for i, p in enumerate(content, 1):  # a text part without its text: said as such
                if isinstance(p, dict) and p.get("type") == "text" and not isinstance(p.get("text"), str):
                    text = p.get("text")
                    what = "no 'text'" if text is None else f"a 'text' not a string ({type(text).__name__})"
                    raise UsageError(f"{where}: message {n}'s part {i} is a text part with {what}")
            kinds = sorted({str(p.get("type")) if isinstance(p, dict) else type(p).__name__ for p in other})
            raise UsageError(
                f"{where}: message {n}'s content holds parts other than text ({', '.join(kinds)}); this "
                'model reads text: give a string, or {"type": "text", "text": ...} parts'
            )
        if not isinstance(content, str):
            what = "missing" if content is None else f"not a string ({type(content).__name__})"
            raise UsageError(f"{where}: message {n}'s content is {what}")
        if role == "system" and n > 1:
            raise UsageError(f"{where}: message {n} is a system message; only the first may be one")
        if training and not content:
            raise UsageError(f"{where}: message {n}'s content is empty; there would be nothing to learn")
        out.append({"role": role, "content": content})
    if training:
        turns = [m["role"] for m in out if m["role"] != "system"]
        if "assistant" not in turns:
            raise UsageError(f"{where}: the conversation has no assistant turn to learn from")
        if turns[0] == "assistant":
            raise UsageError(f"{where}: the conversation opens with the assistant; start with a user turn")
    return out


@dataclass
class Rendered:
    """A conversation as token ids, with which ids are the assistant's to learn (its
    content and its end of turn)."""

    ids: list[int] = field(default_factory=list)
    trained: list[bool] = field(default_factory=list)

    def __add__(self, other: Rendered) -> Rendered:
        return Rendered(self.ids + other.ids, self.trained + other.trained)

    def __len__(self) -> int:
        return len(self.ids)


def _special(tokenizer: Tokenizer, text: str) -> int:
    if not tokenizer.has_chat:
        raise UsageError("this model has no chat template; finetune it with --task chat first")
    return tokenizer.special_tokens[text]


def render_message(tokenizer: Tokenizer, message: Message, keep_last: int | None = None) -> Rendered:
    """One message: <|im_start|> role\\n content <|im_end|> \\n. The role line and the content
    are one span of text, encoded in one call; the tokens that reach into the content are
    the ones an assistant message trains. keep_last: keep only that many content tokens
    (the latest), for a message too long for the block."""
    span, in_content = _span(tokenizer, message)
    if keep_last is not None:
        head = in_content.index(True) if True in in_content else len(span)
        tail = max(head, len(span) - keep_last)
        span, in_content = span[:head] + span[tail:], in_content[:head] + in_content[tail:]
    learn = message["role"] == "assistant"
    ids = [_special(tokenizer, IM_START), *span, _special(tokenizer, IM_END), *tokenizer.encode("\n")]
    trained = [False, *(learn and c for c in in_content), learn] + [False] * (len(ids) - len(span) - 2)
    return Rendered(ids, trained)


def _span(tokenizer: Tokenizer, message: Message) -> tuple[list[int], list[bool]]:
    """The ids of a message's text span (role line and content), and which reach into the content."""
    header = message["role"] + "\n"
    span = tokenizer.encode(header + message["content"])
    in_content, end = [], 0
    for t in span:
        end += len(tokenizer.token_bytes(t))
        in_content.append(end > len(header.encode("utf-8")))
    return span, in_content


def generation_prompt(tokenizer: Tokenizer) -> list[int]:
    """What asks the model for the assistant's reply: <|im_start|>assistant\\n."""
    return [_special(tokenizer, IM_START), *tokenizer.encode("assistant\n")]


def render_text(messages: Sequence[Message], add_generation_prompt: bool = False) -> str:
    """The conversation as ChatML text (what CHATML_JINJA renders)."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def render(
    tokenizer: Tokenizer, messages: Sequence[Message], add_generation_prompt: bool = False
) -> Rendered:
    """The whole conversation (plus the generation prompt), as apply_chat_template renders it."""
    out = Rendered()
    for m in messages:
        out += render_message(tokenizer, m)
    if add_generation_prompt:
        prompt = generation_prompt(tokenizer)
        out += Rendered(prompt, [False] * len(prompt))
    return out


@dataclass
class Fitted:
    """A conversation cut to fit: what was dropped and cut to make it fit."""

    rendered: Rendered
    messages: list[Message]
    dropped: int = 0  # oldest messages left out (the system message is kept)
    cut: int = 0  # tokens cut from the left of the last message, when even it did not fit alone


class TooLong(UsageError):
    """A conversation that cannot be cut to fit (the server answers it with
    context_length_exceeded)."""


def fit(
    tokenizer: Tokenizer,
    messages: Sequence[Message],
    limit: int,
    add_generation_prompt: bool = False,
    training: bool = False,
) -> Fitted:
    """The conversation in at most limit tokens. The oldest turns go first (the system
    message stays), whole exchanges at a time, so that what is kept starts with a user turn;
    the last user turn and what follows it always stay. If they are still too long, the
    last user turn loses content from its left; then, in training, the end of the sequence
    is cut (the reply is learnt as far as it fits); otherwise that is an error (TooLong)."""
    parts = [render_message(tokenizer, m) for m in messages]
    tail = Rendered(generation_prompt(tokenizer) if add_generation_prompt else [])
    tail.trained = [False] * len(tail.ids)
    system = 1 if messages and messages[0]["role"] == "system" else 0
    users = [i for i, m in enumerate(messages) if m["role"] == "user"]
    last_user = users[-1] if users else len(messages) - 1

    def size(chosen: list[Rendered]) -> int:
        return sum(map(len, chosen)) + len(tail)

    start = system
    while size(parts[:system] + parts[start:]) > limit and start < last_user:
        start += 1
        while start < last_user and messages[start]["role"] != "user":  # a whole exchange goes
            start += 1
    chosen, cut = parts[:system] + parts[start:], 0
    over = size(chosen) - limit
    if over > 0 and last_user >= start and users:  # the last user turn keeps its latest content
        at = system + last_user - start
        keep = max(0, sum(_span(tokenizer, messages[last_user])[1]) - over)
        shorter = render_message(tokenizer, messages[last_user], keep_last=keep)
        cut, chosen[at] = len(chosen[at]) - len(shorter), shorter
    out = Rendered()
    for p in [*chosen, tail]:
        out += p
    if len(out) > limit:
        if not training:
            what = "the system message, " if system else ""
            raise TooLong(
                f"{what}the template's markers and the turns after the last user message take more than "
                f"the {limit} tokens the model can take here; shorten them"
            )
        out = Rendered(out.ids[:limit], out.trained[:limit])
    kept = list(messages[:system]) + list(messages[start:])
    return Fitted(out, kept, start - system, cut)
