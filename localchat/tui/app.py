"""ChatApp, the shell of the chat UI: layout, key bindings, the first engine load, notices
and a reply streaming in from a worker, over a ChatSession (chat/session.py). Its actions
are in controls.py; it holds `conversations` (conversations.py) and `switcher` (switching.py)."""

from __future__ import annotations

import os
import sys
import threading
import time
from dataclasses import dataclass, replace
from importlib.resources import files
from pathlib import Path

import platformdirs
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.content import Content
from textual.message import Message as TextualMessage
from textual.widgets import Footer, Static

from localchat.chat.call_record import CallRecord
from localchat.chat.session import ChatSession, Entry, Reply
from localchat.engine.base import BASE_MODEL_NOTE, Delta, Engine, Message, Result
from localchat.errors import LocalchatError
from localchat.chat.params import ReplyParams
from localchat.engine import open_engine
from localchat.engine.config import EngineConfig
from localchat.storage import ConversationStore, StoreUnavailable
from localchat.storage.db import BUSY_TIMEOUT_MS
from localchat.tui.chat_log import ChatLog
from localchat.tui.chat_tools import ChatTools
from localchat.tui.controls import ControlsMixin
from localchat.tui.conversations import Conversations
from localchat.tui.help import EMPTY_HINT, KEYS_HELP, help_markdown
from localchat.tui.keymap import load_keymap
from localchat.tui.palette import ChatCommands
from localchat.tui.sidebar import Sidebar
from localchat.tui.switching import EngineSwitcher
from localchat.tui.widgets import GaugeBar, MessageView, PromptInput, RateSparkline

__all__ = ["ChatApp", "run_tui", "KEYS_HELP", "help_markdown", "UI_INTERVAL_S"]

UI_INTERVAL_S = 0.1  # redraw at most 10 times a second: a redraw per token halved decode speed


@dataclass(frozen=True)
class ShownEntry:
    """A session entry with the view that shows it (what `ChatApp.entries` lists)."""

    entry: Entry
    view: MessageView

    def __getattr__(self, name: str):
        return getattr(self.entry, name)


def _css_path() -> Path:
    """assets/ at the repository root; a built wheel ships it as localchat.assets."""
    in_checkout = Path(__file__).resolve().parents[2] / "assets" / "app.tcss"
    if in_checkout.is_file():
        return in_checkout
    return Path(str(files("localchat.assets").joinpath("app.tcss")))


