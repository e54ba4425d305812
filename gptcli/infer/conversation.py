"""A conversation with a chat model: the history, rendered by the chat template to fit the
model's context, and each reply decoded until the model's end of turn. `gptcli chat` and
the server's /v1/chat/completions both go through here."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gptcli.data import chat
from gptcli.data.tokenizer import Tokenizer
from gptcli.errors import UsageError
from gptcli.infer.completion import Prompt, Sampled, TopK, complete
from gptcli.infer.generate import SAMPLE, Sampling
from gptcli.model import GPT


def reply_room(block_size: int, max_new_tokens: int) -> int:
    """The tokens of the context kept free for the reply: max_new_tokens, at most an eighth
    of the block, so that the history keeps as much as it can (a longer reply slides the
    window past its oldest tokens, as sample does)."""
    return max(1, min(max_new_tokens, block_size // 8))


def chat_prompt(
    tokenizer: Tokenizer, messages: Sequence[chat.Message], block_size: int, max_new_tokens: int
) -> chat.Fitted:
    """The messages and the generation prompt, in what the reply leaves of the block."""
    if not tokenizer.has_chat:
        raise UsageError(
            "this model has no chat template; make a chat model with `gptcli finetune --ckpt RUN DATA "
            "--task chat`"
        )
    return chat.fit(tokenizer, messages, block_size - reply_room(block_size, max_new_tokens), True)


@dataclass
class Conversation:
    """The history of a conversation (the system message apart), as `gptcli chat` keeps it."""

    tokenizer: Tokenizer
    block_size: int
    system: str | None = None
    turns: list[chat.Message] = field(default_factory=list)
    warned: bool = False  # whether it was said that the oldest turns no longer fit

    @property
    def messages(self) -> list[chat.Message]:
        head = [{"role": "system", "content": self.system}] if self.system is not None else []
        return head + self.turns

    def reply(
        self,
        model: GPT,
        text: str,
        *,
        max_new_tokens: int,
        sampling: Sampling = SAMPLE,
        seed: int | None = None,
        show_probs: int = 0,
        on_text: Callable[[str], None] | None = None,
        on_step: Callable[[TopK], None] | None = None,
        on_fit: Callable[[chat.Fitted], None] | None = None,
    ) -> Sampled:
        """Add the user's text, answer it, and keep the answer (what was said of it, if
        interrupted). on_fit sees how the history was cut to fit, before decoding."""
        self.turns.append({"role": "user", "content": text})
        try:
            fitted = chat_prompt(self.tokenizer, self.messages, self.block_size, max_new_tokens)
        except UsageError:
            self.turns.pop()
            raise
        if on_fit is not None:
            on_fit(fitted)
        said: list[str] = []

        def heard(i: int, delta: str) -> None:
            said.append(delta)
            if on_text is not None:
                on_text(delta)

        try:
            (result,) = complete(
                model,
                self.tokenizer,
                Prompt(fitted.rendered.ids, ""),
                max_new_tokens=max_new_tokens,
                sampling=sampling,
                seed=seed,
                show_probs=show_probs,
                on_text=heard,
                on_step=(lambda i, top: on_step(top)) if on_step is not None else None,
            )
        except KeyboardInterrupt:  # stopped by the user: what was said stays said
            self.turns.append({"role": "assistant", "content": "".join(said)})
            raise
        self.turns.append({"role": "assistant", "content": result.text})
        return result
