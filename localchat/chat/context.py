"""Fit chat history into the context window by dropping whole oldest turns, so roles still
alternate; the system prompt and the newest user message are never dropped."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from localchat.engine.base import Message
from localchat.errors import ContextOverflowError


REPLY_RESERVE = 512  # tokens kept free for the reply when fitting history


def prompt_budget(n_ctx: int, max_tokens: int | None) -> int:
    """Tokens the prompt may take: the context less room for the reply (-n, else 512,
    at most a quarter of the context)."""
    return n_ctx - min(max_tokens or REPLY_RESERVE, n_ctx // 4)


@dataclass(frozen=True)
class FitResult:
    messages: tuple[Message, ...]
    dropped_turns: int
    prompt_tokens: int

    def dropped_note(self, n_ctx: int) -> str:
        """What to tell the user when turns were dropped."""
        return f"{self.dropped_turns} earlier turn(s) dropped to fit the {n_ctx}-token context"


def fit_to_context(
    messages: Sequence[Message],
    count_tokens: Callable[[Sequence[Message]], int],
    n_ctx: int,
    max_tokens: int | None,
) -> FitResult:
    """The most recent history that fits an n_ctx-token context with room for the reply
    (prompt_budget): what every chat surface sends."""
    return fit_history(messages, count_tokens, prompt_budget(n_ctx, max_tokens))


def _split(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]], list[Message]]:
    """(leading system messages, droppable turns oldest first, the kept tail)."""
    start = 0
    while start < len(messages) and messages[start].role == "system":
        start += 1
    head = list(messages[:start])
    users = [i for i in range(start, len(messages)) if messages[i].role == "user"]
    last_user = users[-1] if users else None
    if last_user is None:  # nothing that is safe to drop
        return head, [], list(messages[start:])
    turns: list[list[Message]] = []
    for message in messages[start:last_user]:
        if message.role == "user" or not turns:
            turns.append([message])  # replies before any user message form their own turn
        else:
            turns[-1].append(message)
    return head, turns, list(messages[last_user:])


def fit_history(
    messages: Sequence[Message],
    count_tokens: Callable[[Sequence[Message]], int],
    budget: int,
) -> FitResult:
    """Keep the most recent history whose prompt is at most `budget` tokens (all of it
    when no earlier turn can go: the engine then says whether it fits its context).

    count_tokens (render and tokenize: expensive) is called at most 2 + log2(turns) times."""
    head, turns, tail = _split(messages)

    def kept(dropped: int) -> tuple[Message, ...]:
        return tuple(head + [m for turn in turns[dropped:] for m in turn] + tail)

    counts: dict[int, int] = {}

    def tokens(dropped: int) -> int:
        if dropped not in counts:
            counts[dropped] = count_tokens(kept(dropped))
        return counts[dropped]

    if not turns or tokens(0) <= budget:  # nothing to drop: the engine says if it overflows
        return FitResult(kept(0), 0, tokens(0))
    least = len(turns)
    if tokens(least) > budget:
        raise ContextOverflowError(
            f"prompt is {tokens(least)} tokens but only {budget} fit in the context "
            "(system prompt and newest message alone); shorten the message or use a "
            "larger context"
        )
    too_few, enough = 0, least  # invariant: tokens(too_few) > budget >= tokens(enough)
    while enough - too_few > 1:
        middle = (too_few + enough) // 2
        if tokens(middle) <= budget:
            enough = middle
        else:
            too_few = middle
    return FitResult(kept(enough), enough, tokens(enough))
