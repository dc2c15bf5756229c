"""Fitting history into the context window."""

from __future__ import annotations

from typing import Sequence

import pytest

from localchat.chat.context import FitResult, fit_history, fit_to_context
from localchat.engine.base import Message
from localchat.errors import ContextOverflowError


class WordCounter:
    """A stand-in tokenizer: one token per word, plus 2 per message; counts its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: Sequence[Message]) -> int:
        self.calls += 1
        return sum(len(m.content.split()) + 2 for m in messages)


def _chat(turns: int, words: int = 3) -> list[Message]:
    messages = [Message("system", "be nice")]
    for i in range(turns):
        messages.append(Message("user", " ".join([f"q{i}"] * words)))
        messages.append(Message("assistant", " ".join([f"a{i}"] * words)))
    messages.append(Message("user", "newest question"))
    return messages


def test_no_drop_when_it_fits() -> None:
    messages = _chat(3)
    count = WordCounter()
    result = fit_history(messages, count, budget=1000)
    assert result == FitResult(tuple(messages), 0, count(messages))
    assert count.calls == 2  # the fit call, plus ours just above


def test_drops_exactly_the_oldest_whole_turns_needed() -> None:
    messages = _chat(5)  # system 4, each turn 10, newest 4 -> 58 tokens
    assert WordCounter()(messages) == 58
    result = fit_history(messages, WordCounter(), budget=38)  # must drop 2 turns
    assert result.dropped_turns == 2
    assert result.prompt_tokens == 38
    assert result.messages == (messages[0], *messages[5:])
    assert result.messages[0].role == "system"
    assert result.messages[1] == Message("user", "q2 q2 q2")
    assert result.messages[-1] == Message("user", "newest question")


def test_one_token_short_drops_one_more_turn() -> None:
    result = fit_history(_chat(5), WordCounter(), budget=37)
    assert result.dropped_turns == 3
    assert result.prompt_tokens == 28


def test_turns_with_several_replies_are_dropped_whole() -> None:
    messages = [
        Message("system", "s"),
        Message("user", "u1"),
        Message("assistant", "a1"),
        Message("assistant", "a1b"),
        Message("user", "u2"),
        Message("assistant", "a2"),
        Message("user", "u3"),
    ]
    result = fit_history(messages, WordCounter(), budget=15)
    assert result.dropped_turns == 1
    assert [m.content for m in result.messages] == ["s", "u2", "a2", "u3"]


def test_everything_after_the_newest_user_message_is_kept() -> None:
    messages = [*_chat(2), Message("assistant", "partial reply")]
    result = fit_history(messages, WordCounter(), budget=12)
    assert result.dropped_turns == 2
    assert [m.content for m in result.messages] == ["be nice", "newest question", "partial reply"]


def test_newest_message_too_big_names_both_numbers() -> None:
    messages = [Message("system", "s"), Message("user", "old"), Message("user", "word " * 50)]
    with pytest.raises(ContextOverflowError) as excinfo:
        fit_history(messages, WordCounter(), budget=20)
    assert "prompt is 55 tokens but only 20 fit in the context" in str(excinfo.value)


def test_without_a_system_prompt() -> None:
    messages = _chat(3)[1:]
    result = fit_history(messages, WordCounter(), budget=15)
    assert result.messages == tuple(messages[4:])
    assert result.dropped_turns == 2


def test_few_count_calls_for_a_long_chat() -> None:
    messages = _chat(200)
    count = WordCounter()
    result = fit_history(messages, count, budget=500)
    assert result.prompt_tokens <= 500
    assert result.dropped_turns == 200 - (500 - 4 - 4) // 10
    assert count.calls <= 12  # 2 + ceil(log2(200)), far from the 200 a linear scan needs


def test_fit_to_context_keeps_room_for_the_reply() -> None:
    messages = _chat(5)  # 58 tokens
    assert fit_to_context(messages, WordCounter(), n_ctx=64, max_tokens=6).dropped_turns == 0
    fit = fit_to_context(messages, WordCounter(), n_ctx=64, max_tokens=None)  # 16 kept free
    assert (fit.dropped_turns, fit.prompt_tokens) == (1, 48)
    assert fit.dropped_note(64) == "1 earlier turn(s) dropped to fit the 64-token context"
