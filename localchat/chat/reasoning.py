"""A reasoning model's `<think>…</think>` block, kept apart from its answer: split as the
reply streams (a tag may arrive in pieces), split whole for a stored reply, and dropped
from earlier turns before they go back to the model (as the models' own templates do)."""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def split_reply(text: str) -> tuple[str, str]:
    """(reasoning, answer) of a whole reply; reasoning is "" when it opens with no block.
    An unclosed block is all reasoning (the reply was cut while thinking)."""
    body = text.lstrip()
    if not body.startswith(OPEN):
        return "", text
    inner, closed, answer = body[len(OPEN):].partition(CLOSE)
    return inner.strip("\n"), answer.lstrip("\n") if closed else ""


def without_reasoning(text: str) -> str:
    """The reply as earlier turns are sent back: its answer only."""
    reasoning, answer = split_reply(text)
    return answer if reasoning or text.lstrip().startswith(OPEN) else text


class ReasoningSplitter:
    """Feed streamed text; get (reasoning, answer) pieces, newlines around the tags kept
    (split_reply strips them). Text that may be the start of a tag is held back until the
    next piece settles it."""

    def __init__(self) -> None:
        self._held = ""
        self._state = "start"  # start -> thinking -> answer, or start -> answer

    def feed(self, text: str) -> tuple[str, str]:
        text = self._held + text
        self._held = ""
        if self._state == "start":
            stripped = text.lstrip()
            if stripped.startswith(OPEN):
                self._state, text = "thinking", stripped[len(OPEN):]
            elif OPEN.startswith(stripped):  # "", "<", "<thi": not settled yet
                self._held = text
                return "", ""
            else:
                self._state = "answer"
        if self._state == "answer":
            return "", text
        reasoning, closed, answer = text.partition(CLOSE)
        if closed:
            self._state = "answer"
            return reasoning, answer
        for cut in range(min(len(CLOSE) - 1, len(text)), 0, -1):  # a tag split across pieces
            if CLOSE.startswith(text[-cut:]):
                self._held = text[-cut:]
                return text[:-cut], ""
        return text, ""

    def flush(self) -> tuple[str, str]:
        """What is still held back, at the end of the reply."""
        held, self._held = self._held, ""
        return (held, "") if self._state == "thinking" else ("", held)
