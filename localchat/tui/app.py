"""The chat app: a Textual UI over one in-process engine, with conversations kept in
the history database.

This module is the shell: the layout, the keys, loading the model in a worker thread,
the one-line notices and errors, and shutting down. What the app does is split by
concern into mixins: generation.py (replies streamed from the engine), conversations.py
(the history database and the sidebar), branches.py (message versions and /fork), controls.py (the input, slash commands and
chat actions), drafts.py (speculative decoding shown in the replies) and switching.py
(the parameters panel, the model picker and speculation on/off, reloading the engine). The model loads and generates in worker threads, so the UI never blocks.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from importlib.resources import files
from pathlib import Path

import platformdirs
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.content import Content
from textual.widgets import Footer, Static

from localchat.chat.reasoning import without_reasoning
from localchat.engine.base import Engine, Message
from localchat.errors import LocalchatError
from localchat.settings import ChatSettings
from localchat.storage import ConversationStore, StoreUnavailable
from localchat.storage.db import BUSY_TIMEOUT_MS
from localchat.tui.branches import BranchesMixin
from localchat.tui.controls import ControlsMixin
from localchat.tui.conversations import ConversationsMixin
from localchat.tui.drafts import DraftColoursMixin
from localchat.tui.generation import UI_INTERVAL_S, GenerationMixin
from localchat.tui.help import EMPTY_HINT, KEYS_HELP, help_markdown
from localchat.tui.keymap import load_keymap
from localchat.tui.messages import Entry, EngineEvent, EngineLoaded, GenerationFailed, StoreFailed
from localchat.tui.palette import ChatCommands
from localchat.tui.sidebar import Sidebar
from localchat.tui.switching import SwitchingMixin, draft_label
from localchat.tui.widgets import GaugeBar, MessageView, PromptInput, RateSparkline

__all__ = ["ChatApp", "run_tui", "Entry", "EngineEvent", "EngineLoaded", "GenerationFailed",
           "StoreFailed", "KEYS_HELP", "help_markdown", "UI_INTERVAL_S"]


def _css_path() -> Path:
    """assets/ at the repository root; a built wheel ships it as localchat.assets."""
    in_checkout = Path(__file__).resolve().parents[2] / "assets" / "app.tcss"
    if in_checkout.is_file():
        return in_checkout
    return Path(str(files("localchat.assets").joinpath("app.tcss")))


class ChatApp(ControlsMixin, ConversationsMixin, BranchesMixin, GenerationMixin,
              DraftColoursMixin, SwitchingMixin, App):
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

    def __init__(self, settings: ChatSettings, engine: Engine | None = None, *,
                 store: ConversationStore | None | str = "open",
                 db_path: Path | None = None, continue_last: bool = False,
                 db_busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        super().__init__()
        self.settings = settings
        self.engine = engine
        self.entries: list[Entry] = []
        self.attachments: list = []  # chat.attachments.Attachment: sent with the next message
        self.conversation = None  # storage.Conversation once the first message is saved
        self.store: ConversationStore | None = store if isinstance(store, ConversationStore) else None
        self.store_problem: StoreUnavailable | None = None
        self.last_error: str | None = None
        self.last_export: Path | None = None
        self.editing: int | None = None  # index of the user message being edited
        self.selected: int | None = None  # index of the message the controls act on
        self._open_store = store == "open"
        self._db_path, self._busy_ms = db_path, db_busy_timeout_ms
        self._continue_last = continue_last
        self._cancel = threading.Event()
        self._generating = False
        self._streams: dict[int, object] = {}
        self._owns_engine = engine is None
        self._engine_requested = False  # on_mount starts the first load
        self._search = ""
        self._store_warned = False
        self.keymap_file, keymap, self.keymap_problem = load_keymap()
        if keymap:
            self.set_keymap(keymap)

    @property
    def history(self) -> list[Message]:
        """What the model sees: the system prompt, then every message on screen."""
        return list(self.settings.system_messages()) + [  # earlier reasoning is not sent back
            Message(e.role, without_reasoning(e.content) if e.role == "assistant" else e.content)
            for e in self.entries]

    def compose(self) -> ComposeResult:
        yield Static(f"localchat · {self.settings.model}", id="title")
        with Horizontal(id="main"):
            yield Sidebar(id="sidebar", classes="hidden")
            with Vertical(id="chatpane"):
                yield Static("", id="system-line", classes="hidden")
                yield VerticalScroll(id="chat")
                with Horizontal(id="gaugerow"):
                    yield GaugeBar(id="gauges")
                    yield RateSparkline(id="rate")
                yield PromptInput(id="prompt", show_line_numbers=False, placeholder=EMPTY_HINT)
        yield Footer()

    def show_system_prompt(self) -> None:
        """The system prompt, on one line above the chat (hidden when there is none)."""
        line = self.query_one("#system-line", Static)
        system = self.settings.system
        line.set_class(not system, "hidden")
        line.update(Content(f"System: {' '.join((system or '').split())}  (/system edits)"))

    async def on_mount(self) -> None:
        self.show_system_prompt()
        self.query_one("#chat").anchor()
        self.query_one(PromptInput).focus()
        if self.keymap_problem:
            self._notice(self.keymap_problem)
        if self._open_store:
            self._open_history()
        if self._continue_last:
            await self._continue_last_conversation()
        self._engine_requested = True  # from now on a conversation's model loads live
        if self.engine is None:
            self._load_engine()
        else:
            self.post_message(EngineLoaded(self.engine))
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

    @work(thread=True, exclusive=True, group="load")
    def _load_engine(self) -> None:
        try:
            engine = self.settings.load_engine()
        except LocalchatError as exc:
            self.post_message(EngineLoaded(None, str(exc)))
            return
        self.post_message(EngineLoaded(engine))

    def _on_engine_loaded(self, message: EngineLoaded) -> None:
        gauges = self.query_one(GaugeBar)
        if message.error:
            gauges.state = "model failed to load"
            self._notice(f"Could not load the model: {message.error}")
            return
        self.engine = message.engine
        self._show_engine()
        gauges.state = "ready"

    def _show_engine(self) -> None:
        info = self.engine.info
        draft = f" · draft {draft_label(self.settings.draft)}" if self.settings.draft else ""
        where = (f"{info.path}" if self.engine.name == "remote"  # the server's URL, not
                 else f"{info.quant_type} · {self.engine.name}")  # "remote · remote"
        self.query_one("#title", Static).update(
            f"localchat · {info.name} · {where} · ctx {info.n_ctx}{draft}")

    # -- notices -----------------------------------------------------------------------

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
    # two KV slots: the chat, and the one before it stays cached when you switch back
    ChatApp(ChatSettings.from_args(args).with_parallel(2), continue_last=continue_last).run()
    return 0
