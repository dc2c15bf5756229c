"""The conversation list: search box, conversations newest first, and keys to open, rename,
delete and start one. It shows what it is given and posts Sidebar.Action and
Sidebar.SearchChanged; the app's `conversations` acts on them."""

from __future__ import annotations

from dataclasses import dataclass

from rich.cells import cell_len, set_cell_size
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TextualMessage
from textual.widgets import Input, Label, ListItem, ListView, Static

from localchat.storage import Conversation

TITLE_COLUMNS = 24  # the sidebar's 28 columns less its border, padding and the "● " mark
MARKS = (" (fork)",)  # kept visible when a title is cut: they tell copies apart


def fitted_title(title: str, columns: int = TITLE_COLUMNS) -> str:
    """The title in at most `columns` cells, cut with … before a trailing (fork) mark, so a
    fork and its original never read the same."""
    if cell_len(title) <= columns:
        return title
    mark = next((m for m in MARKS if title.endswith(m)), "")
    base = title[:len(title) - len(mark)].rstrip()
    room = columns - cell_len(mark) - 1
    return set_cell_size(base, room).rstrip() + "…" + mark



class SearchBox(Input):
    """The sidebar's search box; Down moves into the list below it."""

    BINDINGS = [Binding("down", "into_list", "To the list", show=False)]

    def action_into_list(self) -> None:
        self.parent.query_one(ListView).focus()

class ConversationItem(ListItem):
    def __init__(self, conversation: Conversation, current: bool) -> None:
        super().__init__(Label(("● " if current else "  ") + fitted_title(conversation.title)),
                         classes="current" if current else "")
        self.conversation = conversation


class ConversationList(ListView):
    """The list itself; its letter keys act on the highlighted conversation (they are
    here, not on the sidebar, so typing in the search box never triggers them)."""

    BINDINGS = [
        Binding("r,f2", "sidebar('rename')", "Rename", show=False),
        Binding("delete,d", "sidebar('delete')", "Delete", show=False),
        Binding("n", "sidebar('new')", "New", show=False),
        Binding("slash", "sidebar('search')", "Search", show=False),
    ]

    def action_sidebar(self, action: str) -> None:
        sidebar = next(a for a in self.ancestors if isinstance(a, Sidebar))
        getattr(sidebar, f"action_{action}")()


class Sidebar(Vertical):

    @dataclass
    class Action(TextualMessage):
        """The user asked for `action` ("open", "rename", "delete", "new") on a
        conversation id (None for "new")."""

        action: str
        conversation_id: int | None

    @dataclass
    class SearchChanged(TextualMessage):
        """The search box's text changed: list the conversations that match it."""

        text: str

    def compose(self) -> ComposeResult:
        yield SearchBox(placeholder="search chats", id="search")
        yield ConversationList(id="conversations")
        yield Static("enter open · r rename · d delete · n new", classes="hint")

    async def show(self, conversations: list[Conversation], current_id: int | None) -> None:
        lv = self.query_one(ListView)
        highlighted = self.highlighted_id()
        await lv.clear()
        items = [ConversationItem(c, c.id == current_id) for c in conversations]
        await lv.extend(items)
        ids = [c.id for c in conversations]
        keep = highlighted if highlighted in ids else current_id
        if keep in ids:
            lv.index = ids.index(keep)
        elif ids:
            lv.index = 0

    def highlighted_id(self) -> int | None:
        item = self.query_one(ListView).highlighted_child
        return item.conversation.id if isinstance(item, ConversationItem) else None

    def on_list_view_selected(self, event: ListView.Selected) -> None:
        event.stop()
        if isinstance(event.item, ConversationItem):
            self.post_message(self.Action("open", event.item.conversation.id))

    def on_input_changed(self, event: Input.Changed) -> None:
        event.stop()
        self.post_message(self.SearchChanged(event.value))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.query_one(ListView).focus()

    def _act(self, action: str) -> None:
        conversation_id = self.highlighted_id()
        if conversation_id is not None:
            self.post_message(self.Action(action, conversation_id))

    def action_rename(self) -> None:
        self._act("rename")

    def action_delete(self) -> None:
        self._act("delete")

    def action_new(self) -> None:
        self.post_message(self.Action("new", None))

    def action_search(self) -> None:
        self.query_one("#search", Input).focus()
