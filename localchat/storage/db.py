"""The conversation database file: where it lives, connection setup, the schema and its
migrations, and setting a damaged file aside. Connections are per thread, WAL with a busy
timeout and synchronous=NORMAL: an application crash loses no committed write."""

from __future__ import annotations

import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from localchat.errors import LocalchatError

DB_FILE = "history.db"
BUSY_TIMEOUT_MS = 5000


class StoreUnavailable(LocalchatError):
    """The history database cannot be used; `kind` is "corrupt", "locked" or "error"."""

    def __init__(self, message: str, kind: str, path: Path) -> None:
        super().__init__(message)
        self.kind, self.path = kind, path


def default_db_path() -> Path:
    from localchat.paths import data_dir

    return data_dir() / DB_FILE


# -- schema ----------------------------------------------------------------------------

def _v1(db: sqlite3.Connection) -> None:
    db.execute("""CREATE TABLE conversations (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        created REAL NOT NULL,
        updated REAL NOT NULL,
        model TEXT NOT NULL DEFAULT '',
        system_prompt TEXT,
        params TEXT NOT NULL DEFAULT '{}'
    )""")
    db.execute("""CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        model TEXT,
        params TEXT,
        stats TEXT,
        status TEXT NOT NULL DEFAULT 'complete'
            CHECK (status IN ('complete', 'interrupted', 'streaming')),
        created REAL NOT NULL
    )""")


def _v2(db: sqlite3.Connection) -> None:
    # Which process is writing a 'streaming' reply, so that opening the database from
    # a second process does not mark a live reply as interrupted; and the indexes the
    # sidebar's ordering and per-conversation reads use.
    db.execute("ALTER TABLE messages ADD COLUMN writer_pid INTEGER")
    db.execute("CREATE INDEX messages_by_conversation ON messages(conversation_id, id)")
    db.execute("CREATE INDEX conversations_by_updated ON conversations(updated)")


def _v3(db: sqlite3.Connection) -> None:
    # Conversations become trees (an edit or a regeneration adds a sibling branch): each
    # message gets its parent, the one before it so far; a conversation remembers the last
    # message of the branch on screen (leaf_id).
    db.execute("ALTER TABLE messages ADD COLUMN parent_id INTEGER")
    db.execute("UPDATE messages SET parent_id = (SELECT MAX(p.id) FROM messages p "
               "WHERE p.conversation_id = messages.conversation_id AND p.id < messages.id)")
    db.execute("ALTER TABLE conversations ADD COLUMN leaf_id INTEGER")
    db.execute("UPDATE conversations SET leaf_id = "
               "(SELECT MAX(m.id) FROM messages m WHERE m.conversation_id = conversations.id)")
    db.execute("CREATE INDEX messages_by_parent ON messages(conversation_id, parent_id)")


def _v4(db: sqlite3.Connection) -> None:
    # When each conversation was last opened (created, or shown from the list): --continue
    # goes back to the one on screen at quit, not the one written last.
    db.execute("ALTER TABLE conversations ADD COLUMN opened REAL")


def _v5(db: sqlite3.Connection) -> None:
    # The tool calls a reply made before its answer (JSON: name, arguments, result, error,
    # approved, the text said before the call), kept with it through branches and forks.
    db.execute("ALTER TABLE messages ADD COLUMN tool_calls TEXT")


MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_v1, _v2, _v3, _v4, _v5]
SCHEMA_VERSION = len(MIGRATIONS)


def migrate(db: sqlite3.Connection, migrations=None) -> int:
    """Bring the schema to the newest version, each step in its own transaction (the
    version is re-read under the write lock, so two processes never run a step twice).
    Returns the version reached. A file from a newer localchat is refused."""
    migrations = MIGRATIONS if migrations is None else migrations
    while True:
        with transaction(db):
            db.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = db.execute("SELECT version FROM schema_version").fetchone()
            if row is None:
                db.execute("INSERT INTO schema_version VALUES (0)")
            version = row[0] if row else 0
            if version > len(migrations):
                raise StoreUnavailable(
                    f"the history database is from a newer localchat (schema {version}, "
                    f"this one knows {len(migrations)})", "error", Path(db_path(db)))
            if version == len(migrations):
                return version
            migrations[version](db)  # the step and its version number, or neither
            db.execute("UPDATE schema_version SET version = ?", (version + 1,))


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error). Taking the write lock up front
    makes a second writer wait out busy_timeout instead of failing on a lock upgrade."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    except BaseException:
        db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")


def db_path(db: sqlite3.Connection) -> str:
    return db.execute("PRAGMA database_list").fetchone()[2]


# -- connections -----------------------------------------------------------------------

def connect(path: Path, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> sqlite3.Connection:
    """A connection with localchat's settings. Raises sqlite3 errors as they come."""
    db = sqlite3.connect(str(path), timeout=busy_timeout_ms / 1000, isolation_level=None,
                         check_same_thread=False)  # closed by the owner at exit
    try:
        db.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise sqlite3.OperationalError(f"could not switch to WAL (journal mode {mode})")
        db.execute("PRAGMA synchronous = NORMAL")
        db.execute("PRAGMA foreign_keys = ON")
    except BaseException:
        db.close()
        raise
    db.row_factory = sqlite3.Row
    return db


def classify(exc: sqlite3.Error, path: Path) -> StoreUnavailable:
    text = str(exc)
    if "locked" in text or "busy" in text:
        return StoreUnavailable(
            f"the history database {path} is locked by another program; history is off "
            "for this session", "locked", path)
    if isinstance(exc, sqlite3.DatabaseError) and (
            "not a database" in text or "malformed" in text or "corrupt" in text):
        return StoreUnavailable(
            f"the history database {path} is damaged ({text}); history is off for this "
            "session", "corrupt", path)
    return StoreUnavailable(f"the history database {path} cannot be used: {text}", "error", path)


class Connections:
    """One connection per thread on one database file, all closed together."""

    def __init__(self, path: Path, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> None:
        self.path, self.busy_timeout_ms = path, busy_timeout_ms
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()

    def get(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            db = connect(self.path, self.busy_timeout_ms)
            self._local.db = db
            with self._lock:
                self._all.append(db)
        return db

    def close(self) -> None:
        with self._lock:
            for db in self._all:
                try:
                    db.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()


def open_checked(path: Path, busy_timeout_ms: int = BUSY_TIMEOUT_MS) -> Connections:
    """Open (creating if needed), check and migrate the database; StoreUnavailable if it
    cannot be used. The file is never deleted or rewritten when it is damaged."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # e.g. LOCALCHAT_HOME under a read-only folder, or under a file
        raise StoreUnavailable(f"cannot create the history folder {path.parent} "
                               f"({exc.strerror or exc}); history is off for this session",
                               "error", path) from None
    conns = Connections(path, busy_timeout_ms)
    try:
        db = conns.get()
        check = db.execute("PRAGMA quick_check").fetchone()[0]
        if check != "ok":
            raise sqlite3.DatabaseError(f"database disk image is malformed: {check}")
        migrate(db)
    except sqlite3.Error as exc:
        conns.close()
        raise classify(exc, path) from None
    except StoreUnavailable:
        conns.close()
        raise
    return conns


def set_aside(path: Path, now: float | None = None) -> Path:
    """Rename a damaged database (and its -wal/-shm files, kept openable together) to
    `<name>.corrupt-<timestamp>`. Nothing is deleted. Returns the new database path."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 1
    while target.exists():
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    for suffix in ("-wal", "-shm"):
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(target.with_name(target.name + suffix))
    if path.exists():
        path.rename(target)
    return target
