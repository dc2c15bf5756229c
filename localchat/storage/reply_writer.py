"""Write a reply into the store while it streams, so a killed process keeps what the
model had already said (marked interrupted when the store is next opened)."""

from __future__ import annotations

import time
from typing import Callable

from localchat.storage.conversations import ConversationStore
from localchat.storage.reply_status import ReplyStatus

FLUSH_INTERVAL_S = 0.5


class ReplyWriter:
    """Accumulates streamed text; writes it at most every `interval_s` and at the end.

    `prefix` is text the message already holds (a stopped reply being continued)."""

    def __init__(self, store: ConversationStore, message_id: int, *, prefix: str = "",
                 interval_s: float = FLUSH_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store, self.message_id = store, message_id
        self.prefix, self.interval_s, self.clock = prefix, interval_s, clock
        self._parts: list[str] = []
        self._last_flush = clock()
        self._flushed_len = 0

    @property
    def text(self) -> str:
        return self.prefix + "".join(self._parts)

    def feed(self, text: str) -> None:
        if text:
            self._parts.append(text)
        if self.clock() - self._last_flush >= self.interval_s:
            self.flush()

    def flush(self) -> None:
        text = self.text
        self._last_flush = self.clock()
        if len(text) != self._flushed_len:
            self.store.update_reply(self.message_id, text)
            self._flushed_len = len(text)

    def finish(self, status: ReplyStatus | str, stats: dict | None = None, text: str | None = None,
               finish_reason: str | None = None) -> str:
        """Final write: the whole text (the engine's Result text plus the prefix, when
        given), its status and stats, the engine's finish_reason kept among the stats.
        Returns the text written."""
        final = self.text if text is None else self.prefix + text
        if finish_reason is not None:
            stats = {**(stats or {}), "finish_reason": finish_reason}
        self.store.finish_reply(self.message_id, final, status=status, stats=stats)
        return final
