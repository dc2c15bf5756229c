"""KV snapshots on disk: one file per saved conversation prefix, found by the chain of its
16-token blocks' keys, valid for one model file and KV identity, checked by a SHA-256
digest over the whole file (twice blake2b's speed here: SHA extensions), written atomically on a background thread, and kept within a
byte budget by evicting the least recently used. A damaged or stale file is removed."""

from __future__ import annotations

import hashlib
import json
import os
import queue
import re
import stat
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from localchat.paths import data_dir
from localchat.storage.own_folder import OwnFolder, process_alive, writer_pid

MAGIC = b"LCKVSNP1"
DIGEST_BYTES = 32
HEAD_DIGEST_BYTES = 16  # the header's own digest: startup reads headers only
SUFFIX = ".kv"
DEFAULT_BUDGET = 2 << 30  # --kv-disk's default: 2 GiB
STALE_TMP_S = 3600  # a temporary file this old is a write a process never finished
MAX_HEADER_BYTES = 64 << 20  # a header larger than this is not one of ours
READ_CHUNK = 8 << 20  # the payload is read (and digested) in pieces of this size
NAME = re.compile(r"^[0-9a-f]{32}\.kv$")  # how the store names its files
TEMPORARY = re.compile(r"^\.[0-9a-f]{32}\.kv\..+\.tmp$")  # and their writes in progress


def snapshot_dir() -> Path:
    """Where the snapshots live: kv/ in the data dir."""
    return data_dir() / "kv"


@dataclass
class Entry:
    """One snapshot file as the index knows it (its header, not yet verified)."""

    name: str
    model: str  # the model file's path: snapshots of other files are left alone
    identity: str  # model file version + executor + KV types: a different one is stale
    n_tokens: int
    keys: list[bytes]  # the chain key of each full block, in order
    size: int  # file bytes
    used: float  # last use (the file's mtime), for LRU eviction


@dataclass
class Snapshot:
    """A verified snapshot: the tokens it holds the KV of, and the executor's bytes."""

    entry: Entry
    tokens: list[int]
    payload: memoryview  # writable: an executor may hand it to C without a copy


def encode(model: str, identity: str, tokens: list[int], keys: list[bytes],
           payload) -> list:
    """A snapshot file's parts: magic, header length, JSON header, the header's digest,
    payload, digest of all."""
    header = json.dumps({"model": model, "identity": identity, "n_tokens": len(tokens),
                         "tokens": tokens, "keys": [k.hex() for k in keys],
                         "payload_bytes": len(payload), "compression": "none"}).encode()
    head = MAGIC + struct.pack("<I", len(header)) + header
    head += hashlib.blake2b(head, digest_size=HEAD_DIGEST_BYTES).digest()
    digest = hashlib.sha256(head)
    digest.update(payload)
    return [head, payload, digest.digest()]


def _read_header(f) -> dict:
    """The JSON header at the start of an open snapshot file; ValueError if it is not one
    (NotOurs if it does not even start with the magic). `_head` holds its bytes."""
    start = f.read(len(MAGIC) + 4)
    if len(start) < len(MAGIC) or start[:len(MAGIC)] != MAGIC:
        raise NotOurs("not a KV snapshot")
    if len(start) < len(MAGIC) + 4:
        raise ValueError("truncated header")
    (length,) = struct.unpack("<I", start[len(MAGIC):])
    if length > MAX_HEADER_BYTES:
        raise ValueError("header too large")
    raw = f.read(length + HEAD_DIGEST_BYTES)
    if len(raw) != length + HEAD_DIGEST_BYTES:
        raise ValueError("truncated header")
    raw, digest = raw[:length], raw[length:]
    if hashlib.blake2b(start + raw, digest_size=HEAD_DIGEST_BYTES).digest() != digest:
        raise ValueError("damaged header")
    header = json.loads(raw)
    if not isinstance(header, dict) or header.get("compression") != "none":
        raise ValueError("unknown header")
    header["_head"] = start + raw + digest
    return header


class NotOurs(ValueError):
    """A file this store did not write: never removed."""


