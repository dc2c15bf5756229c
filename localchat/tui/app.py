"""The chat app: a Textual UI over one in-process engine, with conversations kept in
the history database.

The model loads and generates in worker threads, so the UI never blocks; the engine's
events come back as Textual messages, and each token updates the reply (appended to a
MarkdownStream, not re-rendered) and the gauge bar while it streams. The generating
thread also writes the reply into the database as it grows (storage/reply_writer.py).
"""

from __future__ import annotations

import argparse
import threading
import time
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import platformdirs
from textual import on, work
from textual.actions import SkipAction
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message as TextualMessage
from textual.widgets import Footer, Markdown, Static

from localchat.chat.commands import (
    COMMANDS,
    Command,
    apply_set,
    export_args,
    parse_command,
    parse_set,
    unescape,
)
from localchat.chat.context import fit_history
from localchat.engine.base import Delta, Engine, Message, Request, Result, Stats
from localchat.errors import LocalchatError, UsageError
from localchat.settings import ChatSettings
from localchat.storage import (
    ConversationStore,
    ReplyWriter,
    StoreError,
    StoreUnavailable,
    set_aside,
    title_from,
)
from localchat.storage.db import BUSY_TIMEOUT_MS
from localchat.storage.export import default_export_path, export_conversation
from localchat.tui.clipboard import copy_text, last_code_block
from localchat.tui.keymap import load_keymap
from localchat.tui.palette import ChatCommands
from localchat.tui.screens import ConfirmScreen, InfoScreen, TextInputScreen
from localchat.tui.sidebar import Sidebar
from localchat.tui.widgets import GaugeBar, MessageView, PromptInput

REPLY_RESERVE = 512  # tokens kept free for the reply when fitting history
UI_INTERVAL_S = 0.1  # redraw at most 10 times a second: a redraw per token halved decode speed
T = TypeVar("T")


def _css_path() -> Path:
    """assets/ at the repository root; a built wheel ships it as localchat.assets."""
    in_checkout = Path(__file__).resolve().parents[2] / "assets" / "app.tcss"
    if in_checkout.is_file():
        return in_checkout
    return Path(str(files("localchat.assets").joinpath("app.tcss")))


@dataclass
class Entry:
    """One message on screen: its text, its view, and its row in the database."""

    role: str
    content: str
    view: MessageView
    db_id: int | None = None
    status: str = "complete"
    stats: Stats | None = None
    finish_reason: str | None = None


class EngineLoaded(TextualMessage):
    def __init__(self, engine: Engine | None, error: str | None = None) -> None:
        super().__init__()
        self.engine, self.error = engine, error


class EngineEvent(TextualMessage):
    def __init__(self, event: Delta | Result, view: MessageView) -> None:
        super().__init__()
        self.event, self.view = event, view


class GenerationFailed(TextualMessage):
    def __init__(self, error: str, view: MessageView) -> None:
        super().__init__()
        self.error, self.view = error, view


class StoreFailed(TextualMessage):
    def __init__(self, error: str) -> None:
        super().__init__()
        self.error = error


