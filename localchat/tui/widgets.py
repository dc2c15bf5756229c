"""The chat pane's widgets: the prompt box (PromptInput), the gauge bar and rate sparkline,
and one message's view (MessageView, DraftRuns); the messages they send are declared on them."""

from __future__ import annotations

from dataclasses import dataclass

from markdown_it import MarkdownIt
from rich.cells import cell_len
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message as TextualMessage
from textual.reactive import reactive
from textual.widget import Widget
from textual.widgets import Collapsible, Markdown, Sparkline, Static, TextArea

from localchat.chat.call_record import CallRecord
from localchat.chat.reasoning import ReasoningSplitter, split_reply
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

    @dataclass
    class Submitted(TextualMessage):
        """Enter with text in the box: send it (a message or a slash command)."""

        text: str

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


def draft_gauge(draft: dict) -> str:
    """`ngram 87% γ4`: the draft's source (ngram, model or ngram+model), the share of drafted
    tokens the target kept so far, and γ now (γ0: speculation paused, it did not pay)."""
    source = draft.get("source", "draft").split(":")[0]
    rate = f"{draft.get('acceptance_rate', 0.0):.0%}" if draft.get("proposed") else "–"
    gamma = draft.get("gamma")
    return f"{source} {rate}" + (f" γ{gamma}" if gamma is not None else "")


CONTEXT_WARNING = 0.9  # share of the context window in use that the gauge warns at


def kv_usage(used: int, capacity: int) -> str:
    """`2.1/90.0 MiB`, or each figure in its own unit where the used part would read 0.0
    in the capacity's (`7.6 MiB/2.3 GiB`)."""
    total = human_bytes(capacity)
    unit = total.split()[-1]
    if unit != "B":
        share = used / 1024 ** ("B", "KiB", "MiB", "GiB").index(unit)
        if share >= 0.05 or not used:
            return f"{share:.1f}/{total}"
    return f"{human_bytes(used)}/{total}"


def format_gauges(stats: Stats | None, state: str, width: int | None = None) -> str:
    """One line: TTFT, prefill and decode rates, KV cache bar and bytes, context used N of M (⚠ from
    90 % on), the draft's acceptance when speculating, and the cache (RAM + disk snapshots).
    Given a width, the least useful figures go first until the line fits (the cache, the rates'
    words, half the KV bar, the KV bytes, TTFT, the KV bar with the prefill rate, then the
    context)."""
    if stats is None:
        return state
    ttft = f"TTFT {stats.ttft_s * 1000:.0f} ms" if stats.ttft_s > 0 else "TTFT –"
    rate = f"{stats.decode_tok_s:.1f} tok/s" if stats.decode_tok_s > 0 else "– tok/s"
    # prefill (prompt tokens evaluated per second) beside decode, once there is one
    prefill = f"{stats.prefill_tok_s:.0f}" if stats.prefill_tok_s > 0 else None
    rates = f"prefill {prefill} · decode {rate}" if prefill else rate
    rates_short = f"pp {prefill} · {rate}" if prefill else rate
    kv_bytes = kv_usage(stats.kv_cache_bytes, stats.kv_cache_capacity_bytes)

    def kv(bar_width: int) -> str:
        if not stats.kv_cache_capacity_bytes:  # a remote engine: its server keeps the cache
            return "KV n/a"
        return "KV " + kv_bar(stats.kv_cache_bytes, stats.kv_cache_capacity_bytes,
                              stats.kv_cache_cached_bytes, bar_width)

    ctx = f"ctx {stats.context_tokens}/{stats.context_capacity}"
    if stats.context_capacity and stats.context_tokens >= CONTEXT_WARNING * stats.context_capacity:
        ctx += " ⚠"  # nearly full: older turns will be dropped (or the reply cut) soon
    draft = draft_gauge(stats.draft) if stats.draft else None
    # cached prefixes: in memory, and KV snapshots on disk (shown once there are some)
    cache = (f"cache {human_bytes(stats.kv_cache_cached_bytes)} + "
             f"{human_bytes(stats.kv_disk_bytes)} disk") if stats.kv_disk_bytes else None
    def kv_with_bytes(bar_width: int) -> str:
        return f"{kv(bar_width)} {kv_bytes}" if stats.kv_cache_capacity_bytes else kv(bar_width)

    variants = [
        [state, ttft, rates, kv_with_bytes(8), ctx, draft, cache],
        [state, ttft, rates, kv_with_bytes(8), ctx, draft],
        [state, ttft, rates_short, kv_with_bytes(8), ctx, draft],
        [state, ttft, rates_short, kv_with_bytes(4), ctx, draft],
        [state, ttft, rates_short, kv(8), ctx, draft],
        [state, ttft, rates_short, kv(4), ctx, draft],
        [state, rates_short, kv(4), ctx, draft],
        [state, rate, kv(4), ctx, draft],
        [state, rate, ctx, draft],
        [state, rate, draft],
    ]
    for parts in variants:
        line = " │ ".join(p for p in parts if p)
        if width is None or cell_len(line) <= width:
            break
    return line


