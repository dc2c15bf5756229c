"""Generating a reply, mixed into ChatApp: the worker thread that fits the history into
the context and runs the engine, and the UI-thread side that streams its events into
the reply's view, the gauge bar and the entry.

The worker merges the deltas of each UI interval into one message and writes the reply
into the history as it grows (storage/reply_writer.py), so a crash keeps what was
already said.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from typing import Iterator

from textual import work
from textual.containers import VerticalScroll
from textual.widgets import Markdown

from localchat.chat.context import fit_to_context
from localchat.engine.base import Delta, Message, Request, Result
from localchat.errors import LocalchatError
from localchat.storage import ReplyStatus, ReplyWriter, StoreError
from localchat.chat.runs import add_run
from localchat.tui.messages import Entry, EngineEvent, GenerationFailed, StoreFailed
from localchat.tui.widgets import GaugeBar, MessageView, RateSparkline

UI_INTERVAL_S = 0.1  # redraw at most 10 times a second: a redraw per token halved decode speed


class GenerationMixin:
    """The reply side of ChatApp (uses its engine, settings, entries and cancel event)."""

    def _parent_id(self) -> int | None:
        """The message a new one follows: the last on screen (None: a first message)."""
        return self.entries[-1].db_id if self.entries else None

    async def _send(self, text: str) -> None:
        self._ensure_conversation(text)
        self._select(None)
        view = MessageView("user", text)
        await self.query_one("#chat", VerticalScroll).mount(view)
        conv, parent = self.conversation, self._parent_id()
        db_id = self._db(lambda st: st.add_message(conv.id, "user", text, parent=parent)) \
            if conv else None
        entry = Entry("user", text, view, db_id)
        self.entries.append(entry)
        self._note_versions(entry)
        await self._start_reply()

    async def _start_reply(self, continuing: Entry | None = None) -> None:
        conv, s = self.conversation, self.settings
        if continuing is None:
            view = MessageView("assistant")
            await self.query_one("#chat", VerticalScroll).mount(view)
            entry = Entry("assistant", "", view, runs=[])
            if conv is not None:
                parent = self._parent_id()
                entry.db_id = self._db(lambda st: st.begin_reply(
                    conv.id, parent=parent, model=s.model, params=self._params()))
            self.entries.append(entry)
            self._note_versions(entry)
            prefix = ""
        else:
            entry, view, prefix = continuing, continuing.view, continuing.content
            if entry.db_id is not None:
                self._db(lambda st: st.reopen_reply(entry.db_id))
            view.status.update("continuing…")
            view.show_runs(None)  # it streams into the Markdown
        entry.status = ReplyStatus.STREAMING
        writer = (ReplyWriter(self.store, entry.db_id, prefix=prefix)
                  if self.store is not None and entry.db_id is not None else None)
        self._streams[id(view)] = Markdown.get_stream(view.markdown)
        view.begin_stream(prefix)
        self._cancel = threading.Event()
        self._generating = True
        gauges = self.query_one(GaugeBar)
        gauges.state = "generating"
        if gauges.stats is not None:  # the last reply's rates are not this one's: until its
            gauges.stats = replace(gauges.stats, ttft_s=0.0, prefill_tok_s=0.0,  # first token
                                   decode_tok_s=0.0, completion_tokens=0)
        self.query_one(RateSparkline).reset()
        self._generate(self.history[:-1], view, prefix, writer)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, history: list[Message], view: MessageView, prefix: str,
                  writer: ReplyWriter | None) -> None:
        engine = self.engine
        assert engine is not None
        try:
            n_ctx = engine.info.n_ctx
            counted = (lambda ms: engine.count_prompt_tokens(list(ms) + [Message("assistant", prefix)])) \
                if prefix else engine.count_prompt_tokens
            fit = fit_to_context(history, counted, n_ctx, self.settings.max_tokens)
            if fit.dropped_turns:
                self.call_from_thread(self._notice,
                                      f"{fit.dropped_note(n_ctx)} (system prompt kept).",
                                      before=view)
            request = Request(messages=fit.messages, sampling=self.settings.sampling,
                              max_tokens=self.settings.max_tokens, assistant_prefix=prefix)
            self._stream_events(engine.generate(request, self._cancel), view, writer)
        except LocalchatError as exc:
            self.post_message(GenerationFailed(str(exc), view))

    def _stream_events(self, events: Iterator[Delta | Result], view: MessageView,
                       writer: ReplyWriter | None) -> None:
        """Forward engine events to the UI, merging the deltas of each UI interval, and
        write the reply into the history as it grows."""
        pending: list[Delta] = []
        last_post = 0.0
        for event in events:
            if isinstance(event, Delta):
                writer = self._save(writer, lambda w: w.feed(event.text))
                pending.append(event)
                if time.monotonic() - last_post < UI_INTERVAL_S:
                    continue
            if pending:
                runs: list = []
                for d in pending:
                    add_run(runs, d.text, d.from_draft)
                merged = Delta(text="".join(d.text for d in pending),
                               token_ids=tuple(t for d in pending for t in d.token_ids),
                               stats=pending[-1].stats,
                               from_draft=all(d.from_draft for d in pending))
                self.post_message(EngineEvent(merged, view, runs))
                pending, last_post = [], time.monotonic()
            if isinstance(event, Result):
                status = ReplyStatus.after(event.finish_reason)
                self._save(writer, lambda w: w.finish(status, event.stats.to_dict(), event.text))
                self.post_message(EngineEvent(event, view))

    def _save(self, writer: ReplyWriter | None, fn) -> ReplyWriter | None:
        """Run a history write in the generating thread; on failure stop writing."""
        if writer is None:
            return None
        try:
            fn(writer)
            return writer
        except StoreError as exc:
            self.post_message(StoreFailed(str(exc)))
            return None

    def _entry_for(self, view: MessageView) -> Entry | None:
        return next((e for e in self.entries if e.view is view), None)

    async def _on_engine_event(self, message: EngineEvent) -> None:
        event, view = message.event, message.view
        self.query_one(GaugeBar).stats = event.stats
        self.query_one(RateSparkline).add(event.stats)
        stream = self._streams.get(id(view))
        entry = self._entry_for(view)
        if isinstance(event, Delta):
            answer = view.stream_piece(event.text)  # a <think> block goes to its section
            if answer and stream is not None:
                await stream.write(answer)
            if entry is not None:
                entry.content += event.text
                if entry.runs is not None:
                    for text, from_draft in message.runs:
                        add_run(entry.runs, text, from_draft)
            return
        answer = view.stream_piece("", final=True)
        if answer and stream is not None:
            await stream.write(answer)
        await self._finish(view)
        if view.reasoning and self.engine is not None:
            self._count_reasoning(view)
        if entry is not None:
            entry.status = ReplyStatus.after(event.finish_reason)
            entry.stats, entry.finish_reason = event.stats, event.finish_reason
            self._show_status(entry)
            self._show_runs(entry)
        await self._refresh_sidebar()

    def _count_reasoning(self, view: MessageView) -> None:
        """The reasoning section's token count, as the engine tokenizes it."""
        count = self.engine.count_prompt_tokens
        empty = count([Message("assistant", "")])
        view.set_reasoning_tokens(count([Message("assistant", view.reasoning)]) - empty)

    def _show_status(self, entry: Entry) -> None:
        labels = {"stop": "", "length": "stopped: reached the token limit",
                  "cancelled": "stopped"}
        label = labels.get(entry.finish_reason or "", "")
        if entry.status == ReplyStatus.INTERRUPTED and not label:
            label = "interrupted"
        s = entry.stats
        parts = []
        if s is not None:
            parts.append(f"{s.completion_tokens} tokens · {s.decode_tok_s:.1f} tok/s · TTFT "
                         f"{s.ttft_s * 1000:.0f} ms")
            if s.cached_tokens:  # an earlier turn or branch's prefix, not recomputed
                parts.append(f"{s.cached_tokens} of {s.prompt_tokens} prompt tokens cached")
        if label:
            parts.append(label)
        entry.view.status.update(" · ".join(parts))

    async def _on_generation_failed(self, message: GenerationFailed) -> None:
        await self._finish(message.view)
        entry = self._entry_for(message.view)
        if entry is not None and entry.content:  # a continuation failed: keep the reply
            entry.status = ReplyStatus.INTERRUPTED
            self._show_runs(entry)
            if entry.db_id is not None:
                self._db(lambda st: st.finish_reply(entry.db_id, entry.content,
                                                    status=ReplyStatus.INTERRUPTED))
        elif entry is not None:
            index = self.entries.index(entry)
            user = self.entries[index - 1] if index and self.entries[index - 1].role == "user" \
                else None
            cid = self.conversation.id if self.conversation is not None else None
            if cid is not None and entry.db_id is not None:
                self._db(lambda st: st.delete_branch(cid, entry.db_id))
            if cid is not None and user is not None and user.db_id is not None and \
                    self._db(lambda st: st.child_count(user.db_id)):
                # a new version failed: the one it was to replace comes back
                branch = self._db(lambda st: st.switch_branch(cid, user.db_id)) or []
                await self._replace_from(index, branch[index:])
                self._notice(f"error: {message.error} (the earlier reply is back)")
                return
            # the user's message did not get a reply: keep it visible only
            if cid is not None and user is not None and user.db_id is not None:
                self._db(lambda st: st.delete_branch(cid, user.db_id))
            del self.entries[index - (user is not None):]
        message.view.status.update(f"error: {message.error}")

    async def _finish(self, view: MessageView) -> None:
        stream = self._streams.pop(id(view), None)
        if stream is not None:
            await stream.stop()
        self._generating = False
        self.query_one(GaugeBar).state = "ready"

    async def _truncate(self, index: int) -> None:
        """Take entries[index:] off the screen before a new version of entries[index] is
        written; in the history they stay, as a sibling branch."""
        self._select(None)
        gone = self.entries[index:]
        del self.entries[index:]
        for entry in gone:
            await entry.view.remove()
