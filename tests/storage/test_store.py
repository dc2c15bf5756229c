"""The conversation store on real SQLite files: settings, migrations, threads, damage."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading

import pytest

from localchat.storage import ConversationStore, ReplyWriter, StoreUnavailable, set_aside, title_from
from localchat.storage.db import MIGRATIONS, SCHEMA_VERSION, connect, migrate


@pytest.fixture
def store(tmp_path):
    s = ConversationStore.open(tmp_path / "history.db")
    yield s
    s.close()


def test_connection_settings(store):
    db = sqlite3.connect(store.path)
    assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    own = store._db
    assert own.execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert own.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert own.execute("PRAGMA foreign_keys").fetchone()[0] == 1
    assert store.integrity_check() == "ok"
    assert db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION


def test_default_path_is_in_localchat_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))
    s = ConversationStore.open()
    try:
        assert s.path == tmp_path / "home" / "history.db" and s.path.is_file()
    finally:
        s.close()


def test_conversations_and_messages_round_trip(store):
    params = {"temperature": 0.2, "top_k": 40, "max_tokens": 64, "seed": None}
    c = store.create_conversation("Paris", model="default", system_prompt="Be brief.",
                                  params=params)
    store.add_message(c.id, "user", "Capital of France?")
    reply = store.begin_reply(c.id, model="default", params=params)
    store.finish_reply(reply, "Paris.", status="complete", stats={"completion_tokens": 3})
    got = store.get_conversation(c.id)
    assert (got.title, got.model, got.system_prompt, got.params) == \
        ("Paris", "default", "Be brief.", params)
    msgs = store.messages(c.id)
    assert [(m.role, m.content, m.status) for m in msgs] == [
        ("user", "Capital of France?", "complete"), ("assistant", "Paris.", "complete")]
    assert msgs[1].stats == {"completion_tokens": 3} and msgs[1].params == params
    store.update_settings(c.id, system_prompt=None, params={"temperature": 1.0})
    got = store.get_conversation(c.id)
    assert got.system_prompt is None and got.params == {"temperature": 1.0}
    store.rename(c.id, "Geography")
    assert store.get_conversation(c.id).title == "Geography"
    store.delete(c.id)
    assert store.get_conversation(c.id) is None and store.messages(c.id) == []


def test_list_is_newest_first_and_search_finds_titles_and_text(store):
    a = store.create_conversation("Dragons")
    b = store.create_conversation("Cooking")
    store.add_message(a.id, "user", "Tell me about 100% wyverns_and_more")
    assert [c.id for c in store.list_conversations()] == [a.id, b.id]  # a updated last
    assert [c.id for c in store.list_conversations("cook")] == [b.id]
    assert [c.id for c in store.list_conversations("WYVERN")] == [a.id]
    assert [c.id for c in store.list_conversations("100%")] == [a.id]
    assert store.list_conversations("1000%") == []  # % is literal, not a wildcard
    assert store.list_conversations("e_n") == []  # so is _ ("ern" would match a wildcard)
    assert store.last_conversation().id == b.id  # created (opened) last: the one on screen
    store.mark_opened(a.id)
    assert store.last_conversation().id == a.id


def test_delete_branch_cuts_the_tail(store):
    c = store.create_conversation()
    ids = [store.add_message(c.id, r, t) for r, t in
           [("user", "1"), ("assistant", "2"), ("user", "3"), ("assistant", "4")]]
    assert store.delete_branch(c.id, ids[2]) == 2
    assert [m.content for m in store.messages(c.id)] == ["1", "2"]
    assert store.add_message(c.id, "user", "5") and \
        [m.content for m in store.messages(c.id)] == ["1", "2", "5"]


def _contents(messages):
    return [(m.content, m.version) for m in messages]


def test_an_edit_or_a_regeneration_adds_a_sibling_branch_and_loses_nothing(store):
    c = store.create_conversation()
    u1 = store.add_message(c.id, "user", "Q1")
    a1 = store.add_message(c.id, "assistant", "A1")
    u2 = store.add_message(c.id, "user", "Q2")
    store.add_message(c.id, "assistant", "A2")
    # regenerate A1: a second version after Q1; the branch on screen is Q1, A1'
    a1b = store.begin_reply(c.id, parent=u1)
    store.finish_reply(a1b, "A1'", status="complete")
    assert _contents(store.messages(c.id)) == [("Q1", (1, 1)), ("A1'", (2, 2))]
    # edit Q1: a second first message
    u1b = store.add_message(c.id, "user", "Q1 edited", parent=None)
    store.add_message(c.id, "assistant", "A1 edited")
    assert _contents(store.messages(c.id)) == [("Q1 edited", (2, 2)), ("A1 edited", (1, 1))]
    assert store.message_count(c.id) == 7  # nothing was lost
    assert store.versions(c.id, u1b) == (u1, u1b) and store.versions(c.id, a1b) == (a1, a1b)
    assert store.versions(c.id, 10_000) == ()
    # back to the first version of Q1: lands on the newest message written under it
    assert _contents(store.switch_branch(c.id, u1)) == [("Q1", (1, 2)), ("A1'", (2, 2))]
    assert _contents(store.switch_branch(c.id, a1)) == [
        ("Q1", (1, 2)), ("A1", (1, 2)), ("Q2", (1, 1)), ("A2", (1, 1))]
    assert store.messages(c.id)[2].id == u2
    # the leaf is stored: a second store (another process) sees the same branch
    again = ConversationStore.open(store.path)
    try:
        assert [m.content for m in again.messages(c.id)] == ["Q1", "A1", "Q2", "A2"]
        again.add_message(c.id, "user", "Q3")  # appends to the branch on screen
    finally:
        again.close()
    assert [m.content for m in store.messages(c.id)][-2:] == ["A2", "Q3"]
    with pytest.raises(ValueError):
        store.switch_branch(c.id, 10_000)
    other = store.create_conversation()
    with pytest.raises(ValueError):
        store.add_message(other.id, "user", "x", parent=u1b)  # a parent from elsewhere


def test_deleting_a_branch_keeps_its_siblings(store):
    c = store.create_conversation()
    u = store.add_message(c.id, "user", "Q")
    store.add_message(c.id, "assistant", "A")
    b = store.add_message(c.id, "assistant", "B", parent=u)
    store.add_message(c.id, "user", "after B")
    assert store.delete_branch(c.id, b) == 2
    assert _contents(store.messages(c.id)) == [("Q", (1, 1))]
    assert _contents(store.switch_branch(c.id, u)) == [("Q", (1, 1)), ("A", (1, 1))]


def test_fork_copies_the_branch_on_screen_into_a_new_conversation(store):
    c = store.create_conversation("Trip", model="m", system_prompt="Be brief.",
                                  params={"temperature": 0.3})
    u = store.add_message(c.id, "user", "Q")
    store.add_message(c.id, "assistant", "A", stats={"completion_tokens": 1})
    store.add_message(c.id, "assistant", "B", parent=u)
    f = store.fork(c.id)
    assert (f.title, f.model, f.system_prompt, f.params) == \
        ("Trip (fork)", "m", "Be brief.", {"temperature": 0.3})
    assert _contents(store.messages(f.id)) == [("Q", (1, 1)), ("B", (1, 1))]
    assert store.message_count(c.id) == 3 and store.message_count(f.id) == 2
    store.add_message(f.id, "user", "only in the fork")
    assert [m.content for m in store.messages(c.id)] == ["Q", "B"]
    assert store.fork(f.id).title == "Trip (fork)"


def test_reply_writer_flushes_on_interval_and_at_the_end(store):
    c = store.create_conversation()
    now = [0.0]
    mid = store.begin_reply(c.id)
    w = ReplyWriter(store, mid, interval_s=0.5, clock=lambda: now[0])
    w.feed("Hello")
    assert store.messages(c.id)[0].content == ""  # not yet: within the interval
    now[0] = 0.6
    w.feed(", world")
    m = store.messages(c.id)[0]
    assert (m.content, m.status) == ("Hello, world", "streaming")
    w.feed("!")
    w.finish("interrupted", {"completion_tokens": 3})
    m = store.messages(c.id)[0]
    assert (m.content, m.status, m.stats) == ("Hello, world!", "interrupted", {"completion_tokens": 3})


def test_continuing_a_reply_keeps_its_prefix(store):
    c = store.create_conversation()
    mid = store.begin_reply(c.id)
    store.finish_reply(mid, "Once upon", status="interrupted")
    store.reopen_reply(mid)
    assert store.messages(c.id)[0].status == "streaming"
    w = ReplyWriter(store, mid, prefix="Once upon", interval_s=0)
    w.feed(" a time")
    assert w.finish("complete", None, " a time.") == "Once upon a time."
    assert store.messages(c.id)[0].content == "Once upon a time."


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


@pytest.mark.subprocess
def test_opening_marks_replies_of_dead_processes_interrupted(tmp_path):
    s = ConversationStore.open(tmp_path / "h.db")
    c = s.create_conversation()
    dead = s.begin_reply(c.id, content="half a rep")
    live = s.begin_reply(c.id, content="still going")  # this process: alive
    s._db.execute("UPDATE messages SET writer_pid = ? WHERE id = ?", (_dead_pid(), dead))
    s.close()
    s = ConversationStore.open(tmp_path / "h.db")
    try:
        status = {m.id: (m.status, m.content) for m in s.messages(c.id)}
        assert status[dead] == ("interrupted", "half a rep")
        assert status[live] == ("streaming", "still going")
    finally:
        s.close()


def test_migrations_from_an_older_schema_keep_data(tmp_path):
    path = tmp_path / "old.db"
    db = connect(path)
    assert migrate(db, MIGRATIONS[:1]) == 1  # a file written by a version-1 localchat
    db.execute("INSERT INTO conversations (title, created, updated) VALUES ('old', 1, 1)")
    db.execute("INSERT INTO messages (conversation_id, role, content, created) "
               "VALUES (1, 'user', 'kept', 1)")
    db.close()
    s = ConversationStore.open(path)
    try:
        assert s._db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert [m.content for m in s.messages(1)] == ["kept"]
        cols = [r[1] for r in s._db.execute("PRAGMA table_info(messages)")]
        assert "writer_pid" in cols
    finally:
        s.close()


def test_the_tree_migration_keeps_a_history_written_by_the_linear_schema(tmp_path):
    """A database as localchat wrote it before branches (schema 2): every conversation
    comes back in order, as one branch, and goes on growing from its last message."""
    path = tmp_path / "linear.db"
    db = connect(path)
    assert migrate(db, MIGRATIONS[:2]) == 2
    for cid, title in ((1, "one"), (2, "two"), (3, "empty")):
        db.execute("INSERT INTO conversations (id, title, created, updated, params) "
                   "VALUES (?, ?, 1, 1, '{}')", (cid, title))
    rows = [(1, "user", "a"), (2, "user", "x"), (1, "assistant", "b"), (2, "assistant", "y"),
            (1, "user", "c"), (1, "assistant", "d")]  # interleaved ids, as two chats write
    for cid, role, text in rows:
        db.execute("INSERT INTO messages (conversation_id, role, content, status, created) "
                   "VALUES (?, ?, ?, 'complete', 1)", (cid, role, text))
    db.close()
    s = ConversationStore.open(path)
    try:
        assert s._db.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert _contents(s.messages(1)) == [(t, (1, 1)) for t in "abcd"]
        assert [m.content for m in s.messages(2)] == ["x", "y"] and s.messages(3) == []
        parents = [m.parent_id for m in s.messages(1)]
        assert parents == [None] + [m.id for m in s.messages(1)][:-1]
        s.add_message(1, "user", "e")
        assert [m.content for m in s.messages(1)] == list("abcde")
        assert s.integrity_check() == "ok"
    finally:
        s.close()


def test_a_failing_migration_rolls_back_whole(tmp_path):
    db = connect(tmp_path / "m.db")

    def broken(conn):
        conn.execute("CREATE TABLE half (x)")
        raise sqlite3.OperationalError("boom")

    with pytest.raises(sqlite3.OperationalError):
        migrate(db, [MIGRATIONS[0], broken])
    assert db.execute("SELECT version FROM schema_version").fetchone()[0] == 1
    assert db.execute("SELECT name FROM sqlite_master WHERE name = 'half'").fetchone() is None


def test_a_newer_schema_is_refused_not_downgraded(tmp_path):
    path = tmp_path / "new.db"
    ConversationStore.open(path).close()
    db = sqlite3.connect(path)
    db.execute("UPDATE schema_version SET version = 99")
    db.commit()
    db.close()
    with pytest.raises(StoreUnavailable, match="newer localchat"):
        ConversationStore.open(path)


def test_threads_and_connections_write_concurrently(tmp_path):
    path = tmp_path / "busy.db"
    s = ConversationStore.open(path)
    other = ConversationStore.open(path)  # a second "process": its own connections
    c = s.create_conversation()
    errors = []

    def writer(store, tag):
        try:
            for i in range(40):
                store.add_message(c.id, "user", f"{tag}-{i}")
        except Exception as exc:  # noqa: BLE001 -- collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(st, f"t{n}"))
               for n, st in enumerate([s, s, other, other])]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert len(s.messages(c.id)) == 160
        assert len(s._conns._all) >= 3  # the main thread and each writer thread
        assert s.integrity_check() == "ok"
    finally:
        s.close()
        other.close()


def test_garbage_file_is_reported_corrupt_and_never_deleted(tmp_path):
    path = tmp_path / "history.db"
    garbage = b"this is not a database" * 500
    path.write_bytes(garbage)
    with pytest.raises(StoreUnavailable) as info:
        ConversationStore.open(path)
    assert info.value.kind == "corrupt" and info.value.path == path
    assert path.read_bytes() == garbage
    moved = set_aside(path)
    assert not path.exists() and moved.read_bytes() == garbage
    assert moved.name.startswith("history.db.corrupt-")
    ConversationStore.open(path).close()  # a fresh history can start


def test_set_aside_moves_wal_and_shm_together(tmp_path):
    path = tmp_path / "history.db"
    for suffix, data in (("", b"db"), ("-wal", b"wal"), ("-shm", b"shm")):
        path.with_name(path.name + suffix).write_bytes(data)
    moved = set_aside(path, now=0)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [moved.name, moved.name + "-wal", moved.name + "-shm"])
    assert moved.with_name(moved.name + "-wal").read_bytes() == b"wal"
    again = tmp_path / "history.db"
    again.write_bytes(b"db2")
    assert set_aside(again, now=0) != moved  # same second: a new name, nothing overwritten


def test_locked_database_is_reported_locked(tmp_path):
    path = tmp_path / "history.db"
    ConversationStore.open(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(StoreUnavailable) as info:
            ConversationStore.open(path, busy_timeout_ms=200)
        assert info.value.kind == "locked"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert path.is_file()


def test_titles_come_from_the_first_line():
    assert title_from("\n  Hello there  \nmore") == "Hello there"
    assert title_from("x" * 100).endswith("…") and len(title_from("x" * 100)) == 48
    assert title_from("   ") == "New chat"


def test_tool_calls_are_kept_with_their_reply_by_forks_and_exports(tmp_path):
    from localchat.storage.export import to_json, to_markdown

    s = ConversationStore.open(tmp_path / "h.db")
    try:
        conv = s.create_conversation("weather")
        s.add_message(conv.id, "user", "Oslo?")
        reply = s.begin_reply(conv.id)
        calls = [{"name": "get_weather", "arguments": '{"city": "Oslo"}',
                  "result": '{"temperature": 18}', "error": False, "approved": True},
                 {"name": "add", "arguments": "{}", "result": "the user did not allow add to run",
                  "error": True, "approved": False}]
        s.set_tool_calls(reply, calls)
        s.finish_reply(reply, "It is 18 degrees.", status="complete")
        assert list(s.messages(conv.id)[-1].tool_calls) == calls
        fork = s.fork(conv.id)
        assert list(s.messages(fork.id)[-1].tool_calls) == calls
        markdown = to_markdown(conv, s.messages(conv.id))
        assert '> tool call: `get_weather({"city": "Oslo"})` → result' in markdown
        assert "> tool call: `add({})` → refused" in markdown
        assert markdown.index("temperature") < markdown.index("It is 18 degrees.")
        exported = json.loads(to_json(conv, s.messages(conv.id)))
        assert exported["messages"][1]["tool_calls"] == calls
        assert "tool_calls" not in exported["messages"][0]
        # a value this localchat did not write reads as no calls, never an error
        s._db.execute("UPDATE messages SET tool_calls = '{\"x\": 1}' WHERE id = ?", (reply,))
        assert s.messages(conv.id)[-1].tool_calls == ()
    finally:
        s.close()
