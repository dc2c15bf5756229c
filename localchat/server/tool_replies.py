"""A reply read as tool calls, whole or while it streams. Forced calls (tool_choice required
or named: the grammar fixes their layout) stream as delta.tool_calls while they are written.
Under `auto`, text up to the family's call marker streams as content; from the marker on it
is held, and at the end parsed into calls, or, if it is no valid call, sent as content
(never a 500)."""

from __future__ import annotations

from localchat.engine.base import ToolCall
from localchat.prompt.call_stream import CallStream
from localchat.prompt.tool_calls import new_call_id
from localchat.server.tool_fields import ToolUse


def call_dicts(calls: tuple[ToolCall, ...]) -> list[dict]:
    """message.tool_calls as OpenAI writes them."""
    return [{"id": c.id, "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


def _opening(index: int, call_id: str, name: str) -> dict:
    return {"index": index, "id": call_id, "type": "function",
            "function": {"name": name, "arguments": ""}}


def _arguments(index: int, text: str) -> dict:
    return {"index": index, "function": {"arguments": text}}


def call_deltas(calls: tuple[ToolCall, ...]) -> list[dict]:
    """delta.tool_calls pieces for whole calls: each one's id, type and name, then its
    arguments."""
    deltas: list[dict] = []
    for i, c in enumerate(calls):
        deltas += [_opening(i, c.id, c.name), _arguments(i, c.arguments)]
    return deltas


class ForcedCalls:
    """Reads calls as a grammar writes them (`{"name": "N", "<key>": {...}}`, canonical JSON)
    while they stream: a call's id and name once its name is complete, then its arguments
    piece by piece, up to the brace that closes them."""

    def __init__(self, arguments_key: str) -> None:
        self.head, self.separator = '{"name": "', f', "{arguments_key}": '
        self.text, self.pos, self.index = "", 0, -1
        self.state = "seek"  # seek -> name -> arguments -> seek
        self.depth, self.in_string, self.escaped = 0, False, False

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        deltas: list[dict] = []
        while self._step(deltas):
            pass
        return deltas

    def _step(self, deltas: list[dict]) -> bool:
        """Advance through one state; False when more text is needed."""
        if self.state == "seek":
            found = self.text.find(self.head, self.pos)
            if found < 0:
                return False
            self.pos, self.state = found + len(self.head), "name"
        if self.state == "name":
            end = self.text.find('"', self.pos)
            if end < 0 or len(self.text) < end + 1 + len(self.separator):
                return False
            name, after = self.text[self.pos:end], end + 1
            if not self.text.startswith(self.separator, after):  # not a grammar's call
                self.pos, self.state = after, "seek"
                return True
            self.index += 1
            deltas.append(_opening(self.index, new_call_id(), name))
            self.pos, self.state, self.depth = after + len(self.separator), "arguments", 0
        start, done = self.pos, False
        while self.pos < len(self.text) and not done:
            done = self._scan(self.text[self.pos])
            self.pos += 1
        if self.pos > start:
            deltas.append(_arguments(self.index, self.text[start:self.pos]))
        if done:
            self.state = "seek"
        return done

    def _scan(self, char: str) -> bool:
        """Track JSON strings and nesting; True at the character that closes the value."""
        if self.in_string:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = False
            return False
        if char == '"':
            self.in_string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            return self.depth == 0
        return False


class ToolStream:
    """Splits a streamed reply into content to send now and delta.tool_calls."""

    def __init__(self, tools: ToolUse) -> None:
        self.tools = tools
        self.writer = tools.writer
        self.forced = ForcedCalls(self.writer.arguments_key) \
            if tools.required or tools.only else None
        self.content = CallStream(self.writer)

    def feed(self, piece: str) -> tuple[str, list[dict]]:
        """Append a piece; the content and the call deltas that may be sent now."""
        if self.forced is not None:
            return "", self.forced.feed(piece)
        return self.content.feed(piece), []

    def finish(self) -> tuple[str, list[dict], bool]:
        """Once the reply has ended: the content still to send, the call deltas, and
        whether the reply was calls (finish_reason "tool_calls")."""
        if self.forced is not None:
            return "", [], self.forced.index >= 0 and self.forced.state == "seek"
        held = self.content.held  # what was sent as content stays content
        parsed = self.tools.read(held) if held and not self.content.passing else None
        if parsed is None:
            return self.content.rest(), [], False
        # text before the calls that was held with them (after a repeated tool result)
        return parsed.content or "", call_deltas(parsed.calls), True
