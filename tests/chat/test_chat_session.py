"""ChatSession without Textual: the real bundled model, a real SQLite store, greedy and
a few tokens so each reply is quick."""

from __future__ import annotations

import json
import threading

import pytest

from localchat.chat.session import ChatSession
from localchat.engine.base import Delta, Engine, SamplingParams
from localchat.errors import LocalchatError
from helpers.pilot import chat_config
from localchat.storage import ConversationStore, ReplyStatus, StoreError

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture
def store(tmp_path):
    st = ConversationStore.open(tmp_path / "history.db")
    yield st
    st.close()


def session_on(engine, store=None, max_tokens=8, errors=None) -> ChatSession:
    return ChatSession(*chat_config(sampling=GREEDY, max_tokens=max_tokens), store, engine,
                       on_store_error=(errors.append if errors is not None else lambda e: None))


def stored(session):
    return session.store.messages(session.conversation.id)


class Failing(Engine):
    """The real engine, failing after `after` Deltas (0: before any)."""

    def __init__(self, real: Engine, after: int) -> None:
        self.real, self.after, self.name, self.info = real, after, real.name, real.info

    def count_prompt_tokens(self, messages):
        return self.real.count_prompt_tokens(messages)

    def generate(self, request, cancel=None):
        deltas = 0
        for event in self.real.generate(request, cancel):
            if isinstance(event, Delta):
                if deltas == self.after:
                    raise LocalchatError("the engine broke")
                deltas += 1
            yield event


def test_send_stores_the_message_and_a_complete_reply(engine, store):
    session = session_on(engine, store)
    reply = session.send("What is the capital of France?")
    assert reply.entry.status == ReplyStatus.STREAMING
    assert [m.status for m in stored(session)] == ["complete", "streaming"]
    entry = session.run(reply)
    assert entry is session.entries[-1] and entry.content != ""
    assert entry.status == ReplyStatus.COMPLETE and entry.finish_reason in ("stop", "length")
    assert entry.stats.completion_tokens <= 8 and entry.error is None
    msgs = stored(session)
    assert [(m.role, m.status) for m in msgs] == [("user", "complete"), ("assistant", "complete")]
    assert [m.content for m in msgs] == [e.content for e in session.entries]
    assert msgs[1].stats["completion_tokens"] == entry.stats.completion_tokens
    assert session.conversation.title == "What is the capital of France?"
    assert [m.role for m in session.history] == ["user", "assistant"]


def test_a_session_without_a_store_keeps_the_chat_in_memory(engine):
    session = session_on(engine)
    entry = session.run(session.send("Hi"))
    assert session.conversation is None and entry.db_id is None
    assert entry.status == ReplyStatus.COMPLETE and entry.content


def test_regenerate_adds_a_sibling_version_and_switching_brings_the_first_back(engine, store):
    session = session_on(engine, store)
    first = session.run(session.send("Name a colour."))
    second = session.run(session.regenerate(first.key))
    assert second is not first and session.entries[-1] is second
    assert second.siblings == (first.db_id, second.db_id) and second.version == (2, 2)
    assert len(session.entries) == 2 and store.child_count(session.entries[0].db_id) == 2
    assert session.switch_version(second.key, -1)
    assert session.entries[-1].db_id == first.db_id
    assert session.entries[-1].content == first.content and session.entries[-1].runs is None
    assert [m.id for m in stored(session)][-1] == first.db_id


def test_regenerating_a_user_message_redoes_the_reply_to_it(engine, store):
    session = session_on(engine, store)
    old = session.run(session.send("Hi"))
    user = session.entries[0]
    new = session.run(session.regenerate(user.key))
    assert session.entries == [user, new] and new.siblings == (old.db_id, new.db_id)


def test_edit_adds_a_version_of_the_user_message(engine, store):
    session = session_on(engine, store)
    session.run(session.send("Hi"))
    original = session.entries[0]
    reply = session.run(session.edit(original.key, "Hello there"))
    assert [e.content for e in session.entries][0] == "Hello there" and len(session.entries) == 2
    edited = session.entries[0]
    assert edited.siblings == (original.db_id, edited.db_id) and edited.version == (2, 2)
    assert [m.content for m in stored(session)] == ["Hello there", reply.content]
    assert store.message_count(session.conversation.id) == 4  # the old turn stays


def test_cancel_mid_stream_keeps_the_partial_reply_interrupted_and_continue_ends_it(engine, store):
    session = session_on(engine, store, max_tokens=24)
    cancel = threading.Event()

    def stop_at_first_text(event):
        if isinstance(event, Delta) and event.text:
            cancel.set()

    entry = session.run(session.send("Count from one to twenty."), cancel, stop_at_first_text)
    assert entry.finish_reason == "cancelled" and entry.status == ReplyStatus.INTERRUPTED
    partial = entry.content
    assert partial and entry.stats.completion_tokens < 24
    msg = stored(session)[-1]
    assert msg.status == "interrupted" and msg.content == partial
    same = session.run(session.continue_(entry.key))
    assert same is entry and entry.status == ReplyStatus.COMPLETE
    assert entry.content.startswith(partial) and len(entry.content) > len(partial)
    assert stored(session)[-1].content == entry.content and len(stored(session)) == 2


def test_a_reply_left_before_its_end_keeps_its_text_interrupted(engine, store):
    """A caller that stops iterating reply() (run's second Ctrl+C) keeps what was said."""
    session = session_on(engine, store, max_tokens=24)
    reply = session.send("Count from one to twenty.")
    events = session.reply(reply)
    for event in events:
        if isinstance(event, Delta) and event.text.strip():
            break
    events.close()
    msg = stored(session)[-1]
    assert msg.status == "interrupted" and msg.content == reply.entry.content != ""


