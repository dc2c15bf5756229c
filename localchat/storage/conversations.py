"""Conversations and their messages in SQLite: the one place that reads and writes them.
A conversation is a tree (tree.py), `messages()` the branch on screen; replies a dead process
left 'streaming' are marked interrupted when the store opens."""

from __future__ import annotations

import functools
import json
import os
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from localchat.errors import LocalchatError
from localchat.storage import tree
from localchat.storage.db import (
    BUSY_TIMEOUT_MS,
    Connections,
    default_db_path,
    open_checked,
    transaction,
)
from localchat.storage.reply_status import ReplyStatus

TITLE_CHARS = 48


class StoreError(LocalchatError):
    """Reading or writing history failed (disk full, I/O error, lock held too long)."""


def _wrapped(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise StoreError(f"history database: {exc}") from None
    return call


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    created: float
    updated: float
    model: str = ""
    system_prompt: str | None = None
    params: dict = field(default_factory=dict)


@dataclass(frozen=True)
class StoredMessage:
    id: int
    conversation_id: int
    role: str
    content: str
    status: ReplyStatus = ReplyStatus.COMPLETE
    model: str | None = None
    params: dict | None = None
    stats: dict | None = None
    created: float = 0.0
    parent_id: int | None = None
    siblings: tuple[int, ...] = ()  # the versions of this message, itself included, oldest first
    tool_calls: tuple[dict, ...] = ()  # a reply's calls before its answer (chat/tool_loop.py)

    @property
    def finish_reason(self) -> str | None:
        """Why its generation ended (stop, length, cancelled), where that was stored."""
        return (self.stats or {}).get("finish_reason")

    @property
    def version(self) -> tuple[int, int]:
        """(which version this is, counting from 1; how many there are)."""
        return (self.siblings.index(self.id) + 1 if self.id in self.siblings else 1,
                max(len(self.siblings), 1))


def title_from(text: str) -> str:
    """A conversation title from its first message: the first line, shortened."""
    line = next((l.strip() for l in text.splitlines() if l.strip()), "") or "New chat"
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1].rstrip() + "…"


def _json(value) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, sort_keys=True)


def _calls(text: str | None) -> tuple[dict, ...]:
    """A stored reply's tool calls; what is not a list of objects reads as none."""
    calls = _load(text)
    return tuple(c for c in calls if isinstance(c, dict)) if isinstance(calls, list) else ()


