"""A reasoning model's <think> block: split while streaming and whole, kept out of the
history sent back, and shown collapsed in the chat (F5 expands it, /copy think copies it)."""

from __future__ import annotations

import pytest

from localchat.chat.reasoning import ReasoningSplitter, split_reply, without_reasoning
from localchat.engine.base import SamplingParams
from helpers.pilot import chat_config
from localchat.storage import ConversationStore
from localchat.tui.app import ChatApp
from localchat.tui.widgets import GaugeBar

from helpers.pilot import send, wait_until

REPLY = "<think>\nThe user greets me.\nI greet back.\n</think>\n\nHello!"


def streamed(pieces: list[str]) -> tuple[str, str]:
    splitter, reasoning, answer = ReasoningSplitter(), "", ""
    for piece in pieces:
        r, a = splitter.feed(piece)
        reasoning, answer = reasoning + r, answer + a
    r, a = splitter.flush()
    return (reasoning + r).strip("\n"), (answer + a).lstrip("\n")  # as split_reply trims


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 100])
def test_a_streamed_reply_splits_like_the_whole_one_however_it_is_cut(size):
    pieces = [REPLY[i:i + size] for i in range(0, len(REPLY), size)]
    assert streamed(pieces) == split_reply(REPLY) == ("The user greets me.\nI greet back.",
                                                       "Hello!")


def test_replies_without_a_block_or_cut_while_thinking():
    assert split_reply("Hi <think> there") == ("", "Hi <think> there")
    assert streamed(["<", "b>bold</b>"]) == ("", "<b>bold</b>")
    assert split_reply("<think>still going") == ("still going", "")
    assert streamed(["<think>still go", "ing </th"]) == ("still going </th", "")
    assert streamed(["<think>a</think>", "b"]) == ("a", "b")
    assert without_reasoning(REPLY) == "Hello!" and without_reasoning("Hi") == "Hi"


async def test_a_stored_thinking_reply_is_collapsed_copied_apart_and_not_sent_back(engine):
    store = ConversationStore.open()
    conv = store.create_conversation("Hi", model="default", params={"temperature": 0.0})
    store.add_message(conv.id, "user", "Hello")
    reply = store.begin_reply(conv.id)
    store.finish_reply(reply, REPLY, status="complete")
    store.close()
    app = ChatApp(*chat_config(sampling=SamplingParams(temperature=0.0), max_tokens=4),
                  engine=engine, continue_last=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        view = app.entries[1].view
        head = view.query_one(".thinking-head")
        assert head.display and "▸ Thinking" in str(head.render())
        assert view.markdown.source == "Hello!" and not view.reasoning_open
        assert [m.content for m in app.session.history] == ["Hello", "Hello!"]  # reasoning not sent
        await pilot.press("f5")
        assert view.reasoning_open and "I greet back." in str(view.query_one(".thinking-text").render())
        await send(pilot, "/copy")
        assert app.clipboard == "Hello!"
        await send(pilot, "/copy think")
        assert app.clipboard == "The user greets me.\nI greet back."


async def test_a_reply_that_streams_a_thinking_block_fills_the_section(engine):
    """Continuing a stored reply cut inside <think>: the new tokens stream into the
    thinking section (until a </think>), never into the answer's Markdown."""
    store = ConversationStore.open()
    conv = store.create_conversation("Q", model="default", params={"temperature": 0.0})
    store.add_message(conv.id, "user", "What is 2 + 2?")
    reply = store.begin_reply(conv.id)
    store.finish_reply(reply, "<think>\nTwo plus two", status="interrupted")
    store.close()
    app = ChatApp(*chat_config(sampling=SamplingParams(temperature=0.0), max_tokens=6),
                  engine=engine, continue_last=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_until(pilot, lambda: app.query_one(GaugeBar).state == "ready")
        await pilot.press("ctrl+g")
        entry = app.entries[1]
        await wait_until(pilot, lambda: not app.generating and entry.status != "streaming")
        view = entry.view
        reasoning, answer = split_reply(entry.content)
        assert entry.content.startswith("<think>\nTwo plus two") and len(entry.content) > 20
        assert view.reasoning.strip("\n") == reasoning and view.markdown.source.strip() == answer.strip()
        assert view.reasoning_tokens and view.reasoning_tokens > 2
