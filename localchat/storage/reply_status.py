"""ReplyStatus: where a stored assistant reply stands. A str enum: the values are the
strings SQLite stores (and JSON exports show), so rows written before it read the same."""

from __future__ import annotations

from enum import Enum


class ReplyStatus(str, Enum):
    COMPLETE = "complete"  # generation finished (a stop, or the token limit)
    INTERRUPTED = "interrupted"  # stopped by the user, failed, or its process died
    STREAMING = "streaming"  # being written right now

    __str__ = str.__str__  # 'complete', not 'ReplyStatus.COMPLETE' (Python 3.10 has no StrEnum)
    __format__ = str.__format__

    @classmethod
    def after(cls, finish_reason: str) -> "ReplyStatus":
        """A finished generation's status: cancelled replies are interrupted."""
        return cls.INTERRUPTED if finish_reason == "cancelled" else cls.COMPLETE


STOP_LABELS = {"stop": "", "length": "stopped: reached the token limit", "cancelled": "stopped"}


def reply_label(status: ReplyStatus | str, finish_reason: str | None) -> str:
    """Why a reply ended, as shown under it and in exports: '' for a natural end, 'stopped'
    (by the user), 'stopped: reached the token limit', else its status ('interrupted':
    failed, or its process died; 'streaming')."""
    if finish_reason in STOP_LABELS:
        return STOP_LABELS[finish_reason]
    return "" if status == ReplyStatus.COMPLETE else str(ReplyStatus(status))