def _load(text: str | None):
    if text is None:
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this id runs now (this one always does)."""
    if not pid:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    except OSError:
        return False
    return True


class ConversationStore:
    """History on one SQLite file. Safe to use from several threads (one connection
    each) and several processes (WAL, busy timeout)."""

    def __init__(self, conns: Connections) -> None:
        self._conns = conns
        self.path = conns.path

    @classmethod
    def open(cls, path: Path | None = None, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS,
             recover: bool = True) -> "ConversationStore":
        """Open (and create or migrate) the store; raises StoreUnavailable when the file
        is damaged or locked, leaving it untouched."""
        store = cls(open_checked(path or default_db_path(), busy_timeout_ms))
        if recover:
            try:
                store.recover_interrupted()
            except StoreError:
                pass  # a read-only moment is no reason to refuse history
        return store

    @property
    def _db(self) -> sqlite3.Connection:
        return self._conns.get()

    def close(self) -> None:
        self._conns.close()

    # -- conversations ---------------------------------------------------------------

    @_wrapped
    def create_conversation(self, title: str = "New chat", *, model: str = "",
                            system_prompt: str | None = None,
                            params: dict | None = None) -> Conversation:
        now = time.time()
        with transaction(self._db) as db:
            cur = db.execute(
                "INSERT INTO conversations (title, created, updated, opened, model, "
                "system_prompt, params) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (title, now, now, now, model, system_prompt, _json(params or {})))
        return Conversation(cur.lastrowid, title, now, now, model, system_prompt,
                            dict(params or {}))

    @staticmethod
    def _conversation(row: sqlite3.Row) -> Conversation:
        params = _load(row["params"])
        return Conversation(row["id"], row["title"], row["created"], row["updated"],
                            row["model"], row["system_prompt"],
                            params if isinstance(params, dict) else {})

    @_wrapped
    def get_conversation(self, conversation_id: int) -> Conversation | None:
        row = self._db.execute("SELECT * FROM conversations WHERE id = ?",
                               (conversation_id,)).fetchone()
        return self._conversation(row) if row else None

    @_wrapped
    def list_conversations(self, search: str = "") -> list[Conversation]:
        """Newest first; `search` matches the title or any message's text (no case)."""
        if not search.strip():
            rows = self._db.execute(
                "SELECT * FROM conversations ORDER BY updated DESC, id DESC").fetchall()
        else:
            pattern = "%" + search.strip().replace("\\", "\\\\").replace("%", "\\%") \
                .replace("_", "\\_") + "%"
            rows = self._db.execute(
                "SELECT * FROM conversations c WHERE c.title LIKE ?1 ESCAPE '\\' OR EXISTS "
                "(SELECT 1 FROM messages m WHERE m.conversation_id = c.id "
                "AND m.content LIKE ?1 ESCAPE '\\') ORDER BY updated DESC, id DESC",
                (pattern,)).fetchall()
        return [self._conversation(r) for r in rows]

    @_wrapped
    def last_conversation(self) -> Conversation | None:
        """The conversation opened (or created) last: the one on screen at quit; without
        any opened, the one written last."""
        row = self._db.execute("SELECT * FROM conversations ORDER BY COALESCE(opened, 0) DESC, "
                               "updated DESC, id DESC LIMIT 1").fetchone()
        return self._conversation(row) if row else None

    @_wrapped
    def mark_opened(self, conversation_id: int) -> None:
        """Remember that the conversation is the one on screen now (for --continue)."""
        with transaction(self._db) as db:
            db.execute("UPDATE conversations SET opened = ? WHERE id = ?",
                       (time.time(), conversation_id))

    @_wrapped
    def rename(self, conversation_id: int, title: str) -> None:
        with transaction(self._db) as db:
            db.execute("UPDATE conversations SET title = ? WHERE id = ?",
                       (title, conversation_id))

    @_wrapped
    def delete(self, conversation_id: int) -> None:
        with transaction(self._db) as db:
            db.execute("DELETE FROM conversations WHERE id = ?", (conversation_id,))

    @_wrapped
    def update_settings(self, conversation_id: int, *, model: str | None = None,
                        system_prompt: str | None | type(...) = ...,
                        params: dict | None = None) -> None:
        """Change what the conversation runs with; arguments left out stay as they are
        (system_prompt=None clears it)."""
        sets, values = [], []
        if model is not None:
            sets.append("model = ?"), values.append(model)
        if system_prompt is not ...:
            sets.append("system_prompt = ?"), values.append(system_prompt)
        if params is not None:
            sets.append("params = ?"), values.append(_json(params))
        if not sets:
            return
        with transaction(self._db) as db:
            db.execute(f"UPDATE conversations SET {', '.join(sets)} WHERE id = ?",
                       (*values, conversation_id))

    # -- messages --------------------------------------------------------------------

    @_wrapped
    def add_message(self, conversation_id: int, role: str, content: str, *,
                    parent: int | None | type(...) = ..., model: str | None = None,
                    params: dict | None = None, stats: dict | None = None,
                    status: ReplyStatus | str = ReplyStatus.COMPLETE) -> int:
        """Append a message after `parent` (left out: after the branch on screen; None: as
        another first message) and make it the conversation's leaf."""
        if status not in tuple(ReplyStatus):
            raise ValueError(f"unknown status {status!r}")
        status = ReplyStatus(status)
        now = time.time()
        with transaction(self._db) as db:
            if parent is ...:
                parent = self._leaf(conversation_id)
            elif parent is not None:
                row = db.execute("SELECT conversation_id FROM messages WHERE id = ?",
                                 (parent,)).fetchone()
                if row is None or row[0] != conversation_id:
                    raise ValueError(f"message {parent} is not in conversation {conversation_id}")
            cur = db.execute(
                "INSERT INTO messages (conversation_id, parent_id, role, content, model, params, "
                "stats, status, created, writer_pid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (conversation_id, parent, role, content, model, _json(params), _json(stats),
                 status, now, os.getpid() if status == ReplyStatus.STREAMING else None))
            db.execute("UPDATE conversations SET updated = ?, leaf_id = ? WHERE id = ?",
                       (now, cur.lastrowid, conversation_id))
        return cur.lastrowid

    def begin_reply(self, conversation_id: int, *, parent: int | None | type(...) = ...,
                    model: str | None = None, params: dict | None = None,
                    content: str = "") -> int:
        """An assistant message that is being written (status 'streaming')."""
        return self.add_message(conversation_id, "assistant", content, parent=parent,
                                model=model, params=params, status=ReplyStatus.STREAMING)

    @_wrapped
    def update_reply(self, message_id: int, content: str) -> None:
        with transaction(self._db) as db:
            db.execute("UPDATE messages SET content = ? WHERE id = ?", (content, message_id))

    @_wrapped
    def set_tool_calls(self, message_id: int, calls: list[dict]) -> None:
        """The calls a reply has made so far (each: name, arguments, result, error, ...)."""
        with transaction(self._db) as db:
            db.execute("UPDATE messages SET tool_calls = ? WHERE id = ?",
                       (_json(list(calls)) if calls else None, message_id))

    @_wrapped
    def reopen_reply(self, message_id: int) -> None:
        """A stopped reply that is being continued: streaming again, by this process."""
        with transaction(self._db) as db:
            db.execute("UPDATE messages SET status = ?, writer_pid = ? WHERE id = ?",
                       (ReplyStatus.STREAMING, os.getpid(), message_id))

    @_wrapped
    def finish_reply(self, message_id: int, content: str, *, status: ReplyStatus | str,
                     stats: dict | None = None) -> None:
        if status not in (ReplyStatus.COMPLETE, ReplyStatus.INTERRUPTED):
            raise ValueError(f"a finished reply is complete or interrupted, not {status!r}")
        now = time.time()
        with transaction(self._db) as db:
            db.execute("UPDATE messages SET content = ?, status = ?, stats = ?, "
                       "writer_pid = NULL WHERE id = ?",
                       (content, ReplyStatus(status), _json(stats), message_id))
            db.execute("UPDATE conversations SET updated = ? WHERE id = "
                       "(SELECT conversation_id FROM messages WHERE id = ?)", (now, message_id))

    # -- the tree ----------------------------------------------------------------------

    def _parents(self, conversation_id: int) -> dict[int, int | None]:
        return {r[0]: r[1] for r in self._db.execute(
            "SELECT id, parent_id FROM messages WHERE conversation_id = ?", (conversation_id,))}

    def _leaf(self, conversation_id: int) -> int | None:
        """The last message of the branch on screen (the newest message where none is set)."""
        row = self._db.execute(
            "SELECT c.leaf_id, (SELECT MAX(id) FROM messages WHERE conversation_id = c.id), "
            "EXISTS (SELECT 1 FROM messages WHERE id = c.leaf_id AND conversation_id = c.id) "
            "FROM conversations c WHERE c.id = ?", (conversation_id,)).fetchone()
        if row is None:
            return None
        return row[0] if row[2] else row[1]

    @_wrapped
    def messages(self, conversation_id: int) -> list[StoredMessage]:
        """The branch on screen, first message first, each with its sibling versions."""
        rows = {r["id"]: r for r in self._db.execute(
            "SELECT * FROM messages WHERE conversation_id = ?", (conversation_id,))}
        parents = {i: r["parent_id"] for i, r in rows.items()}
        children = tree.children_of(parents)
        return [self._message(rows[i], tuple(children[parents[i]]))
                for i in tree.path_to(self._leaf(conversation_id), parents)]

    @staticmethod
    def _message(r: sqlite3.Row, siblings: tuple[int, ...]) -> StoredMessage:
        return StoredMessage(r["id"], r["conversation_id"], r["role"], r["content"],
                             ReplyStatus(r["status"]),
                             r["model"], _load(r["params"]), _load(r["stats"]), r["created"],
                             r["parent_id"], siblings, _calls(r["tool_calls"]))

    @_wrapped
    def versions(self, conversation_id: int, message_id: int) -> tuple[int, ...]:
        """The versions of a message (it and its siblings), oldest first."""
        row = self._db.execute("SELECT parent_id FROM messages WHERE id = ? AND "
                               "conversation_id = ?", (message_id, conversation_id)).fetchone()
        if row is None:
            return ()
        return tuple(r[0] for r in self._db.execute(
            "SELECT id FROM messages WHERE conversation_id = ? AND parent_id IS ? ORDER BY id",
            (conversation_id, row[0])))

    @_wrapped
    def child_count(self, message_id: int) -> int:
        """How many messages follow this one directly (its replies' versions)."""
        return self._db.execute("SELECT COUNT(*) FROM messages WHERE parent_id = ?",
                                (message_id,)).fetchone()[0]

    @_wrapped
    def message_count(self, conversation_id: int) -> int:
        """Every message of the conversation, in all its branches."""
        return self._db.execute("SELECT COUNT(*) FROM messages WHERE conversation_id = ?",
                                (conversation_id,)).fetchone()[0]

    @_wrapped
    def switch_branch(self, conversation_id: int, message_id: int) -> list[StoredMessage]:
        """Show the branch through `message_id` (down to the newest message written under
        it) and return it."""
        with transaction(self._db) as db:
            parents = self._parents(conversation_id)
            if message_id not in parents:
                raise ValueError(f"message {message_id} is not in conversation {conversation_id}")
            db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?",
                       (tree.latest_leaf(message_id, parents), conversation_id))
        return self.messages(conversation_id)

    @_wrapped
    def delete_branch(self, conversation_id: int, message_id: int) -> int:
        """Delete a message and everything that followed it, in every branch (a turn that
        got no reply); the branch on screen ends at its parent. Returns how many went."""
        with transaction(self._db) as db:
            parents, leaf = self._parents(conversation_id), self._leaf(conversation_id)
            gone = tree.subtree(message_id, parents)
            db.executemany("DELETE FROM messages WHERE id = ?", [(i,) for i in gone])
            if leaf in gone:
                db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?",
                           (parents.get(message_id), conversation_id))
        return len(gone)

    @_wrapped
    def fork(self, conversation_id: int, title: str | None = None) -> Conversation:
        """A new conversation holding a copy of the branch on screen, with the same
        settings; the original is left as it is."""
        conv = self.get_conversation(conversation_id)
        if conv is None:
            raise ValueError(f"no conversation {conversation_id}")
        branch = self.messages(conversation_id)
        now = time.time()
        title = title or (conv.title if conv.title.endswith("(fork)") else f"{conv.title} (fork)")
        with transaction(self._db) as db:
            new_id = db.execute(
                "INSERT INTO conversations (title, created, updated, model, system_prompt, "
                "params) VALUES (?, ?, ?, ?, ?, ?)",
                (title, now, now, conv.model, conv.system_prompt, _json(conv.params))).lastrowid
            parent = None
            for m in branch:
                status = (ReplyStatus.INTERRUPTED if m.status == ReplyStatus.STREAMING
                          else m.status)
                parent = db.execute(
                    "INSERT INTO messages (conversation_id, parent_id, role, content, model, "
                    "params, stats, status, created, tool_calls) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (new_id, parent, m.role, m.content, m.model, _json(m.params),
                     _json(m.stats), status, m.created,
                     _json(list(m.tool_calls)) if m.tool_calls else None)).lastrowid
            db.execute("UPDATE conversations SET leaf_id = ? WHERE id = ?", (parent, new_id))
        return self.get_conversation(new_id)

    @_wrapped
    def recover_interrupted(self) -> int:
        """Mark replies whose writing process is gone as interrupted; returns how many."""
        rows = self._db.execute(
            "SELECT id, writer_pid FROM messages WHERE status = ?",
            (ReplyStatus.STREAMING,)).fetchall()
        dead = [r["id"] for r in rows if not pid_alive(r["writer_pid"])]
        if dead:
            with transaction(self._db) as db:
                db.executemany("UPDATE messages SET status = ?, writer_pid = NULL "
                               "WHERE id = ? AND status = ?",
                               [(ReplyStatus.INTERRUPTED, i, ReplyStatus.STREAMING)
                                for i in dead])
        return len(dead)

    @_wrapped
    def integrity_check(self) -> str:
        return self._db.execute("PRAGMA integrity_check").fetchone()[0]