class KVSnapshotStore:
    """The snapshot folder and its in-memory index. Lookups and loads run on the caller's
    thread; put() queues the write for the writer thread. Thread-safe. Only files it wrote
    (named as it names them, starting with its magic) are ever removed; anything else in
    the folder is left alone and noted; a folder that is a symbolic link is not used."""

    def __init__(self, folder: Path | None = None, budget: int = DEFAULT_BUDGET) -> None:
        self.folder = OwnFolder(Path(folder) if folder is not None else snapshot_dir())
        self.budget = budget
        self.removed_bad = 0  # damaged, truncated or stale files removed so far
        self.evicted = 0  # files evicted for the budget
        self.notes: list[str] = []  # one line per file left alone, or a folder not usable
        self.unfinished: dict[str, int] = {}  # temporary files of writes in progress: bytes
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._by_key: dict[bytes, set[str]] = {}
        self._total = 0  # bytes of the indexed files
        self._pending = 0  # bytes queued for writing (host-side copies)
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self.write_gate = threading.Lock()  # held by the writer while it writes (tests pause it)
        self.usable = True  # False: the folder is a link or not a folder; nothing is saved
        self._scan()

    @property
    def path(self) -> Path:
        return self.folder.path

    # ---- index ---------------------------------------------------------------------

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def _scan(self) -> None:
        problem = self.folder.problem()
        if problem is not None:
            self.usable = False
            self._note(f"{self.path}: {problem}; KV snapshots are off")
            return
        try:
            listing = self.folder.entries()
        except OSError as e:
            self.usable = False
            self._note(f"{self.path}: cannot read it ({e.strerror or e}); KV snapshots are off")
            return
        for name, st in listing:
            if TEMPORARY.match(name):
                self._temporary(name, st)
            elif name.endswith(SUFFIX):
                self._index(name, st)

    def _temporary(self, name: str, st: os.stat_result) -> None:
        """A write in progress, or one a process never finished: removed once its writer
        is gone or it is an hour old."""
        if not stat.S_ISREG(st.st_mode):
            return
        pid = writer_pid(name)
        dead = pid is not None and pid != os.getpid() and not process_alive(pid)
        if dead or time.time() - st.st_mtime > STALE_TMP_S:
            if self._remove(name, allow_empty=True):
                return
        self.unfinished[name] = st.st_size

    def _index(self, name: str, st: os.stat_result) -> None:
        if not stat.S_ISREG(st.st_mode):
            kind = "a symbolic link" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            self._note(f"{self.path / name}: {kind}, left alone")
            return
        if not NAME.match(name):
            self._note(f"{self.path / name}: not a KV snapshot, left alone")
            return
        try:
            with self.folder.open_regular(name) as f:
                header = _read_header(f)
            entry = Entry(name[:-len(SUFFIX)], str(header["model"]), str(header["identity"]),
                          int(header["n_tokens"]), [bytes.fromhex(k) for k in header["keys"]],
                          st.st_size, st.st_mtime)
        except NotOurs:
            self._note(f"{self.path / name}: not a KV snapshot, left alone")
            return
        except (ValueError, KeyError, TypeError, OverflowError):
            self._remove(name, bad=True)
            return
        except OSError as e:
            self._note(f"{self.path / name}: cannot read it ({e.strerror or e}), left alone")
            return
        self._add(entry)

    def _add(self, entry: Entry) -> None:
        self._entries[entry.name] = entry
        self._total += entry.size
        for key in entry.keys:
            self._by_key.setdefault(key, set()).add(entry.name)

    def _drop(self, name: str) -> None:
        entry = self._entries.pop(name, None)
        if entry is None:
            return
        self._total -= entry.size
        for key in entry.keys:
            names = self._by_key.get(key)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_key[key]

    def _unlink(self, name: str, *, bad: bool = False) -> None:
        """Forget the snapshot and remove its file (if it still is one of ours)."""
        self._drop(name)
        if self._remove(f"{name}{SUFFIX}") and bad:
            self.removed_bad += 1

    def _remove(self, filename: str, *, bad: bool = False, allow_empty: bool = False) -> bool:
        """Remove a file of the folder if it is a regular file that starts with the magic
        (allow_empty: or is empty, a temporary file just created); True if it is gone."""
        try:
            with self.folder.open_regular(filename) as f:
                size = os.fstat(f.fileno()).st_size
                ours = f.read(len(MAGIC)) == MAGIC or (allow_empty and size == 0)
            if not ours:
                self._note(f"{self.path / filename}: not a KV snapshot, left alone")
                return False
            self.folder.unlink(filename)
        except FileNotFoundError:
            return True
        except OSError as e:
            self._note(f"{self.path / filename}: cannot remove it ({e.strerror or e})")
            return False
        if bad:
            self.removed_bad += 1
        return True

    def sync(self) -> None:
        """Forget snapshots whose files are gone (another process cleared the folder)."""
        try:
            present = {name for name, _ in self.folder.entries()}
        except OSError:
            return
        with self._lock:
            for name in [n for n in self._entries if f"{n}{SUFFIX}" not in present]:
                self._drop(name)
            self.unfinished = {n: b for n, b in self.unfinished.items() if n in present}

    def entries(self) -> list[Entry]:
        """Every indexed snapshot, least recently used first."""
        with self._lock:
            return sorted(self._entries.values(), key=lambda e: e.used)

    def total_bytes(self) -> int:
        return self._total

    @property
    def pending_bytes(self) -> int:
        """Bytes of snapshots captured but not yet written (held in RAM)."""
        return self._pending

    def longest(self, model: str, identity: str, keys: list[bytes]) -> tuple[Entry, int] | None:
        """The snapshot of `model` sharing most leading block keys with `keys`, and how many
        it shares; snapshots of the same model file with another identity are stale: removed."""
        with self._lock:
            for n in range(len(keys), 0, -1):
                for name in sorted(self._by_key.get(keys[n - 1], ())):
                    entry = self._entries[name]
                    if entry.model != model:
                        continue
                    if entry.identity != identity:
                        self._unlink(name, bad=True)
                        continue
                    if entry.keys[:n] == keys[:n]:
                        return entry, n
        return None

    # ---- reading -------------------------------------------------------------------

    def load(self, entry: Entry) -> Snapshot | None:
        """The snapshot, its size checked against its header before anything large is read
        and its digest verified while reading; None (and the file removed) if it is
        damaged, truncated, larger than the budget or no longer what the index says."""
        try:
            with self.folder.open_regular(f"{entry.name}{SUFFIX}") as f:
                snapshot = self._read(entry, f, os.fstat(f.fileno()).st_size)
        except FileNotFoundError:
            snapshot = None
        except (OSError, ValueError, KeyError, TypeError, OverflowError, MemoryError):
            snapshot = None  # anything that fails to load is damaged: prefill instead
        if snapshot is None:
            with self._lock:
                self._unlink(entry.name, bad=True)
            return None
        self.touch(entry)
        return snapshot

    def _read(self, entry: Entry, f, size: int) -> Snapshot | None:
        header = _read_header(f)
        head = header["_head"]
        payload_bytes = int(header["payload_bytes"])
        tokens = [int(t) for t in header["tokens"]]
        if (size != len(head) + payload_bytes + DIGEST_BYTES or payload_bytes > self.budget
                or header["model"] != entry.model or header["identity"] != entry.identity
                or len(tokens) != entry.n_tokens
                or [bytes.fromhex(k) for k in header["keys"]] != entry.keys):
            return None
        digest = hashlib.sha256(head)
        payload = bytearray(payload_bytes)
        view = memoryview(payload)
        done = 0
        while done < payload_bytes:
            n = f.readinto(view[done:done + READ_CHUNK])
            if not n:
                return None
            digest.update(view[done:done + n])
            done += n
        if f.read(DIGEST_BYTES + 1) != digest.digest():
            return None
        return Snapshot(entry, tokens, view)

    def discard(self, entry: Entry) -> None:
        """Remove a snapshot found damaged after it loaded (an executor refused it)."""
        with self._lock:
            self._unlink(entry.name, bad=True)

    def touch(self, entry: Entry) -> None:
        """Mark the snapshot used now (LRU order survives restarts: the file's mtime)."""
        entry.used = time.time()
        try:
            self.folder.touch(f"{entry.name}{SUFFIX}", entry.used)
        except OSError:
            pass

    # ---- writing -------------------------------------------------------------------

    def put(self, model: str, identity: str, tokens: list[int], keys: list[bytes],
            payload) -> bool:
        """Queue a snapshot for the writer thread; False (nothing queued) if it could not
        fit the budget, the copies waiting to be written would pass it, or the folder is
        not usable."""
        size = len(payload) + 4096 + 12 * len(tokens)
        with self._lock:
            if not self.usable or size > self.budget or self._pending + size > self.budget:
                return False
            self._pending += size
            if self._writer is None or not self._writer.is_alive():
                self._writer = threading.Thread(target=self._write_loop, name="kv-snapshots",
                                                daemon=True)
                self._writer.start()
        self._queue.put((model, identity, list(tokens), list(keys), payload, size))
        return True

    def flush(self) -> None:
        """Wait until every queued snapshot is written."""
        self._queue.join()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            try:
                with self.write_gate:
                    self._write(*item[:5])
            except OSError as e:  # a full or read-only disk: the snapshot is lost, nothing else
                self._note(f"{self.path}: a snapshot could not be written ({e.strerror or e})")
            finally:
                with self._lock:
                    self._pending -= item[5]
                self._queue.task_done()

    def _write(self, model: str, identity: str, tokens: list[int], keys: list[bytes],
               payload) -> None:
        parts = encode(model, identity, tokens, keys, payload)
        name = hashlib.blake2b(identity.encode() + b"".join(keys), digest_size=16).hexdigest()
        st = self.folder.write_atomic(f"{name}{SUFFIX}", parts)
        entry = Entry(name, model, identity, len(tokens), keys, st.st_size, st.st_mtime)
        with self._lock:
            self._drop(name)
            for other in list(self._entries.values()):  # a prefix of this one: redundant
                if (other.model == model and other.identity == identity
                        and other.keys == keys[:len(other.keys)]):
                    self._unlink(other.name)
            self._add(entry)
            self._evict()

    def _evict(self) -> None:
        """Remove least recently used snapshots until the folder fits the budget."""
        for entry in sorted(self._entries.values(), key=lambda e: e.used):
            if self._total <= self.budget:
                break
            self._unlink(entry.name)
            self.evicted += 1

    def clear(self) -> int:
        """Remove every snapshot and every unfinished write left by a process that is gone;
        the bytes freed."""
        self.flush()
        with self._lock:
            freed = sum(e.size for e in self._entries.values())
            for name in list(self._entries):
                self._unlink(name)
            for name, size in list(self.unfinished.items()):
                pid = writer_pid(name)
                if (pid is None or pid == os.getpid() or not process_alive(pid)) and \
                        self._remove(name, allow_empty=True):
                    del self.unfinished[name]
                    freed += size
        return freed
