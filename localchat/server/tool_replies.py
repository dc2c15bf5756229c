"""A reply read as tool calls, whole or while it streams: text up to the family's call marker
streams as content; from the marker on it is held, and at the end parsed into calls (or,
if it is no valid call, sent as content: never a 500)."""

from __future__ import annotations

from localchat.engine.base import ToolCall
from localchat.server.tool_fields import ToolUse


def call_dicts(calls: tuple[ToolCall, ...]) -> list[dict]:
    """message.tool_calls as OpenAI writes them."""
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def call_deltas(calls: tuple[ToolCall, ...]) -> list[dict]:
    """delta.tool_calls pieces for a stream: each call's id, type and name first, then its
    arguments."""
    deltas: list[dict] = []
    for i, c in enumerate(calls):
        deltas.append({"index": i, "id": c.id, "type": "function",
                       "function": {"name": c.name, "arguments": ""}})
        deltas.append({"index": i, "function": {"arguments": c.arguments}})
    return deltas


class ToolStream:
    """Splits streamed text into content to send now and a held tail that may be calls."""

    def __init__(self, tools: ToolUse) -> None:
        self.tools = tools
        self.writer = tools.writer
        self.text = ""
        self.sent = 0  # characters of text already handed out as content
        self.holding = False  # the marker has come: the rest is held until the end
        self.passing = False  # marker_at_start and the reply did not start with it

    def feed(self, piece: str) -> str:
        """Append a piece; the content that may be sent now."""
        self.text += piece
        if self.holding:
            return ""
        if self.passing:
            return self._release(len(self.text))
        marker = self.writer.marker
        if self.writer.marker_at_start:
            head = self.text.lstrip()
            if head.startswith(marker):
                self.holding = True
            elif head and not marker.startswith(head):
                self.passing = True
                return self._release(len(self.text))
            return ""
        found = self.text.find(marker, self.sent)
        if found >= 0:
            self.holding = True
            return self._release(found)
        keep = next((n for n in range(min(len(marker) - 1, len(self.text)), 0, -1)
                     if marker.startswith(self.text[-n:])), 0)
        return self._release(len(self.text) - keep)

    def _release(self, end: int) -> str:
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def finish(self) -> tuple[str, tuple[ToolCall, ...]]:
        """The content still to send and the calls, once the reply has ended."""
        parsed = self.tools.read(self.text) if not self.passing else None
        if parsed is None:
            return self._release(len(self.text)), ()
        return "", parsed.calls
