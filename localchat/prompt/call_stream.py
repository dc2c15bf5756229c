"""A reply under `auto` tool choice, read while it streams: text before the family's call
marker (or a repeated tool result) can be shown at once; from the marker on it is held until
the reply ends and is parsed. The chat's tool loop and `serve` both use it."""

from __future__ import annotations

from localchat.prompt.tool_calls import ToolFormat


class CallStream:
    """feed() each piece: the text that may be shown now. `held`: what is not shown yet;
    `passing`: the reply cannot be a call (a family whose calls start the reply, and this
    one did not), so everything is shown."""

    def __init__(self, writer: ToolFormat) -> None:
        self.writer = writer
        self.text = ""
        self.sent = 0  # characters of text already shown
        self.holding = False  # the marker has come: the rest is held until the end
        self.passing = False

    @property
    def held(self) -> str:
        return self.text[self.sent:]

    def feed(self, piece: str) -> str:
        self.text += piece
        if self.holding:
            return ""
        if self.passing:
            return self.release(len(self.text))
        marker = self.writer.marker
        if self.writer.marker_at_start:
            head = self.text.lstrip()
            if head.startswith(marker):
                self.holding = True
            elif head and not marker.startswith(head):
                self.passing = True
                return self.release(len(self.text))
            return ""
        starts = [self.text.find(m, self.sent) for m in (marker, self.writer.echo_marker) if m]
        found = min((f for f in starts if f >= 0), default=-1)
        if found >= 0:  # a call, or a repeated tool result: held until the end
            self.holding = True
            return self.release(found)
        keep = max(next((n for n in range(min(len(m) - 1, len(self.text)), 0, -1)
                         if m.startswith(self.text[-n:])), 0)
                   for m in (marker, self.writer.echo_marker) if m)
        return self.release(len(self.text) - keep)

    def release(self, end: int) -> str:
        """The text up to end not shown yet, now shown."""
        out, self.sent = self.text[self.sent:end], max(self.sent, end)
        return out

    def rest(self) -> str:
        """Once the reply has ended and is no call: what is left to show (a repeated tool
        result taken out)."""
        rest = self.release(len(self.text))
        return rest if self.passing else self.writer.without_echo(rest)
