"""ChatSession: one conversation's messages, in order and in the history store, and the
replies an engine writes into it (send, regenerate, continue, edit, switch version, fork).
No UI: reply() may run in a worker thread; every other method belongs to one thread."""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Iterator, TypeVar

from localchat.chat.call_record import CallRecord
from localchat.chat.context import FitResult, fit_to_context
from localchat.chat.params import ReplyParams, config_from_record, conversation_record
from localchat.chat.reasoning import without_reasoning
from localchat.chat.runs import Run, add_run
from localchat.engine.base import Delta, Engine, Event, Message, Request, Stats
from localchat.engine.config import EngineConfig
from localchat.errors import LocalchatError
from localchat.storage import (
    Conversation,
    ConversationStore,
    ReplyStatus,
    ReplyWriter,
    StoredMessage,
    StoreError,
    title_from,
)

if TYPE_CHECKING:
    from localchat.chat.tool_loop import ToolUse

T = TypeVar("T")

_keys = itertools.count(1)


@dataclass
class Entry:
    """One message of the branch on screen. key: its id in this session (every entry has
    one; db_id only once stored). runs: a reply generated here as (text, from_draft) runs,
    None where that is not known (loaded from the history). error: why generating it failed."""

    role: str
    content: str
    db_id: int | None = None
    status: ReplyStatus = ReplyStatus.COMPLETE
    stats: Stats | None = None
    finish_reason: str | None = None
    runs: list[Run] | None = None
    siblings: tuple[int, ...] = ()  # db ids of this message's versions (branches), oldest first
    error: str | None = None
    calls: list[CallRecord] = field(default_factory=list)  # a reply's tool calls, in order
    key: int = field(default_factory=lambda: next(_keys))

    @classmethod
    def stored(cls, m: StoredMessage) -> "Entry":
        stats = Stats(**{k: v for k, v in (m.stats or {}).items()
                         if k in Stats.__dataclass_fields__}) if m.stats else None
        return cls(m.role, m.content, m.id, m.status, stats, m.finish_reason, siblings=m.siblings,
                   calls=[CallRecord.from_dict(c) for c in m.tool_calls])

    @property
    def version(self) -> tuple[int, int] | None:
        """(which version this is, counting from 1; how many there are), None when unknown."""
        if self.db_id not in self.siblings:
            return None
        return self.siblings.index(self.db_id) + 1, len(self.siblings)


@dataclass
class Reply:
    """A reply that is to be generated: its entry (the session's last), what precedes it,
    the text it already holds (a continuation), and its writer into the store."""

    entry: Entry
    history: list[Message]
    prefix: str = ""
    writer: ReplyWriter | None = None


