"""What the chat's parts pass around: the on-screen Entry for each message, and the
Textual messages that carry results from worker threads back to the UI thread (a
worker never touches widgets itself)."""

from __future__ import annotations

from dataclasses import dataclass

from textual.message import Message as TextualMessage

from localchat.engine.base import Delta, Engine, Result, Stats
from localchat.storage.reply_status import ReplyStatus
from localchat.chat.runs import Run
from localchat.tui.widgets import MessageView


@dataclass
class Entry:
    """One message on screen: its text, its view, and its row in the database.
    runs: a reply generated in this session as (text, from_draft) runs; None where
    that is not known (loaded from the history)."""

    role: str
    content: str
    view: MessageView
    db_id: int | None = None
    status: ReplyStatus = ReplyStatus.COMPLETE
    stats: Stats | None = None
    finish_reason: str | None = None
    runs: list[Run] | None = None
    siblings: tuple[int, ...] = ()  # db ids of this message's versions (branches), oldest first


class EngineLoaded(TextualMessage):
    def __init__(self, engine: Engine | None, error: str | None = None) -> None:
        super().__init__()
        self.engine, self.error = engine, error


class EngineEvent(TextualMessage):
    """A Result, or the Deltas of one UI interval merged into one; `runs` keeps which
    of the merged text came from a draft."""

    def __init__(self, event: Delta | Result, view: MessageView,
                 runs: list[Run] | None = None) -> None:
        super().__init__()
        self.event, self.view = event, view
        self.runs = runs or []


class GenerationFailed(TextualMessage):
    def __init__(self, error: str, view: MessageView) -> None:
        super().__init__()
        self.error, self.view = error, view


class StoreFailed(TextualMessage):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error