class GaugeBar(Static):
    """Live speed and memory figures, updated with every streamed token."""

    stats: reactive[Stats | None] = reactive(None)
    state: reactive[str] = reactive("loading model…")
    constrained: reactive[bool] = reactive(False)  # replies follow a JSON schema or grammar

    def render(self) -> str:
        state = f"{self.state} · json" if self.constrained else self.state
        return format_gauges(self.stats, state, self.content_size.width or None)


def live_rate(last: tuple[int, float] | None, stats: Stats) -> tuple[float | None, tuple[int, float]]:
    """Decode tokens/s since the last update, from the engine's own token count and
    clock (Stats.completion_tokens, Stats.elapsed_s), not the UI's: (rate or None, the
    new mark). The first token's interval holds the prefill, so rates start after it."""
    mark = (stats.completion_tokens, stats.elapsed_s)
    if last is None or last[0] < 1:
        return None, mark
    tokens, seconds = stats.completion_tokens - last[0], stats.elapsed_s - last[1]
    if tokens <= 0 or seconds <= 0:
        return None, last
    return tokens / seconds, mark


class RateSparkline(Sparkline):
    """Live decode tokens/s of the reply being generated, one bar per UI update (the
    latest at the right); hidden until there are two figures to compare."""

    SAMPLES = 48

    def __init__(self, **kwargs) -> None:
        super().__init__([], **kwargs)
        self.samples: list[float] = []
        self._mark: tuple[int, float] | None = None

    def reset(self) -> None:
        self.samples, self._mark = [], None
        self.data = []
        self.display = False

    def add(self, stats: Stats) -> None:
        rate, self._mark = live_rate(self._mark, stats)
        if rate is None:
            return
        self.samples = (self.samples + [rate])[-self.SAMPLES:]
        self.data = list(self.samples)
        self.display = len(self.samples) >= 2


class DraftRuns(Widget):
    """A finished reply as plain text, with the runs a speculative draft proposed (and
    the target kept) in the draft colour: where the draft paid off. The colour comes
    from the stylesheet, so it follows the theme."""

    COMPONENT_CLASSES = {"draft-runs--draft"}

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.runs: list[tuple[str, bool]] = []

    def show(self, runs: list[tuple[str, bool]]) -> None:
        self.runs = list(runs)
        self.refresh(layout=True)

    def render(self) -> Text:
        drafted = self.get_component_rich_style("draft-runs--draft")
        text = Text()
        for chunk, from_draft in self.runs:
            text.append(chunk, drafted if from_draft else None)
        text.rstrip()  # as the Markdown shows it: no blank lines after the last one
        return text


def chat_markdown_parser() -> MarkdownIt:
    """GitHub-like Markdown where a single newline is a line break, as chat apps show
    replies: a model's unfenced code or list of lines keeps its lines."""
    parser = MarkdownIt("gfm-like")
    parser.core.ruler.push("newlines_are_line_breaks", _soft_breaks_to_hard)
    return parser


def _soft_breaks_to_hard(state) -> None:
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


