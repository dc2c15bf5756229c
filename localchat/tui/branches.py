"""Branches, mixed into ChatApp: selecting an earlier message (Alt+Up/Down), switching
between its versions (Alt+Left/Right), and /fork. Editing or regenerating any message
adds a version in the history (storage/tree.py); nothing is replaced."""

from __future__ import annotations

from textual.actions import SkipAction
from textual.containers import VerticalScroll

from localchat.engine.base import Stats
from localchat.tui.messages import Entry
from localchat.tui.widgets import MessageView


class BranchesMixin:
    """The branch side of ChatApp (uses its entries, store and conversation)."""

    def _selected_entry(self) -> Entry | None:
        return self.entries[self.selected] if self.selected is not None else None

    def _select(self, index: int | None) -> None:
        """Mark entries[index] as the message the controls act on (None: the last)."""
        for entry in self.entries:
            entry.view.remove_class("selected")
        self.selected = index
        if index is not None:
            self.entries[index].view.add_class("selected")
            self.entries[index].view.scroll_visible()

    def action_select_previous(self) -> None:
        """Alt+Up: select the message above (from the input: the last one)."""
        if not self.entries:
            self._error("no message to select yet")
            return
        self._select(len(self.entries) - 1 if self.selected is None else max(self.selected - 1, 0))

    def action_select_next(self) -> None:
        """Alt+Down: select the message below; past the last one, back to the input."""
        if self.selected is None:
            raise SkipAction()
        below = self.selected + 1
        self._select(below if below < len(self.entries) else None)

    async def action_previous_version(self) -> None:
        await self._switch_version(-1)

    async def action_next_version(self) -> None:
        await self._switch_version(+1)

    async def _switch_version(self, step: int) -> None:
        """Show another version of the selected message (or of the lowest message that
        has more than one), with the branch that follows it."""
        if self._generating:
            self._error("a reply is being generated (Esc stops it)")
            return
        if self.editing is not None:
            self._error("finish the edit (Enter) or cancel it (Esc) first")
            return
        index = self.selected if self.selected is not None else next(
            (i for i in range(len(self.entries) - 1, -1, -1)
             if len(self.entries[i].siblings) > 1), None)
        entry = self.entries[index] if index is not None else None
        if entry is None or len(entry.siblings) < 2 or entry.db_id not in entry.siblings:
            self._error("this message has one version: regenerating (Ctrl+R) or editing a "
                        "message adds another (Alt+Up selects an earlier one)")
            return
        at = entry.siblings.index(entry.db_id)
        target = entry.siblings[(at + step) % len(entry.siblings)]
        cid = self.conversation.id
        branch = self._db(lambda st: st.switch_branch(cid, target))
        if branch is None:
            return
        await self._replace_from(index, branch[index:])
        if self.selected is not None:
            self._select(index)

    async def _replace_from(self, index: int, stored: list) -> None:
        """entries[index:] leave the screen; the stored messages take their place."""
        gone = self.entries[index:]
        del self.entries[index:]
        for entry in gone:
            await entry.view.remove()
        await self._mount_stored(stored)

    async def _mount_stored(self, stored: list) -> None:
        """Show stored messages (storage.StoredMessage) below the ones on screen."""
        chat = self.query_one("#chat", VerticalScroll)
        for m in stored:
            if m.role == "system":
                continue
            view = MessageView(m.role, m.content)
            await chat.mount(view)
            stats = Stats(**{k: v for k, v in (m.stats or {}).items()
                             if k in Stats.__dataclass_fields__}) if m.stats else None
            entry = Entry(m.role, m.content, view, m.id, m.status, stats, siblings=m.siblings)
            self.entries.append(entry)
            view.show_version(*m.version)
            if m.role == "assistant":
                self._show_status(entry)

    def _note_versions(self, entry: Entry) -> None:
        """Read and show how many versions a just-written message has."""
        if entry.db_id is None or self.conversation is None:
            return
        cid = self.conversation.id
        entry.siblings = self._db(lambda st: st.versions(cid, entry.db_id)) or ()
        if entry.db_id in entry.siblings:
            entry.view.show_version(entry.siblings.index(entry.db_id) + 1, len(entry.siblings))

    async def action_fork(self) -> None:
        """/fork: a new conversation holding a copy of the branch on screen."""
        if self.conversation is None or self.store is None:
            self._error("nothing to fork: this conversation is not in the history yet")
            return
        if self._generating:
            self._error("a reply is being generated (Esc stops it)")
            return
        cid = self.conversation.id
        fork = self._db(lambda st: st.fork(cid))
        if fork is not None and await self.open_conversation(fork.id):
            self._info(f"forked into “{fork.title}”; the original is unchanged")
