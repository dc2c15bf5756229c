"""Conversations, mixed into ChatApp: opening the history store (offering to set a damaged
file aside), the sidebar's list, and opening, renaming, deleting and exporting them. Store
calls go through ChatSession.db: a failing database is reported once, the chat goes on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from localchat.errors import UsageError
from localchat.settings import ChatSettings
from localchat.storage import ConversationStore, StoreUnavailable, set_aside
from localchat.storage.export import default_export_path, export_conversation
from localchat.tui.screens import ConfirmScreen, TextInputScreen
from localchat.tui.chat_log import ChatLog
from localchat.tui.sidebar import Sidebar
from localchat.tui.widgets import GaugeBar, PromptInput, RateSparkline


class ConversationsMixin:
    """The history side of ChatApp (uses its session and chat log)."""

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

    def _store_failed(self, error: str) -> None:
        self.last_error = error
        if not self._store_warned:
            self._store_warned = True
            self._notice(f"not saved to history: {error} (the chat goes on in memory)")

    async def _continue_last_conversation(self) -> None:
        last = self.session.db(lambda st: st.last_conversation())
        if last is None:
            self._notice("no earlier conversation to continue" if self.store
                         else "no history to continue from")
            return
        await self.open_conversation(last.id)

    async def open_conversation(self, conversation_id: int) -> bool:
        if self._generating:
            self._error("wait for the reply to finish (or press Esc) before switching")
            return False
        if not self.session.open(conversation_id):
            return False
        await self._reset_chat()
        self.show_system_prompt()
        await self.query_one(ChatLog).show(self.session.entries)
        self._use_conversation_model(self.conversation)
        await self._refresh_sidebar()
        return True

    def _use_conversation_model(self, conv) -> None:
        """A reopened conversation goes on with the model, context size and draft it used:
        before the first load (--continue) they are what loads; later they load live;
        while a model is loading it only says so."""
        wanted = conversation_engine_settings(self.settings, conv)
        if wanted == self.settings:
            return
        if self.engine is None and not self._engine_requested:
            self.settings = wanted
            return
        if self.engine is None or self._reloading is not None or self._generating:
            self._notice(f"this conversation used {engine_label(wanted)}; it continues with "
                         f"{engine_label(self.settings)} (F7 or /model {wanted.model} switches)")
            return
        self.switch_engine(wanted, f"{engine_label(wanted)} (this conversation's)")

    async def _reset_chat(self) -> None:
        """An empty chat pane; the gauges drop the last reply's figures (not this chat's)."""
        self.attachments = []
        self.editing = self.selected = None
        self._set_editing_title()
        await self.query_one(ChatLog).clear()
        self.query_one(GaugeBar).stats = None
        self.query_one(RateSparkline).reset()

    async def _refresh_sidebar(self) -> None:
        sidebar = self.query_one(Sidebar)
        if sidebar.has_class("hidden"):
            return
        conversations = self.session.db(lambda st: st.list_conversations(self._search)) or []
        await sidebar.show(conversations, self.conversation.id if self.conversation else None)

    async def action_new_conversation(self) -> None:
        if self._generating:
            self._error("a reply is being generated (Esc stops it)")
            return
        self.session.new()
        await self._reset_chat()
        await self._refresh_sidebar()
        self.query_one(PromptInput).focus()  # even from the conversation list: type at once

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

    async def on_sidebar_action(self, message: Sidebar.Action) -> None:
        if message.action == "open":
            if await self.open_conversation(message.conversation_id):
                self.query_one(PromptInput).focus()
        elif message.action == "rename":
            self._ask_rename(message.conversation_id)
        elif message.action == "delete":
            self._ask_delete(message.conversation_id)
        elif message.action == "new":
            await self.action_new_conversation()

    async def on_sidebar_search_changed(self, message: Sidebar.SearchChanged) -> None:
        self._search = message.text
        await self._refresh_sidebar()

    def _ask_rename(self, conversation_id: int) -> None:
        conv = self.session.db(lambda st: st.get_conversation(conversation_id))
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
        self.session.rename(title, cid)
        await self._refresh_sidebar()

    def _ask_delete(self, conversation_id: int) -> None:
        conv = self.session.db(lambda st: st.get_conversation(conversation_id))
        if conv is None:
            return
        if self._generating and self.conversation and self.conversation.id == conversation_id:
            self._error("a reply is being generated in this conversation (Esc stops it)")
            return
        count = self.session.db(lambda st: st.message_count(conversation_id)) or 0

        async def done(yes: bool | None) -> None:
            if not yes:
                return
            if self.session.delete(conversation_id):
                await self._reset_chat()
            await self._refresh_sidebar()

        self.push_screen(ConfirmScreen(
            f"Delete “{conv.title}” and its {count} message(s)? This cannot be undone.",
            yes="Delete"), done)

    def action_export(self, fmt: str = "md", path: str | None = None) -> None:
        if self.conversation is None or self.store is None:
            self._error("nothing to export: this conversation is not in the history yet")
            return
        from localchat.paths import data_dir

        cid = self.conversation.id
        conv = self.session.db(lambda st: st.get_conversation(cid))
        stored = self.session.db(lambda st: st.messages(cid))
        if conv is None or stored is None:
            return
        target = Path(path).expanduser() if path else default_export_path(
            data_dir() / "exports", conv, fmt)
        info = self.engine.info if self.engine is not None else None
        name = (f"{info.name} {info.quant_type}" if info and conv.model == self.settings.model
                and self.engine.name != "remote" else None)  # "default" says little
        try:
            export_conversation(target, conv, stored, fmt, name)
        except OSError as exc:
            self._error(f"export failed: {exc}")
            return
        self.last_export = target
        self._info(f"exported to {target}")


def conversation_engine_settings(settings: ChatSettings, conv) -> ChatSettings:
    """`settings` with the model, context size and draft a stored conversation ran with
    (values a damaged record holds are ignored)."""
    params = conv.params
    ctx_size = params.get("ctx_size", settings.ctx_size)
    if not isinstance(ctx_size, int) or ctx_size < 16:
        ctx_size = settings.ctx_size
    draft, n_draft = params.get("draft"), params.get("num_draft_tokens")
    if not isinstance(draft, str) or not draft:  # ran without one: the flags' draft stays
        draft, n_draft = settings.draft, settings.num_draft_tokens
    if not isinstance(n_draft, int) or not 1 <= n_draft <= 32:
        n_draft = None
    return replace(settings, model=conv.model or settings.model, ctx_size=ctx_size,
                   draft=draft, num_draft_tokens=n_draft)


def engine_label(settings: ChatSettings) -> str:
    """model, ctx and draft, as the notices name them."""
    ctx = f", ctx {settings.ctx_size}" if settings.ctx_size else ""
    draft = f", draft {settings.draft}" if settings.draft else ""
    return f"model {settings.model}{ctx}{draft}"
