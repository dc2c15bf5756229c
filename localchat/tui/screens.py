"""Modal screens: confirm, ask for a line of text, and show a block of information
(help, stats). Each closes with Esc and gives its answer to the caller's callback."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Markdown, Static


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question; y confirms, Esc or n cancels, and Enter presses the focused
    button, which starts on the safe one (the questions delete or set files aside)."""

    BINDINGS = [
        Binding("escape,n", "answer(False)", "Cancel"),
        Binding("y", "answer(True)", "Yes"),
    ]

    def __init__(self, question: str, yes: str = "Yes", no: str = "Cancel") -> None:
        super().__init__(classes="modal")
        self.question, self.yes, self.no = question, yes, no

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="question")
            yield Static(f"y: {self.yes.lower()} · n or Esc: {self.no.lower()} · Enter: the "
                         "highlighted button", classes="hint")
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes")
                yield Button(self.no, id="no")

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, value: bool) -> None:
        self.dismiss(value)


class TextInputScreen(ModalScreen["str | None"]):
    """One line of text (a conversation's new title); Enter keeps it, Esc cancels."""

    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__(classes="modal")
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Static(self.question, classes="question")
            yield Input(self.value, id="answer")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        text = event.value.strip()
        self.dismiss(text or None)

    def action_cancel(self) -> None:
        self.dismiss(None)


class InfoScreen(ModalScreen[None]):
    """A titled block of Markdown (help, a reply's stats); Esc, q or F1 closes it."""

    BINDINGS = [Binding("escape,q,f1", "close", "Close")]

    def __init__(self, title: str, body: str) -> None:
        super().__init__(classes="modal")
        self.title_text, self.body = title, body

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog info"):
            yield Static(self.title_text, classes="question")
            with VerticalScroll():
                yield Markdown(self.body)
            yield Static("Esc closes", classes="hint")

    def action_close(self) -> None:
        self.dismiss(None)