class MessageView(Vertical):
    """One chat message: a role label and its Markdown body (streamed by appending), or
    for a reply, its draft-coloured text instead; a reply's <think> block goes to a
    collapsed, dimmed section above it. A click on it asks the app to copy it."""

    @dataclass
    class Clicked(TextualMessage):
        """A click on the message: copy it."""

        view: MessageView

    def on_click(self, event: events.Click) -> None:
        event.stop()
        self.post_message(self.Clicked(self))

    def __init__(self, role: str, text: str = "", key: int | None = None, **kwargs) -> None:
        super().__init__(classes=f"message {role}", **kwargs)
        self.role, self.key = role, key  # key: the session entry it shows
        self.reasoning, self.initial_text = split_reply(text) if role == "assistant" \
            else ("", text)
        self.reasoning_tokens: int | None = None
        self.status = Static("", classes="reply-status")
        self._splitter = ReasoningSplitter()

    def compose(self):
        yield Static(self._role_name, classes="role")
        if self.role == "assistant":
            yield Static("", classes="thinking-head hidden")
            yield Static("", classes="thinking-text hidden")
        yield Markdown(self.initial_text, parser_factory=chat_markdown_parser)
        if self.role == "assistant":
            yield DraftRuns(classes="draft-runs hidden")
            yield self.status

    def on_mount(self) -> None:
        if self.reasoning:
            self._show_reasoning()

    @property
    def _role_name(self) -> str:
        return "You" if self.role == "user" else "Assistant"

    def show_version(self, position: int, count: int) -> None:
        """'2/3' beside the role when the message has other versions (branches)."""
        label = self._role_name + (f"  ‹ {position}/{count} ›  Alt+←/→" if count > 1 else "")
        self.query_one(".role", Static).update(label)

    @property
    def markdown(self) -> Markdown:
        return self.query_one(Markdown)

    async def add_call(self, call: CallRecord) -> None:
        """A tool call the reply made, above its answer: one line, the result collapsed."""
        shown = call.result if len(call.result) <= 4000 else call.result[:4000] + " …"
        title = f"tool {call.name}({call.arguments}) → {call.outcome}"
        await self.mount(Collapsible(Static(shown, markup=False), title=title, collapsed=True,
                                     classes="tool-call"), before=self.markdown)

    def begin_stream(self, existing: str = "") -> None:
        """A reply starts streaming (or continues after `existing`)."""
        self._splitter = ReasoningSplitter()
        self._splitter.feed(existing)

    def stream_piece(self, text: str, *, final: bool = False) -> str:
        """Take streamed text: reasoning goes to its section; returns the answer's part."""
        reasoning, answer = self._splitter.feed(text)
        if final:
            more_reasoning, more_answer = self._splitter.flush()
            reasoning, answer = reasoning + more_reasoning, answer + more_answer
        if reasoning:
            self.reasoning += reasoning
            self._show_reasoning()
        return answer

    def set_reasoning_tokens(self, tokens: int) -> None:
        self.reasoning_tokens = tokens
        self._show_reasoning()

    @property
    def reasoning_open(self) -> bool:
        return self.role == "assistant" and \
            not self.query_one(".thinking-text").has_class("hidden")

    def toggle_reasoning(self) -> None:
        """Expand or collapse the reasoning section (nothing without one)."""
        if self.reasoning:
            self.query_one(".thinking-text").toggle_class("hidden")
            self._show_reasoning()

    def _show_reasoning(self) -> None:
        head = self.query_one(".thinking-head", Static)
        body = self.query_one(".thinking-text", Static)
        size = f" · {self.reasoning_tokens} tokens" if self.reasoning_tokens else "…"
        shown = self.reasoning_open
        head.update(Text(f"{'▾' if shown else '▸'} Thinking{size} "
                         f"(F5 {'hides' if shown else 'shows'})"))
        head.remove_class("hidden")
        body.update(Text(self.reasoning.strip("\n")))

    @property
    def coloured(self) -> bool:
        """Showing the draft-coloured text rather than the Markdown."""
        return self.role == "assistant" and not self.query_one(DraftRuns).has_class("hidden")

    def show_runs(self, runs: list[tuple[str, bool]] | None) -> None:
        """The reply as (text, from_draft) runs in colour; None: back to the Markdown."""
        if self.role != "assistant":
            return
        view = self.query_one(DraftRuns)
        if runs is not None:
            view.show(runs)
        view.set_class(runs is None, "hidden")
        self.markdown.set_class(runs is not None, "hidden")
