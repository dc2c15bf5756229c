"""The tokenization and prompt budgeting an engine builds on its executor's Vocabulary
(executor_api.py): template text may hold special tokens, typed text never."""

from __future__ import annotations

from typing import Sequence

from localchat.engine.base import Message, ModelInfo, Request, Tool
from localchat.engine.runtime.executor_api import Vocabulary
from localchat.engine.runtime.stream import check_prompt_fits
from localchat.errors import TemplateError
from localchat.models.facts import GGUFFacts
from localchat.prompt.format_prompt import with_format_instruction


def messages_of(request: Request):
    """The request's messages, with its JSON constraint said in the system turn where asked
    (Request.format_prompt)."""
    c = request.constraint
    if c is None or not request.format_prompt:
        return request.messages
    return with_format_instruction(request.messages, c.kind, c.text)


class VocabMixin:
    """An engine's tokenization through its `vocab`, and the prompt/budget preparation
    every generate() starts with."""

    vocab: Vocabulary
    facts: GGUFFacts
    info: ModelInfo

    def tokenize_messages(self, messages: Sequence[Message],
                          tools: Sequence[Tool] = ()) -> list[int]:
        try:
            return self.vocab.tokenize_messages(self.facts.chat_template, messages, tools)
        except TemplateError:
            self._refuse_if_oversize(messages)
            raise

    def _refuse_if_oversize(self, messages: Sequence[Message]) -> None:
        """A prompt too large for the template's output limit is too large for the context
        too: say so in tokens, as a prompt that rendered would be told. Uses self.vocab
        directly: the caller may hold the engine's vocabulary lock."""
        if sum(len(m.content) for m in messages) >= self.info.n_ctx:
            n_tokens = sum(len(self.vocab.tokenize_text(m.content)) for m in messages)
            check_prompt_fits(n_tokens, self.info.n_ctx, self.info.n_ctx_train)

    def count_prompt_tokens(self, messages: Sequence[Message]) -> int:
        return len(self.tokenize_messages(messages))

    def tokenize_text(self, text: str) -> list[int]:
        """Plain text to tokens (no special-token parsing), for tests and benchmarks."""
        return self.vocab.tokenize_text(text)

    def is_end_of_generation(self, token: int) -> bool:
        return self.vocab.is_end_of_generation(token)

    def prompt_and_budget(self, request: Request) -> tuple[list[int], int]:
        """The prompt's tokens, and how many may be generated after them."""
        prompt = (list(request.prompt_tokens) if request.prompt_tokens is not None
                  else self.tokenize_messages(messages_of(request), request.tools))
        if request.assistant_prefix:  # continuing a reply: the prompt ends with its text
            prompt += self.tokenize_text(request.assistant_prefix)
        check_prompt_fits(len(prompt), self.info.n_ctx, self.info.n_ctx_train)
        budget = self.info.n_ctx - len(prompt)
        return prompt, budget if request.max_tokens is None else min(budget, request.max_tokens)