def test_a_prompt_too_long_for_the_context_drops_the_turn_with_an_error(small_engine, store):
    session = session_on(small_engine, store)
    reply = session.send("word " * 600)
    entry = session.run(reply)
    assert "prompt is" in entry.error and entry.status == ReplyStatus.INTERRUPTED
    assert session.entries == [] and session.conversation is None  # no empty chat is left
    assert store.list_conversations() == []
    assert session.run(session.send("Hi")).status == ReplyStatus.COMPLETE  # it goes on
    assert [m.role for m in stored(session)] == ["user", "assistant"]


def test_an_engine_error_mid_reply_keeps_its_text_interrupted(engine, store):
    session = session_on(Failing(engine, after=2), store, max_tokens=16)
    entry = session.run(session.send("Tell me about cats."))
    assert entry.error == "the engine broke" and entry.status == ReplyStatus.INTERRUPTED
    assert entry.content and session.entries[-1] is entry
    msg = stored(session)[-1]
    assert (msg.status, msg.content) == ("interrupted", entry.content)


def test_a_failed_new_version_brings_the_earlier_reply_back(engine, store):
    session = session_on(engine, store)
    first = session.run(session.send("Hi"))
    session.engine = Failing(engine, after=0)
    reply = session.regenerate()
    session.run(reply)
    assert reply.entry.error == "the engine broke"
    assert [e.db_id for e in session.entries][-1] == first.db_id
    assert session.entries[-1].content == first.content
    assert [m.id for m in stored(session)][-1] == first.db_id
    assert store.child_count(session.entries[0].db_id) == 1  # the failed version is gone


def test_a_failing_store_is_reported_and_the_chat_goes_on(engine, store, monkeypatch):
    errors: list[str] = []
    session = session_on(engine, store, errors=errors)
    session.run(session.send("Hi"))

    def disk_full(*args, **kwargs):
        raise StoreError("history database: disk full")

    for name in ("add_message", "finish_reply", "update_reply"):
        monkeypatch.setattr(store, name, disk_full)
    entry = session.run(session.send("Again"))
    assert entry.status == ReplyStatus.COMPLETE and entry.content and entry.db_id is None
    assert errors and set(errors) == {"history database: disk full"}
    assert len(session.entries) == 4 and len(stored(session)) == 2


def test_fork_copies_the_branch_into_a_new_conversation(engine, store):
    session = session_on(engine, store)
    session.run(session.send("Hi"))
    before = [e.content for e in session.entries]
    fork = session.fork()
    assert fork is not None and fork.title == "Hi (fork)"
    assert session.open(fork.id) and [e.content for e in session.entries] == before
    assert session.conversation.id == fork.id


def test_a_new_chat_starts_from_the_defaults_not_the_last_chats_params(engine, store):
    """After /system and /set in one chat, a new chat (Ctrl+N, or deleting the open one)
    replies with the defaults the app started with, as in every peer."""
    session = session_on(engine, store)
    defaults = session.params
    session.send("Hi")
    session.set_system("You are a pirate. Say arr.")
    session.set_params(session.params.updated({"temperature": 0.2, "max_tokens": 60}))
    pirate = session.params
    assert (pirate.system, pirate.sampling.temperature, pirate.max_tokens) == (
        "You are a pirate. Say arr.", 0.2, 60)
    first = session.conversation.id
    session.new()
    assert session.params == defaults and session.history == []
    request, _ = session.request(session.send("Hello"))
    assert request.sampling == defaults.sampling and request.max_tokens == defaults.max_tokens
    assert all(m.role != "system" for m in request.messages)
    assert session.open(first) and session.params == pirate  # the old chat keeps its own
    session.delete(first)
    assert session.params == defaults


def test_a_stopped_or_cut_reply_keeps_its_reason_when_reopened_and_exported(engine, store):
    from localchat.storage.export import to_json, to_markdown
    from localchat.tui.chat_log import status_line

    session = session_on(engine, store, max_tokens=4)
    cut = session.run(session.send("Count from one to twenty."))  # 4 tokens: the limit
    cancel = threading.Event()
    stopped = session.run(session.send("And back down."), cancel,
                          lambda e: isinstance(e, Delta) and e.text and cancel.set())
    assert (cut.finish_reason, stopped.finish_reason) == ("length", "cancelled")
    live = [status_line(e).split(" · ")[-1] for e in (cut, stopped)]
    assert live == ["stopped: reached the token limit", "stopped"]
    assert session.open(session.conversation.id)  # as after Alt+←/→ or --continue
    reopened = [e for e in session.entries if e.role == "assistant"]
    assert [status_line(e).split(" · ")[-1] for e in reopened] == live
    md = to_markdown(session.conversation, stored(session))
    assert "## Assistant (stopped: reached the token limit)\n" in md
    assert "## Assistant (stopped)\n" in md and "interrupted" not in md
    data = json.loads(to_json(session.conversation, stored(session)))
    assert [m["finish_reason"] for m in data["messages"]] == [None, "length", None, "cancelled"]


def test_continue_goes_back_to_the_conversation_last_opened_not_last_written(engine, store):
    session = session_on(engine, store, max_tokens=2)
    session.run(session.send("Hi"))
    first = session.conversation
    session.run(session.regenerate(session.entries[-1].key))
    session.new()
    session.run(session.send("Hello"))  # the newest conversation, written last
    assert session.open(first.id)  # back to the first, then to its other version
    assert session.switch_version(session.entries[-1].key, -1)
    assert store.last_conversation().id == first.id  # what --continue opens
    assert [m.id for m in stored(session)][-1] == session.entries[-1].db_id