KEYS_HELP = [
    ("Enter", "send"),
    ("Ctrl+J (Shift+Enter)", "new line in the message"),
    ("Esc", "stop the reply (what was written is kept); cancel an edit"),
    ("Up (in an empty input)", "edit the last message you sent"),
    ("Ctrl+R", "regenerate the last reply"),
    ("Ctrl+G", "continue a stopped reply"),
    ("F2 / F3", "copy the last reply / its last code block (or click a message)"),
    ("Ctrl+B", "show or hide the conversation list"),
    ("Ctrl+N", "new conversation"),
    ("Ctrl+P", "command palette"),
    ("Ctrl+T", "light/dark theme"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit"),
]


def help_markdown(keymap_file: Path | None = None) -> str:
    lines = ["| key | does |", "| --- | --- |"]
    lines += [f"| {k} | {v} |" for k, v in KEYS_HELP]
    lines += ["", "In the conversation list: Enter opens, r renames, d deletes, n starts a new "
              "one, / searches.", "", "| command | does |", "| --- | --- |"]
    for name, (args, what) in COMMANDS.items():
        lines.append(f"| /{name}{' ' + args if args else ''} | {what} |")
    lines += ["", "Start a message with // to send text that begins with /."]
    if keymap_file is not None:
        lines += ["", f"Keys can be rebound by action name in {keymap_file}."]
    return "\n".join(lines)


class ChatApp(App):
    CSS_PATH = _css_path()
    TITLE = "localchat"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True, id="stop"),
        Binding("ctrl+b", "toggle_sidebar", "Chats", id="toggle_sidebar"),
        Binding("ctrl+n", "new_conversation", "New", show=False, id="new_conversation"),
        Binding("ctrl+r", "regenerate", "Regen", show=False, id="regenerate"),
        Binding("ctrl+g", "continue_reply", "Continue", show=False, id="continue_reply"),
        Binding("f2", "copy_reply", "Copy", show=False, id="copy_reply"),
        Binding("f3", "copy_code", "Copy code", show=False, id="copy_code"),
        Binding("ctrl+t", "toggle_dark", "Theme", show=False, id="toggle_theme"),
        Binding("f1", "help", "Help", id="help"),
        Binding("ctrl+q", "quit", "Quit", priority=True, id="quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, settings: ChatSettings, engine: Engine | None = None, *,
                 store: ConversationStore | None | str = "open",
                 db_path: Path | None = None, continue_last: bool = False,
                 db_busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        super().__init__()
        self.settings = settings
        self.engine = engine
        self.entries: list[Entry] = []
        self.conversation = None  # storage.Conversation once the first message is saved
        self.store: ConversationStore | None = store if isinstance(store, ConversationStore) else None
        self.store_problem: StoreUnavailable | None = None
        self.last_error: str | None = None
        self.last_export: Path | None = None
        self.editing: int | None = None  # index of the user message being edited
        self._open_store = store == "open"
        self._db_path, self._busy_ms = db_path, db_busy_timeout_ms
        self._continue_last = continue_last
        self._cancel = threading.Event()
        self._generating = False
        self._streams: dict[int, object] = {}
        self._owns_engine = engine is None
        self._search = ""
        self._store_warned = False
        self.keymap_file, keymap, self.keymap_problem = load_keymap()
        if keymap:
            self.set_keymap(keymap)

    @property
    def history(self) -> list[Message]:
        """What the model sees: the system prompt, then every message on screen."""
        return list(self.settings.system_messages()) + [
            Message(e.role, e.content) for e in self.entries]

    def compose(self) -> ComposeResult:
        yield Static(f"localchat · {self.settings.model}", id="title")
        with Horizontal(id="main"):
            yield Sidebar(id="sidebar", classes="hidden")
            with Vertical(id="chatpane"):
                yield VerticalScroll(id="chat")
                yield GaugeBar(id="gauges")
                yield PromptInput(id="prompt", show_line_numbers=False)
        yield Footer()

    async def on_mount(self) -> None:
        self.query_one("#chat").anchor()
        self.query_one(PromptInput).focus()
        if self.keymap_problem:
            self._notice(self.keymap_problem)
        if self._open_store:
            self._open_history()
        if self._continue_last:
            await self._continue_last_conversation()
        if self.engine is None:
            self._load_engine()
        else:
            self.post_message(EngineLoaded(self.engine))

    # -- history database --------------------------------------------------------------

    def _open_history(self) -> None:
        try:
            self.store = ConversationStore.open(self._db_path, busy_timeout_ms=self._busy_ms)
        except StoreUnavailable as exc:
            self.store, self.store_problem = None, exc
            self._notice(str(exc))
            if exc.kind == "corrupt":
                self.push_screen(ConfirmScreen(
                    f"{exc}.\n\nSet the file aside (renamed to {exc.path.name}.corrupt-<time>, "
                    "nothing is deleted) and start a new history?",
                    yes="Set aside", no="Not now"), self._answer_set_aside)

    def _answer_set_aside(self, yes: bool | None) -> None:
        if not yes or self.store_problem is None:
            return
        try:
            moved = set_aside(self.store_problem.path)
        except OSError as exc:
            self._notice(f"could not set the history file aside: {exc}")
            return
        self._notice(f"the damaged history was set aside as {moved}")
        self.store_problem = None
        self._open_history()

    def _db(self, fn: Callable[[ConversationStore], T]) -> T | None:
        """A store call from the UI thread; a failure is reported once and the chat goes
        on in memory."""
        if self.store is None:
            return None
        try:
            return fn(self.store)
        except StoreError as exc:
            self._store_failed(str(exc))
            return None

    def _store_failed(self, error: str) -> None:
        self.last_error = error
        if not self._store_warned:
            self._store_warned = True
            self._notice(f"not saved to history: {error} (the chat goes on in memory)")

    @on(StoreFailed)
    def _store_failed_message(self, message: StoreFailed) -> None:
        self._store_failed(message.error)

    def _ensure_conversation(self, first_text: str) -> None:
        if self.conversation is not None or self.store is None:
            return
        s = self.settings
        self.conversation = self._db(lambda st: st.create_conversation(
            title_from(first_text), model=s.model, system_prompt=s.system, params=s.params()))

    async def _continue_last_conversation(self) -> None:
        last = self._db(lambda st: st.last_conversation())
        if last is None:
            self._notice("no earlier conversation to continue" if self.store
                         else "no history to continue from")
            return
        await self.open_conversation(last.id)

    async def open_conversation(self, conversation_id: int) -> bool:
        if self._generating:
            self._error("wait for the reply to finish (or press Esc) before switching")
            return False
        conv = self._db(lambda st: st.get_conversation(conversation_id))
        stored = self._db(lambda st: st.messages(conversation_id))
        if conv is None or stored is None:
            return False
        await self._reset_chat()
        self.conversation = conv
        self.settings = replace(self.settings.with_params(conv.params),
                                system=conv.system_prompt or None)
        chat = self.query_one("#chat", VerticalScroll)
        for m in stored:
            if m.role == "system":
                continue
            view = MessageView(m.role, m.content)
            await chat.mount(view)
            stats = Stats(**{k: v for k, v in (m.stats or {}).items()
                             if k in Stats.__dataclass_fields__})
            entry = Entry(m.role, m.content, view, m.id, m.status,
                          stats if m.stats else None)
            self.entries.append(entry)
            if m.role == "assistant":
                self._show_status(entry)
        if conv.model and conv.model != self.settings.model:
            self._notice(f"this conversation used model {conv.model}; it continues with "
                         f"{self.settings.model} (start with -m {conv.model} to use it)")
        await self._refresh_sidebar()
        return True

    async def _reset_chat(self) -> None:
        self.entries = []
        self.editing = None
        self._set_editing_title()
        await self.query_one("#chat", VerticalScroll).remove_children()

    async def _refresh_sidebar(self) -> None:
        sidebar = self.query_one(Sidebar)
        if sidebar.has_class("hidden"):
            return
        conversations = self._db(lambda st: st.list_conversations(self._search)) or []
        await sidebar.show(conversations, self.conversation.id if self.conversation else None)

    # -- loading -----------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="load")
    def _load_engine(self) -> None:
        try:
            engine = self.settings.load_engine()
        except LocalchatError as exc:
            self.post_message(EngineLoaded(None, str(exc)))
            return
        self.post_message(EngineLoaded(engine))

    @on(EngineLoaded)
    def _engine_loaded(self, message: EngineLoaded) -> None:
        gauges = self.query_one(GaugeBar)
        if message.error:
            gauges.state = "model failed to load"
            self._notice(f"Could not load the model: {message.error}")
            return
        self.engine = message.engine
        info = self.engine.info
        self.query_one("#title", Static).update(
            f"localchat · {info.name} · {info.quant_type} · {self.engine.name} · ctx {info.n_ctx}")
        gauges.state = "ready"

    # -- chatting ----------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _submit(self, message: PromptInput.Submitted) -> None:
        text = message.text.rstrip("\n")
        try:
            command = parse_command(text)
        except UsageError as exc:
            self._error(str(exc), restore=text)
            return
        if command is not None:
            await self.run_command(command, text)
            return
        if self.engine is None or self._generating:
            self.bell()
            self.query_one(PromptInput).text = text  # nothing typed is lost
            return
        if self.editing is not None:
            await self._truncate(self.editing)
            self.editing = None
            self._set_editing_title()
        await self._send(unescape(text))

    async def _send(self, text: str) -> None:
        self._ensure_conversation(text)
        view = MessageView("user", text)
        await self.query_one("#chat", VerticalScroll).mount(view)
        conv = self.conversation
        db_id = self._db(lambda st: st.add_message(conv.id, "user", text)) if conv else None
        self.entries.append(Entry("user", text, view, db_id))
        await self._start_reply()

    async def _start_reply(self, continuing: Entry | None = None) -> None:
        conv, s = self.conversation, self.settings
        if continuing is None:
            view = MessageView("assistant")
            await self.query_one("#chat", VerticalScroll).mount(view)
            entry = Entry("assistant", "", view)
            if conv is not None:
                entry.db_id = self._db(lambda st: st.begin_reply(
                    conv.id, model=s.model, params=s.params()))
            self.entries.append(entry)
            prefix = ""
        else:
            entry, view, prefix = continuing, continuing.view, continuing.content
            if entry.db_id is not None:
                self._db(lambda st: st.reopen_reply(entry.db_id))
            view.status.update("continuing…")
        entry.status = "streaming"
        writer = (ReplyWriter(self.store, entry.db_id, prefix=prefix)
                  if self.store is not None and entry.db_id is not None else None)
        self._streams[id(view)] = Markdown.get_stream(view.markdown)
        self._cancel = threading.Event()
        self._generating = True
        self.query_one(GaugeBar).state = "generating"
        self._generate(self.history[:-1], view, prefix, writer)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, history: list[Message], view: MessageView, prefix: str,
                  writer: ReplyWriter | None) -> None:
        engine = self.engine
        assert engine is not None
        try:
            n_ctx = engine.info.n_ctx
            reserve = min(self.settings.max_tokens or REPLY_RESERVE, n_ctx // 4)
            counted = (lambda ms: engine.count_prompt_tokens(list(ms) + [Message("assistant", prefix)])) \
                if prefix else engine.count_prompt_tokens
            fit = fit_history(history, counted, n_ctx - reserve)
            if fit.dropped_turns:
                self.call_from_thread(
                    self._notice,
                    f"{fit.dropped_turns} earlier turn(s) dropped to fit the "
                    f"{n_ctx}-token context (system prompt kept).",
                    before=view,
                )
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
                merged = Delta(text="".join(d.text for d in pending),
                               token_ids=tuple(t for d in pending for t in d.token_ids),
                               stats=pending[-1].stats)
                self.post_message(EngineEvent(merged, view))
                pending, last_post = [], time.monotonic()
            if isinstance(event, Result):
                status = "interrupted" if event.finish_reason == "cancelled" else "complete"
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

    @on(EngineEvent)
    async def _engine_event(self, message: EngineEvent) -> None:
        event, view = message.event, message.view
        self.query_one(GaugeBar).stats = event.stats
        stream = self._streams.get(id(view))
        entry = self._entry_for(view)
        if isinstance(event, Delta):
            if event.text and stream is not None:
                await stream.write(event.text)
            if entry is not None:
                entry.content += event.text
            return
        await self._finish(view)
        if entry is not None:
            entry.status = "interrupted" if event.finish_reason == "cancelled" else "complete"
            entry.stats, entry.finish_reason = event.stats, event.finish_reason
            self._show_status(entry)
        await self._refresh_sidebar()

    def _show_status(self, entry: Entry) -> None:
        labels = {"stop": "", "length": "stopped: reached the token limit",
                  "cancelled": "stopped"}
        label = labels.get(entry.finish_reason or "", "")
        if entry.status == "interrupted" and not label:
            label = "interrupted"
        s = entry.stats
        parts = []
        if s is not None:
            parts.append(f"{s.completion_tokens} tokens · {s.decode_tok_s:.1f} tok/s · TTFT "
                         f"{s.ttft_s * 1000:.0f} ms")
        if label:
            parts.append(label)
        entry.view.status.update(" · ".join(parts))

    @on(GenerationFailed)
    async def _generation_failed(self, message: GenerationFailed) -> None:
        await self._finish(message.view)
        entry = self._entry_for(message.view)
        if entry is not None and entry.content:  # a continuation failed: keep the reply
            entry.status = "interrupted"
            if entry.db_id is not None:
                self._db(lambda st: st.finish_reply(entry.db_id, entry.content,
                                                    status="interrupted"))
        elif entry is not None:
            # the user's message did not get a reply: keep it visible only
            index = self.entries.index(entry)
            start = index - 1 if index and self.entries[index - 1].role == "user" else index
            first = next((e.db_id for e in self.entries[start:] if e.db_id is not None), None)
            if first is not None and self.conversation is not None:
                self._db(lambda st: st.delete_messages_from(self.conversation.id, first))
            del self.entries[start:]
        message.view.status.update(f"error: {message.error}")

    async def _finish(self, view: MessageView) -> None:
        stream = self._streams.pop(id(view), None)
        if stream is not None:
            await stream.stop()
        self._generating = False
        self.query_one(GaugeBar).state = "ready"

    async def _truncate(self, index: int) -> None:
        """Remove entries[index:] from the screen and the history."""
        gone = self.entries[index:]
        first = next((e.db_id for e in gone if e.db_id is not None), None)
        if first is not None and self.conversation is not None:
            self._db(lambda st: st.delete_messages_from(self.conversation.id, first))
        del self.entries[index:]
        for entry in gone:
            await entry.view.remove()

    def _notice(self, text: str, before: MessageView | None = None) -> None:
        self.query_one("#chat").mount(Static(f"⚠ {text}", classes="notice"), before=before)

    def _error(self, text: str, restore: str | None = None) -> None:
        """A one-line error; `restore` puts what was typed back in the input."""
        self.last_error = text
        self.notify(text, severity="error", timeout=6)
        if restore is not None:
            prompt = self.query_one(PromptInput)
            prompt.text = restore
            prompt.move_cursor(prompt.document.end)

    def _info(self, text: str) -> None:
        self.notify(text, timeout=6)

    # -- slash commands ----------------------------------------------------------------

    async def run_command(self, command: Command, typed: str = "") -> None:
        try:
            await self._run_command(command)
        except UsageError as exc:
            self._error(str(exc), restore=typed or None)

    async def _run_command(self, command: Command) -> None:
        name, arg = command.name, command.arg
        if name == "help":
            self.action_help()
        elif name == "system":
            self._set_system(arg or None)
        elif name == "set":
            field, value = parse_set(arg)
            sampling, max_tokens = apply_set(self.settings.sampling, self.settings.max_tokens,
                                             field, value)
            self.settings = replace(self.settings, sampling=sampling, max_tokens=max_tokens)
            self._save_settings()
            self._info(f"{field} = {'default' if value is None else value}")
        elif name in ("clear", "new"):
            await self.action_new_conversation()
        elif name == "regen":
            await self.action_regenerate()
        elif name == "continue":
            await self.action_continue_reply()
        elif name == "edit":
            self.action_edit_last()
        elif name == "copy":
            if arg not in ("", "code"):
                raise UsageError("usage: /copy or /copy code")
            self.action_copy_code() if arg == "code" else self.action_copy_reply()
        elif name == "stats":
            self.action_show_stats()
        elif name == "export":
            fmt, path = export_args(arg)
            self.action_export(fmt, path)
        elif name == "rename":
            if not arg:
                raise UsageError("usage: /rename TITLE")
            await self._rename(arg)

    def _set_system(self, text: str | None) -> None:
        self.settings = replace(self.settings, system=text)
        if self.conversation is not None:
            cid = self.conversation.id
            self._db(lambda st: st.update_settings(cid, system_prompt=text))
        self._info("system prompt set" if text else "system prompt cleared")

    def _save_settings(self) -> None:
        if self.conversation is not None:
            cid, params = self.conversation.id, self.settings.params()
            self._db(lambda st: st.update_settings(cid, params=params))

    # -- actions -----------------------------------------------------------------------

    def action_stop(self) -> None:
        """Esc: stop the reply being generated (what was said so far is kept); cancel
        an edit; otherwise let the key through (closing dialogs)."""
        if self._generating:
            self._cancel.set()
        elif self.editing is not None and self.screen is self.screen_stack[0]:
            self.editing = None
            self.query_one(PromptInput).clear()
            self._set_editing_title()
        else:
            raise SkipAction()

    def _ready_for_control(self) -> bool:
        if self._generating:
            self._error("a reply is being generated (Esc stops it)")
            return False
        if self.engine is None:
            self._error("the model is not loaded")
            return False
        return True

    async def action_regenerate(self) -> None:
        if not self._ready_for_control():
            return
        if not self.entries:
            self._error("nothing to regenerate yet")
            return
        if self.entries[-1].role == "assistant":
            await self._truncate(len(self.entries) - 1)
        await self._start_reply()

    async def action_continue_reply(self) -> None:
        if not self._ready_for_control():
            return
        last = self.entries[-1] if self.entries else None
        if last is None or last.role != "assistant" or not last.content:
            self._error("no reply to continue")
            return
        await self._start_reply(continuing=last)

    def action_edit_last(self) -> None:
        if self._generating:
            self._error("a reply is being generated (Esc stops it)")
            return
        users = [i for i, e in enumerate(self.entries) if e.role == "user"]
        if not users:
            self._error("no message to edit yet")
            return
        self.editing = users[-1]
        prompt = self.query_one(PromptInput)
        prompt.text = self.entries[users[-1]].content
        prompt.move_cursor(prompt.document.end)
        prompt.focus()
        self._set_editing_title()

    def _set_editing_title(self) -> None:
        self.query_one(PromptInput).border_title = (
            "editing your last message · Enter resends · Esc cancels"
            if self.editing is not None else None)

    @on(PromptInput.EditLast)
    def _edit_last_key(self, message: PromptInput.EditLast) -> None:
        if self.entries and not self._generating:
            self.action_edit_last()

    def _last_reply(self) -> Entry | None:
        return next((e for e in reversed(self.entries) if e.role == "assistant"), None)

    def _copy(self, text: str, what: str) -> None:
        path = copy_text(self, text)
        where = f"; also saved to {path}" if path else ""
        self._info(f"copied {what} to the clipboard (if the terminal allows OSC 52){where}")

    def action_copy_reply(self) -> None:
        reply = self._last_reply()
        if reply is None or not reply.content:
            self._error("no reply to copy")
            return
        self._copy(reply.content, "the last reply")

    def action_copy_code(self) -> None:
        reply = self._last_reply()
        code = last_code_block(reply.content) if reply else None
        if code is None:
            self._error("the last reply has no code block")
            return
        self._copy(code, "the last code block")

    @on(MessageView.Clicked)
    def _message_clicked(self, message: MessageView.Clicked) -> None:
        entry = self._entry_for(message.view)
        if entry is not None and entry.content:
            self._copy(entry.content, "the message")

    def action_show_stats(self) -> None:
        reply = next((e for e in reversed(self.entries)
                      if e.role == "assistant" and e.stats is not None), None)
        if reply is None:
            self._error("no reply with stats yet")
            return
        rows = list(reply.stats.to_dict().items())
        rows += [("finish_reason", reply.finish_reason or reply.status), ("status", reply.status)]
        if self.engine is not None:
            rows += [("model", self.engine.info.name), ("engine", self.engine.name)]
        body = "| field | value |\n| --- | --- |\n" + "\n".join(
            f"| {k} | {v:.4g} |" if isinstance(v, float) else f"| {k} | {v} |" for k, v in rows)
        self.push_screen(InfoScreen("Stats of the last reply", body))

    def action_export(self, fmt: str = "md", path: str | None = None) -> None:
        if self.conversation is None or self.store is None:
            self._error("nothing to export: this conversation is not in the history yet")
            return
        from localchat.models import data_dir

        conv = self._db(lambda st: st.get_conversation(self.conversation.id))
        stored = self._db(lambda st: st.messages(self.conversation.id))
        if conv is None or stored is None:
            return
        target = Path(path).expanduser() if path else default_export_path(
            data_dir() / "exports", conv, fmt)
        try:
            export_conversation(target, conv, stored, fmt)
        except OSError as exc:
            self._error(f"export failed: {exc}")
            return
        self.last_export = target
        self._info(f"exported to {target}")

    def action_help(self) -> None:
        self.push_screen(InfoScreen("localchat help", help_markdown(self.keymap_file)))

    async def action_new_conversation(self) -> None:
        if self._generating:
            self._error("a reply is being generated (Esc stops it)")
            return
        await self._reset_chat()
        self.conversation = None
        await self._refresh_sidebar()

    async def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one(Sidebar)
        sidebar.toggle_class("hidden")
        if sidebar.has_class("hidden"):
            self.query_one(PromptInput).focus()
            return
        await self._refresh_sidebar()
        self.query_one("#conversations").focus()

    def action_rename_current(self) -> None:
        if self.conversation is None:
            self._error("this conversation is not in the history yet")
            return
        self._ask_rename(self.conversation.id)

    def action_delete_current(self) -> None:
        if self.conversation is None:
            self._error("this conversation is not in the history yet")
            return
        self._ask_delete(self.conversation.id)

    @on(Sidebar.Action)
    async def _sidebar_action(self, message: Sidebar.Action) -> None:
        if message.action == "open":
            if await self.open_conversation(message.conversation_id):
                self.query_one(PromptInput).focus()
        elif message.action == "rename":
            self._ask_rename(message.conversation_id)
        elif message.action == "delete":
            self._ask_delete(message.conversation_id)
        elif message.action == "new":
            await self.action_new_conversation()
            self.query_one(PromptInput).focus()

    @on(Sidebar.SearchChanged)
    async def _search_changed(self, message: Sidebar.SearchChanged) -> None:
        self._search = message.text
        await self._refresh_sidebar()

    def _ask_rename(self, conversation_id: int) -> None:
        conv = self._db(lambda st: st.get_conversation(conversation_id))
        if conv is None:
            return

        async def done(title: str | None) -> None:
            if title:
                await self._rename(title, conversation_id)

        self.push_screen(TextInputScreen("New title", conv.title), done)

    async def _rename(self, title: str, conversation_id: int | None = None) -> None:
        cid = conversation_id if conversation_id is not None else (
            self.conversation.id if self.conversation else None)
        if cid is None:
            raise UsageError("this conversation is not in the history yet")
        self._db(lambda st: st.rename(cid, title))
        if self.conversation is not None and self.conversation.id == cid:
            self.conversation = replace(self.conversation, title=title)
        await self._refresh_sidebar()

    def _ask_delete(self, conversation_id: int) -> None:
        conv = self._db(lambda st: st.get_conversation(conversation_id))
        if conv is None:
            return
        if self._generating and self.conversation and self.conversation.id == conversation_id:
            self._error("a reply is being generated in this conversation (Esc stops it)")
            return
        count = len(self._db(lambda st: st.messages(conversation_id)) or [])

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            self._db(lambda st: st.delete(conversation_id))
            if self.conversation is not None and self.conversation.id == conversation_id:
                await self._reset_chat()
                self.conversation = None
            await self._refresh_sidebar()

        self.push_screen(ConfirmScreen(
            f"Delete “{conv.title}” and its {count} message(s)? This cannot be undone.",
            yes="Delete"), done)

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """Textual saves to ~/Downloads; where there is none, save in the current folder."""
        downloads = Path(platformdirs.user_downloads_dir())
        super().action_screenshot(filename, path or str(downloads if downloads.is_dir() else Path.cwd()))

    def on_unmount(self) -> None:
        self._cancel.set()
        if self._open_store and self.store is not None:
            self.store.close()
        if self._owns_engine and self.engine is not None:
            self.workers.cancel_all()
            self.engine.close()


def run_tui(args: argparse.Namespace) -> int:
    continue_last = getattr(args, "continue_last", False)
    ChatApp(ChatSettings.from_args(args), continue_last=continue_last).run()
    return 0