class ChatSession:
    """The conversation on screen and its store. config: what the engine runs; params: what
    this conversation's replies use (a new conversation starts from `defaults`). A failing
    store call goes to on_store_error (with the error's text) and the chat goes on in memory."""

    def __init__(self, config: EngineConfig, defaults: ReplyParams | None = None,
                 store: ConversationStore | None = None, engine: Engine | None = None,
                 on_store_error: Callable[[str], None] = lambda error: None) -> None:
        self.config, self.store, self.engine = config, store, engine
        self.defaults = defaults or ReplyParams()
        self.params = self.defaults
        self.on_store_error = on_store_error
        self.conversation: Conversation | None = None  # once the first message is saved
        self.entries: list[Entry] = []

    # -- reading -----------------------------------------------------------------------

    @property
    def history(self) -> list[Message]:
        """What the model sees: the system prompt, then every entry (earlier replies
        without their reasoning, after the tool calls they made and the results)."""
        messages = list(self.params.system_messages())
        for e in self.entries:
            for i, call in enumerate(e.calls):
                messages += call.messages(i)
            messages.append(Message(e.role, without_reasoning(e.content)
                                    if e.role == "assistant" else e.content))
        return messages

    def index(self, key: int) -> int:
        return next(i for i, e in enumerate(self.entries) if e.key == key)

    def entry(self, key: int) -> Entry:
        return self.entries[self.index(key)]

    def record(self) -> dict:
        """What the conversation and each reply store (chat/params.py)."""
        return conversation_record(self.params, self.config)

    def stored_config(self, conv: Conversation) -> EngineConfig:
        """The engine config a stored conversation ran with (model, context size, draft)."""
        return config_from_record(self.config, conv.params, conv.model)

    def db(self, fn: Callable[[ConversationStore], T]) -> T | None:
        """fn(store); None without a store or when it fails (reported to on_store_error)."""
        if self.store is None:
            return None
        try:
            return fn(self.store)
        except StoreError as exc:
            self.on_store_error(str(exc))
            return None

    # -- conversations -------------------------------------------------------------------

    def new(self) -> None:
        """An empty chat, not yet in the history (the first message stores it), with the
        default params (the flags'), not the previous chat's."""
        self.entries, self.conversation = [], None
        self.params = self.defaults

    def open(self, conversation_id: int) -> bool:
        """Show a stored conversation's branch, with its sampling and system prompt."""
        conv = self.db(lambda st: st.get_conversation(conversation_id))
        stored = self.db(lambda st: st.messages(conversation_id))
        if conv is None or stored is None:
            return False
        self.conversation = conv
        self.db(lambda st: st.mark_opened(conversation_id))
        self.params = ReplyParams.from_record(conv.params, conv.system_prompt, self.defaults)
        self.entries = [Entry.stored(m) for m in stored if m.role != "system"]
        return True

    def fork(self) -> Conversation | None:
        """A new conversation holding a copy of the branch on screen (not opened)."""
        if self.conversation is None:
            return None
        cid = self.conversation.id
        return self.db(lambda st: st.fork(cid))

    def rename(self, title: str, conversation_id: int) -> None:
        self.db(lambda st: st.rename(conversation_id, title))
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.conversation = replace(self.conversation, title=title)

    def delete(self, conversation_id: int) -> bool:
        """Delete a stored conversation; True when it was this one (the chat is then new)."""
        self.db(lambda st: st.delete(conversation_id))
        if self.conversation is not None and self.conversation.id == conversation_id:
            self.new()
            return True
        return False

    def set_system(self, text: str | None) -> None:
        self.params = replace(self.params, system=text)
        if self.conversation is not None:
            cid = self.conversation.id
            self.db(lambda st: st.update_settings(cid, system_prompt=text))

    def set_params(self, params: ReplyParams) -> None:
        """This conversation's params from now on (stored with it)."""
        self.params = params
        self.save_settings()

    def save_settings(self) -> None:
        """Store the sampling, max_tokens, context size and draft in use."""
        if self.conversation is not None:
            cid, record = self.conversation.id, self.record()
            self.db(lambda st: st.update_settings(cid, params=record))

    def use_engine(self, engine: Engine, config: EngineConfig) -> None:
        """A newly loaded engine, with the config (model, context size, draft) it runs."""
        model_changed = config.model != self.config.model
        self.engine, self.config = engine, config
        if self.conversation is not None and model_changed:
            cid = self.conversation.id
            self.db(lambda st: st.update_settings(cid, model=config.model))
        self.save_settings()

    # -- the user's side -------------------------------------------------------------------

    def send(self, text: str, typed: str | None = None) -> Reply:
        """The user's message, then a reply to it (stored as streaming). typed: the words
        the user typed, where text also holds attachments (a new chat is titled from them)."""
        if self.conversation is None and self.store is not None:
            self.conversation = self.db(lambda st: st.create_conversation(
                title_from(typed or text), model=self.config.model, system_prompt=self.params.system,
                params=self.record()))
        conv, parent = self.conversation, self._parent_id()
        db_id = self.db(lambda st: st.add_message(conv.id, "user", text, parent=parent)) \
            if conv else None
        self._append(Entry("user", text, db_id))
        return self._new_reply()

    def edit(self, key: int, text: str) -> Reply:
        """A new version of the user's message `key` (the old one stays as a sibling
        branch): the entries from it on go, then as send()."""
        self.truncate(self.index(key))
        return self.send(text)

    def regenerate(self, key: int | None = None) -> Reply:
        """A new version of reply `key` (of a user message: of the reply to it; None: the
        last entry); the old one stays as a sibling branch."""
        index = len(self.entries) - 1 if key is None else self.index(key)
        if self.entries[index].role == "user":
            index += 1
        self.truncate(index)
        return self._new_reply()

    def continue_(self, key: int) -> Reply:
        """Keep generating reply `key` (the last entry) after its text."""
        entry = self.entry(key)
        assert entry is self.entries[-1] and entry.role == "assistant"
        if entry.db_id is not None:
            self.db(lambda st: st.reopen_reply(entry.db_id))
        return self._reply(entry, prefix=entry.content)

    def truncate(self, index: int) -> None:
        """entries[index:] leave the branch on screen; in the history they stay."""
        del self.entries[index:]

    def switch_version(self, key: int, step: int) -> bool:
        """Show the version `step` away from entry `key`, with the branch that follows
        it. False past the first or last version (no wrapping), or when the store gave
        no branch."""
        index, entry = self.index(key), self.entry(key)
        at = entry.siblings.index(entry.db_id) + step
        if not 0 <= at < len(entry.siblings):
            return False
        target = entry.siblings[at]
        cid = self.conversation.id
        branch = self.db(lambda st: st.switch_branch(cid, target))
        if branch is None:
            return False
        self._replace_from(index, branch[index:])
        return True

    # -- replies -----------------------------------------------------------------------

    def request(self, reply: Reply) -> tuple[Request, FitResult]:
        """The engine request for reply: the most recent history that fits the context
        with room for it (fit.dropped_turns says how many turns went). Any thread."""
        engine = self.engine
        if engine is None:
            raise LocalchatError("no model is loaded")
        prefix, params = reply.prefix, self.params
        counted = (lambda ms: engine.count_prompt_tokens(list(ms) + [Message("assistant", prefix)])) \
            if prefix else engine.count_prompt_tokens
        fit = fit_to_context(reply.history, counted, engine.info.n_ctx, params.max_tokens)
        return params.request(fit.messages, assistant_prefix=prefix), fit

    def reply(self, reply: Reply, cancel: threading.Event | None = None,
              on_store_error: Callable[[str], None] | None = None,
              on_dropped: Callable[[FitResult], None] | None = None,
              tools: "ToolUse | None" = None) -> Iterator[Event | CallRecord]:
        """The one reply pipeline (the chat and `run`): reply's request (the history that fits;
        on_dropped hears when earlier turns went), then the engine's events (with tools: the
        calls made on the way, chat/tool_loop.py), each saved to the store and applied to
        reply's entry before it is yielded. Any thread: the entry is the generator's until
        it ends. Raises LocalchatError where the engine does; call
        fail() then, in the session's thread."""
        request, fit = self.request(reply)
        if fit.dropped_turns and on_dropped is not None:
            on_dropped(fit)
        if tools is None:
            events = self.engine.generate(request, cancel)
        else:
            from localchat.chat.tool_loop import tool_events

            events = tool_events(self.engine, request, tools, cancel)
        for event in self._saved(reply, events, on_store_error or self.on_store_error):
            self.take(reply, event)
            yield event

    def _saved(self, reply: Reply, events: Iterator[Event | CallRecord],
               failed: Callable[[str], None]) -> Iterator[Event | CallRecord]:
        """events, each written to the store before it is yielded (the final text and status
        with the Result); a write that fails stops the writing and goes to failed. Left
        before its Result (an exception, a closed generator), the text so far is kept,
        interrupted."""
        writer = reply.writer

        def save(fn) -> ReplyWriter | None:
            if writer is None:
                return None
            try:
                fn(writer)
                return writer
            except StoreError as exc:
                failed(str(exc))
                return None

        try:
            calls: list[dict] = [c.as_dict() for c in reply.entry.calls]
            for event in events:
                if isinstance(event, CallRecord):
                    calls.append(event.as_dict())
                    save(lambda w: w.store.set_tool_calls(w.message_id, calls))
                elif isinstance(event, Delta):
                    writer = save(lambda w: w.feed(event.text))
                else:
                    status = ReplyStatus.after(event.finish_reason)
                    save(lambda w: w.finish(status, event.stats.to_dict(), event.text,
                                            event.finish_reason))
                    writer = None
                yield event
        finally:
            if writer is not None:
                save(lambda w: w.finish(ReplyStatus.INTERRUPTED))

    def take(self, reply: Reply, event: Event | CallRecord) -> None:
        """Apply an event to the reply's entry: a tool call, text, runs, then its status."""
        entry = reply.entry
        if isinstance(event, CallRecord):
            entry.calls.append(event)
            return
        if isinstance(event, Delta):
            entry.content += event.text
            if entry.runs is not None:
                add_run(entry.runs, event.text, event.from_draft)
            return
        entry.status = ReplyStatus.after(event.finish_reason)
        entry.stats, entry.finish_reason = event.stats, event.finish_reason

    def fail(self, reply: Reply, error: str) -> tuple[str, list[Entry]]:
        """Generating reply failed; returns (what happened, the entries that left): 'kept' (a
        continued reply keeps its text, interrupted), 'restored' (a new version was deleted, the
        one it was to replace is back), 'dropped' (a first reply was deleted, with the user's
        message it answered; a conversation left empty goes too) or 'gone' (the entry had already left the session)."""
        entry = reply.entry
        entry.error, entry.status = error, ReplyStatus.INTERRUPTED
        if not any(e is entry for e in self.entries):
            return "gone", []
        if entry.content:
            if entry.db_id is not None:
                self.db(lambda st: st.finish_reply(entry.db_id, entry.content,
                                                   status=ReplyStatus.INTERRUPTED))
            return "kept", []
        index = self.entries.index(entry)
        user = self.entries[index - 1] if index and self.entries[index - 1].role == "user" \
            else None
        cid = self.conversation.id if self.conversation is not None else None
        if cid is not None and entry.db_id is not None:
            self.db(lambda st: st.delete_branch(cid, entry.db_id))
        if cid is not None and user is not None and user.db_id is not None and \
                self.db(lambda st: st.child_count(user.db_id)):
            branch = self.db(lambda st: st.switch_branch(cid, user.db_id)) or []
            gone = self.entries[index:]
            self._replace_from(index, branch[index:])
            return "restored", gone
        if cid is not None and user is not None and user.db_id is not None:
            self.db(lambda st: st.delete_branch(cid, user.db_id))
        gone = self.entries[index - (user is not None):]
        del self.entries[index - (user is not None):]
        if cid is not None and not self.entries and self.db(lambda st: st.message_count(cid)) == 0:
            self.db(lambda st: st.delete(cid))  # its first message got no reply: no empty chat
            self.conversation = None  # is left in the history
        return "dropped", gone

    def run(self, reply: Reply, cancel: threading.Event | None = None,
            on_event: Callable[[Event], None] | None = None) -> Entry:
        """reply() in this thread, to the end (or fail); the reply's entry."""
        try:
            for event in self.reply(reply, cancel):
                if on_event is not None:
                    on_event(event)
        except LocalchatError as exc:
            self.fail(reply, str(exc))
        return reply.entry

    # -- inside ------------------------------------------------------------------------

    def _parent_id(self) -> int | None:
        """The message a new one follows: the last entry (None: a first message)."""
        return self.entries[-1].db_id if self.entries else None

    def _append(self, entry: Entry) -> None:
        self.entries.append(entry)
        if entry.db_id is not None and self.conversation is not None:
            cid = self.conversation.id
            entry.siblings = self.db(lambda st: st.versions(cid, entry.db_id)) or ()

    def _new_reply(self) -> Reply:
        entry = Entry("assistant", "", runs=[])
        conv = self.conversation
        if conv is not None:
            parent, model, record = self._parent_id(), self.config.model, self.record()
            entry.db_id = self.db(lambda st: st.begin_reply(
                conv.id, parent=parent, model=model, params=record))
        self._append(entry)
        return self._reply(entry)

    def _reply(self, entry: Entry, prefix: str = "") -> Reply:
        entry.status = ReplyStatus.STREAMING
        writer = (ReplyWriter(self.store, entry.db_id, prefix=prefix)
                  if self.store is not None and entry.db_id is not None else None)
        return Reply(entry, self.history[:-1], prefix, writer)

    def _replace_from(self, index: int, stored: list[StoredMessage]) -> None:
        del self.entries[index:]
        self.entries += [Entry.stored(m) for m in stored if m.role != "system"]
