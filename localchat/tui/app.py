"""The chat app: a Textual UI over one in-process engine.

The model loads and generates in worker threads, so the UI never blocks; the engine's
events come back as Textual messages, and each token updates the reply (appended to a
MarkdownStream, not re-rendered) and the gauge bar while it streams.
"""

from __future__ import annotations

import argparse
import threading
import time
from importlib.resources import files
from pathlib import Path
from typing import Iterator

import platformdirs
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.message import Message as TextualMessage
from textual.widgets import Footer, Markdown, Static

from localchat.chat.context import fit_history
from localchat.engine.base import Delta, Engine, Message, Request, Result
from localchat.errors import LocalchatError
from localchat.settings import ChatSettings
from localchat.tui.widgets import GaugeBar, MessageView, PromptInput

REPLY_RESERVE = 512  # tokens kept free for the reply when fitting history
UI_INTERVAL_S = 0.1  # redraw at most 10 times a second: a redraw per token halved decode speed


def _css_path() -> Path:
    """assets/ at the repository root; a built wheel ships it as localchat.assets."""
    in_checkout = Path(__file__).resolve().parents[2] / "assets" / "app.tcss"
    if in_checkout.is_file():
        return in_checkout
    return Path(str(files("localchat.assets").joinpath("app.tcss")))


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


class ChatApp(App):
    CSS_PATH = _css_path()
    TITLE = "localchat"
    BINDINGS = [
        Binding("escape", "stop", "Stop", priority=True),
        Binding("ctrl+q", "quit", "Quit", priority=True),
        Binding("ctrl+c", "quit", "Quit", show=False, priority=True),
    ]

    def __init__(self, settings: ChatSettings, engine: Engine | None = None) -> None:
        super().__init__()
        self.settings = settings
        self.engine = engine
        self.history: list[Message] = list(settings.system_messages())
        self._cancel = threading.Event()
        self._generating = False
        self._streams: dict[int, object] = {}
        self._owns_engine = engine is None

    def compose(self) -> ComposeResult:
        yield Static(f"localchat · {self.settings.model}", id="title")
        yield VerticalScroll(id="chat")
        yield GaugeBar(id="gauges")
        yield PromptInput(id="prompt", show_line_numbers=False)
        yield Footer()

    def on_mount(self) -> None:
        self.query_one("#chat").anchor()
        self.query_one(PromptInput).focus()
        if self.engine is None:
            self._load_engine()
        else:
            self.post_message(EngineLoaded(self.engine))

    # -- loading --------------------------------------------------------------------

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

    # -- chatting -------------------------------------------------------------------

    @on(PromptInput.Submitted)
    async def _submit(self, message: PromptInput.Submitted) -> None:
        if self.engine is None or self._generating:
            self.bell()
            return
        text = message.text.rstrip("\n")
        chat = self.query_one("#chat", VerticalScroll)
        await chat.mount(MessageView("user", text))
        reply = MessageView("assistant")
        await chat.mount(reply)
        self.history.append(Message("user", text))
        self._streams[id(reply)] = Markdown.get_stream(reply.markdown)
        self._cancel = threading.Event()
        self._generating = True
        self.query_one(GaugeBar).state = "generating"
        self._generate(list(self.history), reply)

    @work(thread=True, exclusive=True, group="generate")
    def _generate(self, history: list[Message], view: MessageView) -> None:
        engine = self.engine
        assert engine is not None
        try:
            n_ctx = engine.info.n_ctx
            reserve = min(self.settings.max_tokens or REPLY_RESERVE, n_ctx // 4)
            fit = fit_history(history, engine.count_prompt_tokens, n_ctx - reserve)
            if fit.dropped_turns:
                self.call_from_thread(
                    self._notice,
                    f"{fit.dropped_turns} earlier turn(s) dropped to fit the "
                    f"{n_ctx}-token context (system prompt kept).",
                    before=view,
                )
            request = Request(messages=fit.messages, sampling=self.settings.sampling,
                              max_tokens=self.settings.max_tokens)
            self._stream_events(engine.generate(request, self._cancel), view)
        except LocalchatError as exc:
            self.post_message(GenerationFailed(str(exc), view))

    def _stream_events(self, events: Iterator[Delta | Result], view: MessageView) -> None:
        """Forward engine events to the UI, merging the deltas of each UI interval."""
        pending: list[Delta] = []
        last_post = 0.0
        for event in events:
            if isinstance(event, Delta):
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
                self.post_message(EngineEvent(event, view))

    @on(EngineEvent)
    async def _engine_event(self, message: EngineEvent) -> None:
        event, view = message.event, message.view
        self.query_one(GaugeBar).stats = event.stats
        stream = self._streams.get(id(view))
        if isinstance(event, Delta):
            if event.text and stream is not None:
                await stream.write(event.text)
            return
        await self._finish(view)
        self.history.append(Message("assistant", event.text))
        labels = {"stop": "", "length": "stopped: reached the token limit",
                  "cancelled": "stopped"}
        label = labels[event.finish_reason]
        s = event.stats
        view.status.update(
            f"{s.completion_tokens} tokens · {s.decode_tok_s:.1f} tok/s · TTFT "
            f"{s.ttft_s * 1000:.0f} ms" + (f" · {label}" if label else ""))

    @on(GenerationFailed)
    async def _generation_failed(self, message: GenerationFailed) -> None:
        await self._finish(message.view)
        self.history.pop()  # the user's message did not get a reply; keep it visible only
        message.view.status.update(f"error: {message.error}")

    async def _finish(self, view: MessageView) -> None:
        stream = self._streams.pop(id(view), None)
        if stream is not None:
            await stream.stop()
        self._generating = False
        self.query_one(GaugeBar).state = "ready"

    def _notice(self, text: str, before: MessageView | None = None) -> None:
        self.query_one("#chat").mount(Static(f"⚠ {text}", classes="notice"), before=before)

    # -- actions --------------------------------------------------------------------

    def action_stop(self) -> None:
        """Esc: stop the reply being generated (what was said so far is kept)."""
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
        if self._owns_engine and self.engine is not None:
            self.workers.cancel_all()
            self.engine.close()


def run_tui(args: argparse.Namespace) -> int:
    ChatApp(ChatSettings.from_args(args)).run()
    return 0
