"""Conversations (the app's `conversations`): the history store (offering to set a damaged
file aside), the sidebar's list, and opening, renaming, deleting and exporting conversations.
Store calls go through ChatSession.db: a failing database is reported once, the chat goes on."""

from __future__ import annotations

from pathlib import Path

from textual.app import App

from localchat.errors import UsageError
from localchat.storage import ConversationStore, StoreUnavailable, set_aside
from localchat.storage.export import default_export_path, export_conversation
from localchat.tui.chat_log import ChatLog
from localchat.tui.screens import ConfirmScreen, TextInputScreen
from localchat.tui.sidebar import Sidebar
from localchat.tui.widgets import PromptInput


class Conversations:
    """The history side of the chat; `search` is the sidebar's search text."""

    def __init__(self, app: App, db_path: Path | None, busy_timeout_ms: int) -> None:
        self.app = app  # the ChatApp: its session, chat log and notices
        self.db_path, self.busy_timeout_ms = db_path, busy_timeout_ms
        self.search = ""
        self.store_warned = False

    # -- the store -------------------------------------------------------------------

    def open_store(self) -> None:
        app = self.app
        try:
            app.session.store = ConversationStore.open(self.db_path, busy_timeout_ms=self.busy_timeout_ms)
        except StoreUnavailable as exc:
            app.session.store, app.store_problem = None, exc
            app.notice(str(exc))
            if exc.kind == "corrupt":
                app.push_screen(ConfirmScreen(
                    f"{exc}.\n\nSet the file aside (renamed to {exc.path.name}.corrupt-<time>, "
                    "nothing is deleted) and start a new history?",
                    yes="Set aside", no="Not now"), self.answer_set_aside)

    def answer_set_aside(self, yes: bool | None) -> None:
        app = self.app
        if not yes or app.store_problem is None:
            return
        try:
            moved = set_aside(app.store_problem.path)
        except OSError as exc:
            app.notice(f"could not set the history file aside: {exc}")
            return
        app.notice(f"the damaged history was set aside as {moved}")
        app.store_problem = None
        self.open_store()

    def store_failed(self, error: str) -> None:
        """A history write failed: said once, the chat goes on in memory."""
        self.app.last_error = error
        if not self.store_warned:
            self.store_warned = True
            self.app.notice(f"not saved to history: {error} (the chat goes on in memory)")

    # -- opening and starting --------------------------------------------------------

    async def continue_last(self) -> None:
        last = self.app.session.db(lambda st: st.last_conversation())
        if last is None:
            self.app.notice("no earlier conversation to continue" if self.app.session.store
                            else "no history to continue from")
            return
        await self.open(last.id)

    async def open(self, conversation_id: int) -> bool:
        app = self.app
        if app.generating:
            app.error("wait for the reply to finish (or press Esc) before switching")
            return False
        if not app.session.open(conversation_id):
            return False
        await app.reset_chat()
        app.show_system_prompt()
        app.show_constraint()
        await app.query_one(ChatLog).show(app.session.entries)
        app.switcher.follow(app.session.conversation)
        await self.refresh_sidebar()
        return True

    async def new(self) -> None:
        app = self.app
        if app.generating:
            app.error("a reply is being generated (Esc stops it)")
            return
        app.session.new()
        await app.reset_chat()
        app.show_system_prompt()
        app.show_constraint()
        await self.refresh_sidebar()
        app.query_one(PromptInput).focus()  # even from the conversation list: type at once

    # -- the sidebar -----------------------------------------------------------------

    async def refresh_sidebar(self) -> None:
        app = self.app
        sidebar = app.query_one(Sidebar)
        if sidebar.has_class("hidden"):
            return
        conversations = app.session.db(lambda st: st.list_conversations(self.search)) or []
        await sidebar.show(conversations, app.session.conversation.id if app.session.conversation else None)

    async def toggle_sidebar(self) -> None:
        sidebar = self.app.query_one(Sidebar)
        sidebar.toggle_class("hidden")
        if sidebar.has_class("hidden"):
            self.app.query_one(PromptInput).focus()
            return
        await self.refresh_sidebar()
        self.app.query_one("#conversations").focus()

    async def act(self, action: str, conversation_id: int | None) -> None:
        """What a Sidebar.Action asks for."""
        if action == "open":
            if await self.open(conversation_id):
                self.app.query_one(PromptInput).focus()
        elif action == "rename":
            self.ask_rename(conversation_id)
        elif action == "delete":
            self.ask_delete(conversation_id)
        elif action == "new":
            await self.new()

    async def search_for(self, text: str) -> None:
        self.search = text
        await self.refresh_sidebar()

    # -- renaming, deleting, exporting -----------------------------------------------

    def _current_id(self) -> int | None:
        if self.app.session.conversation is None:
            self.app.error("this conversation is not in the history yet")
            return None
        return self.app.session.conversation.id

    def rename_current(self) -> None:
        if (cid := self._current_id()) is not None:
            self.ask_rename(cid)

    def delete_current(self) -> None:
        if (cid := self._current_id()) is not None:
            self.ask_delete(cid)

    def ask_rename(self, conversation_id: int) -> None:
        conv = self.app.session.db(lambda st: st.get_conversation(conversation_id))
        if conv is None:
            return

        async def done(title: str | None) -> None:
            if title:
                await self.rename(title, conversation_id)

        self.app.push_screen(TextInputScreen("New title", conv.title), done)

    async def rename(self, title: str, conversation_id: int | None = None) -> None:
        """Rename a conversation (None: the current one)."""
        conversation = self.app.session.conversation
        cid = conversation_id if conversation_id is not None else (
            conversation.id if conversation else None)
        if cid is None:
            raise UsageError("this conversation is not in the history yet")
        self.app.session.rename(title, cid)
        await self.refresh_sidebar()

    def ask_delete(self, conversation_id: int) -> None:
        app = self.app
        conv = app.session.db(lambda st: st.get_conversation(conversation_id))
        if conv is None:
            return
        if app.generating and app.session.conversation and app.session.conversation.id == conversation_id:
            app.error("a reply is being generated in this conversation (Esc stops it)")
            return
        count = app.session.db(lambda st: st.message_count(conversation_id)) or 0

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            if app.session.delete(conversation_id):
                await app.reset_chat()
                app.show_system_prompt()
                app.show_constraint()
            await self.refresh_sidebar()

        app.push_screen(ConfirmScreen(
            f"Delete “{conv.title}” and its {count} message(s)? This cannot be undone.",
            yes="Delete"), done)

    def export(self, fmt: str = "md", path: str | None = None) -> None:
        app = self.app
        if app.session.conversation is None or app.session.store is None:
            app.error("nothing to export: this conversation is not in the history yet")
            return
        from localchat.paths import data_dir

        cid = app.session.conversation.id
        conv = app.session.db(lambda st: st.get_conversation(cid))
        stored = app.session.db(lambda st: st.messages(cid))
        if conv is None or stored is None:
            return
        target = Path(path).expanduser() if path else default_export_path(
            data_dir() / "exports", conv, fmt)
        engine = app.session.engine
        info = engine.info if engine is not None else None
        name = (f"{info.name} {info.quant_type}" if info and conv.model == app.session.config.model
                and engine.name != "remote" else None)  # "default" says little
        try:
            export_conversation(target, conv, stored, fmt, name)
        except OSError as exc:
            app.error(f"export failed: {exc}")
            return
        app.last_export = target
        app.info(f"exported to {target}")
