"""ChatLog: the chat pane, one MessageView per session entry (by the entry's key) plus
one-line notices; after each change to the session's entries, show() brings it in line."""

from __future__ import annotations

from typing import Sequence

from textual.containers import VerticalScroll
from textual.widgets import Markdown, Static

from localchat.chat.call_record import CallRecord
from localchat.chat.session import Entry
from localchat.storage.reply_status import ReplyStatus, reply_label
from localchat.tui.widgets import MessageView


def status_line(entry: Entry) -> str:
    """Under a reply: its tokens, speed, TTFT and cached prompt, and why it stopped."""
    label = reply_label(entry.status, entry.finish_reason)
    if entry.status == ReplyStatus.STREAMING:
        label = ""
    s = entry.stats
    parts = []
    if s is not None:
        n = s.completion_tokens
        rate = f"{s.decode_tok_s:.1f} tok/s · " if s.decode_tok_s > 0 else ""  # 1 token: none
        parts.append(f"{n} token{'' if n == 1 else 's'} · {rate}TTFT {s.ttft_s * 1000:.0f} ms")
        if s.cached_tokens:  # an earlier turn or branch's prefix, not recomputed
            parts.append(f"{s.cached_tokens} of {s.prompt_tokens} prompt tokens cached")
        if s.restored_tokens:  # of those, the ones a KV snapshot on disk gave
            parts.append(s.restored_note())
    if label:
        parts.append(label)
    return " · ".join(parts)


class ChatLog(VerticalScroll):
    """views: {entry key: its MessageView}. draft_colours: finished replies generated here
    with a draft show their (text, from_draft) runs in colour instead of Markdown (F4)."""

    draft_colours = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.views: dict[int, MessageView] = {}
        self._streams: dict[int, object] = {}  # key -> the Markdown stream of a reply

    async def show(self, entries: Sequence[Entry]) -> None:
        """Views of entries that left go; entries without one get it, at the end."""
        keys = {e.key for e in entries}
        for key in [k for k in self.views if k not in keys]:
            await self.views.pop(key).remove()
        for entry in entries:
            if entry.key not in self.views:
                view = self.views[entry.key] = MessageView(entry.role, entry.content,
                                                           key=entry.key)
                await self.mount(view)
                for call in entry.calls:
                    await view.add_call(call)
                if entry.version is not None:
                    view.show_version(*entry.version)
                if entry.role == "assistant":
                    view.status.update(status_line(entry))

    async def add_call(self, key: int, call: CallRecord) -> None:
        """A tool call of entry `key`'s reply, shown above its text."""
        view = self.views.get(key)
        if view is not None:
            await view.add_call(call)

    def keep(self, entries: Sequence[Entry]) -> None:
        """Leave these entries' views on screen as they are, no longer an entry's."""
        for entry in entries:
            self.views.pop(entry.key, None)

    async def clear(self) -> None:
        self.views.clear()
        await self.remove_children()

    def notice(self, text: str, before: int | None = None, warning: bool = True) -> None:
        """A one-line notice at the end (or above entry `before`'s view); a warning is
        marked ⚠, a plain note (an attached file) is not."""
        self.mount(Static(f"⚠ {text}" if warning else text, classes="notice"),
                   before=self.views.get(before))

    def select(self, key: int | None) -> None:
        """Mark the view of entry `key` as the message the controls act on (None: none)."""
        for view in self.views.values():
            view.remove_class("selected")
        if key is not None:
            self.views[key].add_class("selected")
            self.views[key].scroll_visible()

    def show_status(self, entry: Entry) -> None:
        self.views[entry.key].status.update(status_line(entry))

    # -- a reply streaming -------------------------------------------------------------

    def begin_stream(self, key: int, prefix: str) -> None:
        view = self.views[key]
        self._streams[key] = Markdown.get_stream(view.markdown)
        view.begin_stream(prefix)

    async def write(self, key: int, text: str, *, final: bool = False) -> None:
        """Streamed text into entry `key`'s view (a <think> block goes to its section)."""
        view = self.views.get(key)
        if view is None:
            return
        answer = view.stream_piece(text, final=final)
        stream = self._streams.get(key)
        if answer and stream is not None:
            await stream.write(answer)

    async def end_stream(self, key: int) -> None:
        stream = self._streams.pop(key, None)
        if stream is not None:
            await stream.stop()

    # -- draft colours -----------------------------------------------------------------

    def coloured_runs(self, entry: Entry) -> list | None:
        """The runs to show for entry now, or None for its Markdown."""
        drafted = entry.stats is not None and entry.stats.draft is not None
        if (self.draft_colours and entry.role == "assistant" and entry.runs
                and drafted and entry.status != ReplyStatus.STREAMING):
            return entry.runs
        return None

    def show_runs(self, entry: Entry) -> None:
        if entry.key in self.views:
            self.views[entry.key].show_runs(self.coloured_runs(entry))

    def toggle_draft_colours(self, entries: Sequence[Entry]) -> int:
        """Switch draft colours; returns how many replies show them now."""
        self.draft_colours = not self.draft_colours
        shown = 0
        for entry in entries:
            self.show_runs(entry)
            shown += self.views[entry.key].coloured
        return shown
