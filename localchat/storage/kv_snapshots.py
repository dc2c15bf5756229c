"""KV snapshots on disk: one file per saved conversation prefix, found by the chain of its
16-token blocks' keys, valid for one model file and KV identity, checked by a SHA-256
digest over the whole file (twice blake2b's speed here: SHA extensions), written atomically on a background thread, and kept within a
byte budget by evicting the least recently used. A damaged or stale file is removed."""

from __future__ import annotations

import hashlib
import io
import json
import os
import queue
import struct
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from localchat.atomic import atomic_write_bytes
from localchat.paths import data_dir

MAGIC = b"LCKVSNP1"
DIGEST_BYTES = 32
HEAD_DIGEST_BYTES = 16  # the header's own digest: startup reads headers only
SUFFIX = ".kv"
DEFAULT_BUDGET = 2 << 30  # --kv-disk's default: 2 GiB
STALE_TMP_S = 3600  # a temporary file this old is a write a process never finished


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
    """The JSON header at the start of an open snapshot file; ValueError if it is not one."""
    start = f.read(len(MAGIC) + 4)
    if len(start) < len(MAGIC) + 4 or start[:len(MAGIC)] != MAGIC:
        raise ValueError("not a KV snapshot")
    (length,) = struct.unpack("<I", start[len(MAGIC):])
    raw = f.read(length + HEAD_DIGEST_BYTES)
    if len(raw) != length + HEAD_DIGEST_BYTES:
        raise ValueError("truncated header")
    raw, digest = raw[:length], raw[length:]
    if hashlib.blake2b(start + raw, digest_size=HEAD_DIGEST_BYTES).digest() != digest:
        raise ValueError("damaged header")
    header = json.loads(raw)
    if not isinstance(header, dict) or header.get("compression") != "none":
        raise ValueError("unknown header")
    header["_head_bytes"] = len(start) + length + HEAD_DIGEST_BYTES
    return header


class KVSnapshotStore:
    """The snapshot folder and its in-memory index. Lookups and loads run on the caller's
    thread; put() queues the write for the writer thread. Thread-safe."""

    def __init__(self, folder: Path | None = None, budget: int = DEFAULT_BUDGET) -> None:
        self.folder = Path(folder) if folder is not None else snapshot_dir()
        self.budget = budget
        self.removed_bad = 0  # damaged, truncated or stale files removed so far
        self.evicted = 0  # files evicted for the budget
        self._lock = threading.Lock()
        self._entries: dict[str, Entry] = {}
        self._by_key: dict[bytes, set[str]] = {}
        self._total = 0  # bytes of the indexed files
        self._pending = 0  # bytes queued for writing (host-side copies)
        self._queue: queue.Queue = queue.Queue()
        self._writer: threading.Thread | None = None
        self.write_gate = threading.Lock()  # held by the writer while it writes (tests pause it)
        self._scan()

    # ---- index ---------------------------------------------------------------------

    def _scan(self) -> None:
        if not self.folder.is_dir():
            return
        for path in self._temporary_files():
            try:
                if time.time() - path.stat().st_mtime > STALE_TMP_S:
                    path.unlink()
            except OSError:
                pass
        for path in self.folder.glob(f"*{SUFFIX}"):
            try:
                with path.open("rb") as f:
                    header = _read_header(f)
                entry = Entry(path.stem, str(header["model"]), str(header["identity"]),
                              int(header["n_tokens"]), [bytes.fromhex(k) for k in header["keys"]],
                              path.stat().st_size, path.stat().st_mtime)
            except (OSError, ValueError, KeyError, TypeError):
                self._unlink(path.stem, bad=True)
                continue
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
        self._drop(name)
        try:
            (self.folder / f"{name}{SUFFIX}").unlink()
        except FileNotFoundError:
            pass
        if bad:
            self.removed_bad += 1

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
        """The snapshot, its digest verified; None (and the file removed) if it is damaged,
        truncated or no longer what the index says."""
        path = self.folder / f"{entry.name}{SUFFIX}"
        try:
            with path.open("rb") as f:
                data = bytearray(os.fstat(f.fileno()).st_size)
                if f.readinto(data) != len(data):
                    raise OSError("the file changed while it was read")
        except OSError:
            with self._lock:
                self._drop(entry.name)
            return None
        try:
            snapshot = self._parse(entry, data)
        except (ValueError, KeyError, TypeError):
            snapshot = None
        if snapshot is None:
            with self._lock:
                self._unlink(entry.name, bad=True)
            return None
        self.touch(entry)
        return snapshot

    @staticmethod
    def _parse(entry: Entry, data: bytearray) -> Snapshot | None:
        view = memoryview(data)
        if len(data) < DIGEST_BYTES or hashlib.sha256(
                view[:-DIGEST_BYTES]).digest() != data[-DIGEST_BYTES:]:
            return None
        (length,) = struct.unpack_from("<I", view, len(MAGIC))
        header = _read_header(io.BytesIO(view[:len(MAGIC) + 4 + length + HEAD_DIGEST_BYTES]))
        start = header["_head_bytes"]
        payload = view[start:-DIGEST_BYTES]
        tokens = [int(t) for t in header["tokens"]]
        if (len(payload) != header["payload_bytes"] or header["model"] != entry.model
                or header["identity"] != entry.identity or len(tokens) != entry.n_tokens
                or [bytes.fromhex(k) for k in header["keys"]] != entry.keys):
            return None
        return Snapshot(entry, tokens, payload)

    def touch(self, entry: Entry) -> None:
        """Mark the snapshot used now (LRU order survives restarts: the file's mtime)."""
        entry.used = time.time()
        try:
            os.utime(self.folder / f"{entry.name}{SUFFIX}", (entry.used, entry.used))
        except OSError:
            pass

    # ---- writing -------------------------------------------------------------------

    def put(self, model: str, identity: str, tokens: list[int], keys: list[bytes],
            payload) -> bool:
        """Queue a snapshot for the writer thread; False (nothing queued) if it could not
        fit the budget, or the copies waiting to be written would pass it."""
        size = len(payload) + 4096 + 12 * len(tokens)
        with self._lock:
            if size > self.budget or self._pending + size > self.budget:
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
            except OSError:
                pass  # a full or read-only disk: the snapshot is lost, nothing else
            finally:
                with self._lock:
                    self._pending -= item[5]
                self._queue.task_done()

    def _write(self, model: str, identity: str, tokens: list[int], keys: list[bytes],
               payload) -> None:
        parts = encode(model, identity, tokens, keys, payload)
        name = hashlib.blake2b(identity.encode() + b"".join(keys), digest_size=16).hexdigest()
        path = self.folder / f"{name}{SUFFIX}"
        atomic_write_bytes(path, parts)
        stat = path.stat()
        entry = Entry(name, model, identity, len(tokens), keys, stat.st_size, stat.st_mtime)
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
        """Remove every snapshot (stray temporary files too); the bytes freed."""
        self.flush()
        with self._lock:
            freed = sum(e.size for e in self._entries.values())
            for name in list(self._entries):
                self._unlink(name)
        for path in self._temporary_files():
            path.unlink(missing_ok=True)
        return freed

    def _temporary_files(self) -> list[Path]:
        """Files atomic writes left behind (a process ended while writing)."""
        return list(self.folder.glob(f".*{SUFFIX}.*.tmp")) if self.folder.is_dir() else []