class ChatApp(ControlsMixin, App):
    CSS_PATH = _css_path()
    TITLE = "localchat"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True, id="stop"),
        Binding("ctrl+b", "toggle_sidebar", "Chats", id="toggle_sidebar"),
        Binding("ctrl+n", "new_conversation", "New", show=False, id="new_conversation"),
        Binding("ctrl+r", "regenerate", "Regen", show=False, id="regenerate"),
        Binding("ctrl+g", "continue_reply", "Continue", show=False, id="continue_reply"),
        Binding("alt+up", "select_previous", "Select message", show=False, priority=True,
                id="select_previous"),
        Binding("alt+down", "select_next", "Select next", show=False, priority=True,
                id="select_next"),
        Binding("alt+left", "previous_version", "Previous version", show=False, priority=True,
                id="previous_version"),
        Binding("alt+right", "next_version", "Next version", show=False, priority=True,
                id="next_version"),
        Binding("f2", "copy_reply", "Copy", show=False, id="copy_reply"),
        Binding("f3", "copy_code", "Copy code", show=False, id="copy_code"),
        Binding("f4", "toggle_draft_colours", "Draft colours", show=False,
                id="toggle_draft_colours"),
        # priority: the input box (a TextArea) has its own F6 and F7 (select line / all)
        Binding("f5", "toggle_reasoning", "Thinking", show=False, id="toggle_reasoning"),
        Binding("f6", "parameters", "Params", priority=True, id="parameters"),
        Binding("f7", "pick_model", "Model", show=False, priority=True, id="pick_model"),
        Binding("f8", "toggle_speculation", "Draft on/off", show=False, priority=True,
                id="toggle_speculation"),
        Binding("ctrl+t", "toggle_dark", "Theme", show=False, id="toggle_theme"),
        Binding("f1", "help", "Help", id="help"),
        Binding("ctrl+q", "quit", "Quit", priority=True, id="quit"),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    @dataclass
    class EngineLoaded(TextualMessage):
        """The first engine loaded in a worker (or failed to: error)."""

        engine: Engine | None
        error: str | None = None

    @dataclass
    class Streamed(TextualMessage):
        """The Deltas of one UI interval of a reply, from the generating worker."""

        reply: Reply
        deltas: list[Delta]

    @dataclass
    class Finished(TextualMessage):
        reply: Reply
        result: Result

    @dataclass
    class Failed(TextualMessage):
        reply: Reply
        error: str

    @dataclass
    class CallMade(TextualMessage):
        """A tool call of a reply ran (or was refused), from the generating worker."""

        reply: Reply
        call: CallRecord

    @dataclass
    class ToolsStarted(TextualMessage):
        notes: list[str]

    @dataclass
    class StoreFailed(TextualMessage):
        """A history write failed in a worker thread."""

        error: str

    def __init__(self, config: EngineConfig, params: ReplyParams | None = None,
                 engine: Engine | None = None, *,
                 store: ConversationStore | None | str = "open",
                 db_path: Path | None = None, continue_last: bool = False,
                 db_busy_timeout_ms: int = BUSY_TIMEOUT_MS, mcp: str | None = None) -> None:
        super().__init__()
        self.conversations = Conversations(self, db_path, db_busy_timeout_ms)
        self.switcher = EngineSwitcher(self)
        self.session = ChatSession(
            config, params, store if isinstance(store, ConversationStore) else None, engine,
            on_store_error=self.conversations.store_failed)
        self.attachments: list = []  # chat.attachments.Attachment: sent with the next message
        self.store_problem: StoreUnavailable | None = None
        self.last_error: str | None = None
        self.last_export: Path | None = None
        self.editing: int | None = None  # index of the user message being edited
        self.selected: int | None = None  # index of the message the controls act on
        self.owns_engine = engine is None  # closed on quit (and when a switch replaces it)
        self.engine_requested = False  # on_mount starts the first load
        self._open_store = store == "open"
        self._continue_last = continue_last
        self._cancel = threading.Event()
        self._base_models_noted: set[str] = set()  # paths already said to be base models
        self._reply: Reply | None = None  # the reply being generated
        self.tools, self.tools_problem = _chat_tools(self, mcp)  # started once the UI is up
        self.keymap_file, keymap, self.keymap_problem = load_keymap()
        if keymap:
            self.set_keymap(keymap)

    @property
    def entries(self) -> list[ShownEntry]:
        """The messages on screen, each with its view (one whose view is still being
        mounted is not on screen yet)."""
        views = self.query_one(ChatLog).views
        return [ShownEntry(e, views[e.key]) for e in self.session.entries if e.key in views]

    @property
    def generating(self) -> bool:
        return self._reply is not None


    async def open_conversation(self, conversation_id: int) -> bool:
        return await self.conversations.open(conversation_id)

    def switch_engine(self, config: EngineConfig, what: str) -> bool:
        """Load an engine for config in a worker; it replaces the current one when ready."""
        return self.switcher.switch(config, what)

    @property
    def draft_colours(self) -> bool:
        return self.query_one(ChatLog).draft_colours

    def compose(self) -> ComposeResult:
        yield Static(f"localchat · {self.session.config.model}", id="title")
        with Horizontal(id="main"):
            yield Sidebar(id="sidebar", classes="hidden")
            with Vertical(id="chatpane"):
                yield Static("", id="system-line", classes="hidden")
                yield ChatLog(id="chat")
                with Horizontal(id="gaugerow"):
                    yield GaugeBar(id="gauges")
                    yield RateSparkline(id="rate")
                yield PromptInput(id="prompt", show_line_numbers=False, placeholder=EMPTY_HINT)
        yield Footer()

    def show_constraint(self) -> None:
        """The gauge says `json` while this conversation's replies are constrained."""
        self.query_one(GaugeBar).constrained = self.session.params.constraint is not None

    def show_system_prompt(self) -> None:
        """The system prompt, on one line above the chat (hidden when there is none)."""
        line = self.query_one("#system-line", Static)
        system = self.session.params.system
        line.set_class(not system, "hidden")
        line.update(Content(f"System: {' '.join((system or '').split())}  (/system edits)"))

    async def on_mount(self) -> None:
        self.show_system_prompt()
        self.show_constraint()
        self.query_one("#chat").anchor()
        self.query_one(PromptInput).focus()
        if self.keymap_problem:
            self.notice(self.keymap_problem)
        if self.tools_problem:
            self.notice(self.tools_problem)
        if self._open_store:
            self.conversations.open_store()
        if self._continue_last:
            await self.conversations.continue_last()
        self.engine_requested = True  # from now on a conversation's model loads live
        if self.tools is not None:
            self._start_tools()
        if self.session.engine is None:
            self._load_engine()
        else:
            self.post_message(self.EngineLoaded(self.session.engine))
        if not self.is_headless and hasattr(os, "tcgetpgrp") and sys.__stdin__.isatty():
            self.set_interval(2.0, self._quit_if_terminal_gone)

    async def _quit_if_terminal_gone(self) -> None:
        """A closed terminal window does not always deliver SIGHUP (under `make chat` it
        reaches make); then the tty only answers EIO and the reply would keep computing,
        so quit as Ctrl+Q does (the partial reply is kept)."""
        try:
            os.tcgetpgrp(sys.__stdin__.fileno())
        except (OSError, ValueError):
            await self.action_quit()

    # -- loading -----------------------------------------------------------------------

    @work(thread=True, exclusive=True, group="tools")
    def _start_tools(self) -> None:
        self.post_message(self.ToolsStarted(self.tools.start()))

    def on_chat_app_tools_started(self, message: ChatApp.ToolsStarted) -> None:
        for note in message.notes:
            self.notice(note)
        names = [t.exposed for t in self.tools.hub.tools()]
        if names:
            self.notice(f"tools: {', '.join(names)} (/tools lists them; each call asks first)",
                        warning=False)

    @work(thread=True, exclusive=True, group="load")
    def _load_engine(self) -> None:
        try:
            engine = open_engine(self.session.config, say=self.say_from_worker)
        except LocalchatError as exc:
            self.post_message(self.EngineLoaded(None, str(exc)))
            return
        self.post_message(self.EngineLoaded(engine))

    def on_chat_app_engine_loaded(self, message: ChatApp.EngineLoaded) -> None:
        gauges = self.query_one(GaugeBar)
        if message.error:
            gauges.state = "model failed to load"
            self.notice(f"Could not load the model: {message.error}")
            return
        self.session.engine = message.engine
        self.show_engine()
        gauges.state = "ready"
        self.say_engine_choice()

    def say_from_worker(self, line: str) -> None:
        """A loading worker's note (the engine rule measuring): in the chat and the gauges."""
        def show() -> None:
            self.notice(line, warning=False)
            self.query_one(GaugeBar).state = "measuring the engines (once)…"
        self.call_from_thread(show)

    def say_engine_choice(self) -> None:
        """Where the rule measured which executor is faster, a note of what it measured."""
        engine = self.session.engine
        if engine.why.startswith("measured"):
            self.notice(f"engine {engine.name}: {engine.why}", warning=False)

    def show_engine(self) -> None:
        """The title line: model, quantization, engine, context and draft."""
        info = self.session.engine.info
        draft = f" · draft {self.session.config.draft.label()}" if self.session.config.draft.enabled else ""
        where = (f"{info.path}" if self.session.engine.name == "remote"  # the server's URL, not
                 else f"{info.quant_type} · {self.session.engine.name}")  # "remote · remote"
        self.query_one("#title", Static).update(
            f"localchat · {info.name} · {where} · ctx {info.n_ctx}{draft}")
        if info.base_model and info.path not in self._base_models_noted:  # once per model
            self._base_models_noted.add(info.path)
            self.notice(BASE_MODEL_NOTE)

    # -- a reply streaming -------------------------------------------------------------

    async def start_reply(self, reply: Reply) -> None:
        """Show the session's entries and generate `reply` in a worker thread."""
        self._cancel = threading.Event()
        self._reply = reply  # generating from now on: the entries are the session's already
        log = self.query_one(ChatLog)
        await log.show(self.session.entries)
        key = reply.entry.key
        if reply.prefix:  # a continuation streams on into the Markdown
            log.views[key].status.update("continuing…")
            log.views[key].show_runs(None)
        log.begin_stream(key, reply.prefix)
        gauges = self.query_one(GaugeBar)
        gauges.state = "generating"
        if gauges.stats is not None:  # the last reply's rates are not this one's: until its
            gauges.stats = replace(gauges.stats, ttft_s=0.0, prefill_tok_s=0.0,  # first token
                                   decode_tok_s=0.0, completion_tokens=0)
        self.query_one(RateSparkline).reset()
        self._generate(reply)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, reply: Reply) -> None:
        """The session's reply pipeline; the Deltas of each UI interval posted as one message."""
        def dropped(fit) -> None:
            self.call_from_thread(
                self.notice, f"{fit.dropped_note(self.session.engine.info.n_ctx)} (system "
                "prompt kept).", before=reply.entry.key)

        tools = self.tools.use(self.session.params, self._cancel) \
            if self.tools is not None and not reply.prefix else None
        try:
            pending: list[Delta] = []
            last_post = 0.0
            for event in self.session.reply(
                    reply, self._cancel, on_dropped=dropped, tools=tools,
                    on_store_error=lambda error: self.post_message(self.StoreFailed(error))):
                if isinstance(event, CallRecord):
                    self.post_message(self.CallMade(reply, event))
                    continue
                if isinstance(event, Delta):
                    pending.append(event)
                    if time.monotonic() - last_post < UI_INTERVAL_S:
                        continue
                if pending:
                    self.post_message(self.Streamed(reply, pending))
                    pending, last_post = [], time.monotonic()
                if isinstance(event, Result):
                    self.post_message(self.Finished(reply, event))
        except LocalchatError as exc:
            self.post_message(self.Failed(reply, str(exc)))

    def _show_figures(self, stats) -> None:
        self.query_one(GaugeBar).stats = stats
        self.query_one(RateSparkline).add(stats)

    async def on_chat_app_streamed(self, message: ChatApp.Streamed) -> None:
        self._show_figures(message.deltas[-1].stats)
        await self.query_one(ChatLog).write(message.reply.entry.key,
                                            "".join(d.text for d in message.deltas))

    async def on_chat_app_call_made(self, message: ChatApp.CallMade) -> None:
        await self.query_one(ChatLog).add_call(message.reply.entry.key, message.call)
        for note in self.tools.fresh_notes():
            self.notice(note, before=message.reply.entry.key)

    async def on_chat_app_finished(self, message: ChatApp.Finished) -> None:
        reply, result = message.reply, message.result
        self._show_figures(result.stats)
        log = self.query_one(ChatLog)
        key = reply.entry.key
        await log.write(key, "", final=True)
        await self._finish(reply)
        view = log.views.get(key)
        if view is not None and view.reasoning and self.session.engine is not None:
            count = self.session.engine.count_prompt_tokens  # the reasoning's tokens, as the
            empty = count([Message("assistant", "")])  # engine tokenizes them
            view.set_reasoning_tokens(count([Message("assistant", view.reasoning)]) - empty)
        if view is not None:
            log.show_status(reply.entry)
            log.show_runs(reply.entry)
        await self.conversations.refresh_sidebar()

    async def on_chat_app_failed(self, message: ChatApp.Failed) -> None:
        await self._finish(message.reply)
        log = self.query_one(ChatLog)
        view = log.views.get(message.reply.entry.key)
        outcome, gone = self.session.fail(message.reply, message.error)
        if outcome == "kept":
            log.show_runs(message.reply.entry)
        elif outcome == "restored":  # a new version failed: the one it was to replace is back
            await log.show(self.session.entries)
            self.notice(f"error: {message.error} (the earlier reply is back)")
            return
        elif outcome == "dropped":  # the user's message got no reply: it stays on screen only
            log.keep(gone)
        if view is not None:
            view.status.update(f"error: {message.error}")

    def on_engine_switcher_loaded(self, message: EngineSwitcher.Loaded) -> None:
        self.switcher.loaded(message)

    def on_chat_app_store_failed(self, message: ChatApp.StoreFailed) -> None:
        self.conversations.store_failed(message.error)

    async def _finish(self, reply: Reply) -> None:
        await self.query_one(ChatLog).end_stream(reply.entry.key)
        self._reply = None
        self.query_one(GaugeBar).state = "ready"

    # -- notices -----------------------------------------------------------------------

    def notice(self, text: str, before: int | None = None, warning: bool = True) -> None:
        """A one-line notice in the chat (above entry `before`'s message); ⚠ for a warning."""
        self.query_one(ChatLog).notice(text, before, warning)

    def error(self, text: str, restore: str | None = None) -> None:
        """A one-line error; `restore` puts what was typed back in the input."""
        self.last_error = text
        self.notify(text, severity="error", timeout=6)
        if restore is not None:
            prompt = self.query_one(PromptInput)
            prompt.text = restore
            prompt.move_cursor(prompt.document.end)

    def info(self, text: str) -> None:
        """A passing notification."""
        self.notify(text, timeout=6)

    def stop_reply(self) -> None:
        """Stop the reply being generated (what was said so far is kept)."""
        self._cancel.set()

    async def action_quit(self) -> None:
        self._cancel.set()
        self.exit()

    def action_screenshot(self, filename: str | None = None, path: str | None = None) -> None:
        """Textual saves to ~/Downloads; where there is none, save in the current folder."""
        downloads = Path(platformdirs.user_downloads_dir())
        super().action_screenshot(filename, path or str(downloads if downloads.is_dir() else Path.cwd()))

    def on_unmount(self) -> None:
        self._cancel.set()
        if self._open_store and self.session.store is not None:
            self.session.store.close()
        if self.tools is not None:
            self.tools.close()
        if self.owns_engine and self.session.engine is not None:
            self.workers.cancel_all()
            self.session.engine.close()


def run_tui(config: EngineConfig, params: ReplyParams, *, continue_last: bool = False,
            mcp: str | None = None) -> int:
    """The chat UI until the user quits; config's engine loads in the background. mcp: the
    MCP servers' file ("": the data dir's mcp.json, where there is one)."""
    if mcp:  # a bad file named by --mcp is one line before the UI opens
        from localchat.tools.config import load_servers

        load_servers(mcp)
    ChatApp(config, params, continue_last=continue_last, mcp=mcp).run()
    return 0


def _chat_tools(app: ChatApp, mcp: str | None) -> tuple[ChatTools | None, str | None]:
    """The chat's tools from the MCP servers' file (None: the data dir's mcp.json, if any);
    a file that cannot be used is a note and the chat goes on without tools."""
    from localchat.tools.config import load_servers

    try:
        servers = load_servers(mcp or None)
    except LocalchatError as exc:
        return None, f"no tools: {exc}"
    return (ChatTools(app, servers) if servers else None), None
