"""The chat UI's widgets: the prompt box, the live gauge bar and message views."""

from __future__ import annotations

from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TextualMessage
from textual.reactive import reactive
from textual.widgets import Markdown, Static, TextArea

from localchat.engine.base import Stats
from localchat.units import human_bytes

NEWLINE_KEYS = ("ctrl+j", "shift+enter", "alt+enter")


class PromptInput(TextArea):
    """Multi-line input: Enter sends, Ctrl+J (or Shift+Enter / Alt+Enter where the
    terminal can tell them apart from Enter) inserts a newline."""

    # Shown in the footer. The keys are handled in _on_key, in order with the typed
    # characters: a priority binding would see Enter before text still queued.
    BINDINGS = [
        Binding("enter", "submit", "Send"),
        Binding(",".join(NEWLINE_KEYS), "newline", "Newline", key_display="^j"),
    ]

    class Submitted(TextualMessage):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    class EditLast(TextualMessage):
        """Up in an empty input: edit the last message sent."""

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "up" and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.EditLast())
            return
        if event.key == "enter" or event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.action_submit() if event.key == "enter" else self.action_newline()
            return
        await super()._on_key(event)

    def action_submit(self) -> None:
        if self.text.strip():
            self.post_message(self.Submitted(self.text))
            self.clear()

    def action_newline(self) -> None:
        self.insert("\n")


def kv_bar(used: int, capacity: int, cached: int = 0, width: int = 8) -> str:
    """█ in use, ▒ kept as reusable prefix blocks, ░ free."""
    filled = round(width * used / capacity) if capacity else 0
    filled = min(width, max(1 if used else 0, filled))
    kept = min(width - filled, round(width * cached / capacity) if capacity else 0)
    return "█" * filled + "▒" * kept + "░" * (width - filled - kept)


def format_gauges(stats: Stats | None, state: str) -> str:
    """One line: TTFT, live tok/s, KV cache bar and bytes, context used N of M."""
    if stats is None:
        return state
    ttft = f"{stats.ttft_s * 1000:.0f} ms" if stats.ttft_s > 0 else "–"
    rate = f"{stats.decode_tok_s:.1f} tok/s" if stats.decode_tok_s > 0 else "– tok/s"
    capacity = human_bytes(stats.kv_cache_capacity_bytes)  # e.g. "90.0 MiB"
    unit = capacity.split()[-1]
    used = stats.kv_cache_bytes / 1024 ** ("B", "KiB", "MiB", "GiB").index(unit)
    bar = kv_bar(stats.kv_cache_bytes, stats.kv_cache_capacity_bytes, stats.kv_cache_cached_bytes)
    kv = f"KV {bar} {used:.1f}/{capacity}"
    ctx = f"ctx {stats.context_tokens}/{stats.context_capacity}"
    return f"{state} │ TTFT {ttft} │ {rate} │ {kv} │ {ctx}"


class GaugeBar(Static):
    """Live speed and memory figures, updated with every streamed token."""

    stats: reactive[Stats | None] = reactive(None)
    state: reactive[str] = reactive("loading model…")

    def render(self) -> str:
        return format_gauges(self.stats, self.state)


class MessageView(Vertical):
    """One chat message: a role label and its Markdown body (streamed by appending).
    A click on it asks the app to copy it."""

    class Clicked(TextualMessage):
        def __init__(self, view: "MessageView") -> None:
            super().__init__()
            self.view = view

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.post_message(self.Clicked(self))

    def __init__(self, role: str, text: str = "", **kwargs) -> None:
        super().__init__(classes=f"message {role}", **kwargs)
        self.role = role
        self.initial_text = text
        self.status = Static("", classes="reply-status")

    def compose(self):
        yield Static("You" if self.role == "user" else "Assistant", classes="role")
        yield Markdown(self.initial_text)
        if self.role == "assistant":
            yield self.status

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)
