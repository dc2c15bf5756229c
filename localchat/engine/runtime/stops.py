"""Stop strings over streamed text, shared by every engine: text that may start a stop string is
held back until settled, so a stop string never leaks half-printed."""

from __future__ import annotations

from typing import Sequence


class StopMatcher:
    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self._pending = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        """Add streamed text; return the part that is safe to show now."""
        if self.stopped:
            return ""
        self._pending += text
        if not self.stops:
            out, self._pending = self._pending, ""
            return out
        hits = [i for i in (self._pending.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.stopped = True
            out, self._pending = self._pending[: min(hits)], ""
            return out
        hold = self._longest_partial_suffix()
        cut = len(self._pending) - hold
        out, self._pending = self._pending[:cut], self._pending[cut:]
        return out

    def flush(self) -> str:
        """End of stream: whatever was held back is real text after all."""
        out, self._pending = ("" if self.stopped else self._pending), ""
        return out

    def _longest_partial_suffix(self) -> int:
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(self._pending)), best, -1):
                if self._pending.endswith(stop[:n]):
                    best = n
                    break
        return best
