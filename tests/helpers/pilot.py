"""Driving the chat TUI with Textual's Pilot: wait for a condition, type and send, chat a turn."""

from __future__ import annotations

import time

from localchat.chat.params import ReplyParams
from localchat.engine.base import SamplingParams
from localchat.engine.config import EngineConfig
from localchat.tui.app import ChatApp
from localchat.tui.widgets import GaugeBar, PromptInput

GREEDY = SamplingParams(temperature=0.0)


async def wait_until(pilot, predicate, timeout=60.0):
    """Pause the app in small steps until predicate() holds; fail after timeout seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the UI"
        await pilot.pause(0.02)


async def send(pilot, text: str) -> None:
    """Type text into the prompt and press Enter."""
    prompt = pilot.app.query_one(PromptInput)
    prompt.text = text
    prompt.focus()
    await pilot.press("enter")


REPLY_FIELDS = ("sampling", "max_tokens", "system")


def chat_config(**settings) -> tuple[EngineConfig, ReplyParams]:
    """(EngineConfig, ReplyParams) from one set of keywords, as a ChatApp or ChatSession
    takes them: sampling, max_tokens and system go to the params, the rest to the config."""
    params = ReplyParams(**{k: v for k, v in settings.items() if k in REPLY_FIELDS})
    return EngineConfig(**{k: v for k, v in settings.items() if k not in REPLY_FIELDS}), params


def make_app(engine, max_tokens=8, **kwargs) -> ChatApp:
    """A greedy ChatApp on engine, replies capped at max_tokens."""
    return ChatApp(*chat_config(sampling=GREEDY, max_tokens=max_tokens), engine=engine, **kwargs)


async def ready(pilot):
    """Wait until the model has loaded."""
    await wait_until(pilot, lambda: pilot.app.query_one(GaugeBar).state == "ready")


async def chat(pilot, text: str) -> None:
    """Send text and wait until the reply has finished."""
    app = pilot.app
    n = len(app.entries)
    await send(pilot, text)
    await wait_until(pilot, lambda: not app.generating and len(app.entries) >= n + 2
                     and app.entries[-1].status != "streaming")


def stored(app):
    """The open conversation's messages as the store has them."""
    return app.session.store.messages(app.session.conversation.id)
