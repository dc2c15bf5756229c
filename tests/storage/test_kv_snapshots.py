"""The KV snapshot store on its own (no model): any damaged byte, a truncated file and a
stale identity make a snapshot disappear instead of loading; the budget holds under churn
with least-recently-used eviction; writes happen on the writer thread."""

from __future__ import annotations

import hashlib
import random

import pytest

from localchat.storage.kv_snapshots import MAGIC, SUFFIX, KVSnapshotStore

MODEL, IDENTITY = "/models/a.gguf", "llama.cpp|1000|1|q8_0/f16"


def keys_of(tokens: list[int]) -> list[bytes]:
    """A stand-in chain of block keys (16-token blocks), each naming its whole prefix."""
    return [hashlib.blake2b(repr(tokens[:16 * (i + 1)]).encode(), digest_size=16).digest()
            for i in range(len(tokens) // 16)]


def put(store: KVSnapshotStore, tokens: list[int], payload: bytes | None = None,
        model: str = MODEL, identity: str = IDENTITY) -> None:
    payload = payload if payload is not None else bytes(random.Random(len(tokens)).randbytes(1000))
    assert store.put(model, identity, tokens, keys_of(tokens), payload)
    store.flush()


def lookup(store: KVSnapshotStore, tokens: list[int], model: str = MODEL,
           identity: str = IDENTITY):
    """The loaded snapshot for `tokens`, or None."""
    found = store.longest(model, identity, keys_of(tokens))
    return None if found is None else store.load(found[0])


def files(folder) -> list:
    return sorted(folder.glob(f"*{SUFFIX}"))


def test_a_snapshot_loads_back_exactly_after_a_restart(tmp_path):
    tokens = list(range(64))
    put(KVSnapshotStore(tmp_path), tokens, b"kv bytes" * 100)
    snapshot = lookup(KVSnapshotStore(tmp_path), tokens + [7, 8, 9])
    assert snapshot.tokens == tokens and snapshot.payload == b"kv bytes" * 100


def test_a_flipped_bit_anywhere_in_the_file_is_detected_and_the_file_removed(tmp_path):
    tokens = list(range(48))
    put(KVSnapshotStore(tmp_path), tokens)
    (path,) = files(tmp_path)
    original = path.read_bytes()
    for offset in range(0, len(original), 5):  # header, payload and digest alike
        damaged = bytearray(original)
        damaged[offset] ^= 1 << (offset % 8)
        path.write_bytes(bytes(damaged))
        store = KVSnapshotStore(tmp_path)
        assert lookup(store, tokens) is None, offset
        assert store.entries() == [], offset
        if offset < len(MAGIC):  # no longer starts as the store's files do: left alone
            assert files(tmp_path) == [path] and "not a KV snapshot" in store.notes[0], offset
        else:
            assert files(tmp_path) == [], offset
    path.write_bytes(original)  # the undamaged file still loads: the test can tell
    assert lookup(KVSnapshotStore(tmp_path), tokens).tokens == tokens


@pytest.mark.parametrize("keep", [0, 6, 11, 200, -33, -1])
def test_a_truncated_file_is_ignored_and_removed(tmp_path, keep):
    tokens = list(range(32))
    put(KVSnapshotStore(tmp_path), tokens)
    (path,) = files(tmp_path)
    path.write_bytes(path.read_bytes()[:keep])
    assert lookup(KVSnapshotStore(tmp_path), tokens) is None
    # shorter than the magic: it cannot be told from a file someone else wrote
    assert files(tmp_path) == ([path] if 0 <= keep < len(MAGIC) else [])


def test_a_snapshot_of_another_version_of_the_model_is_removed_other_models_kept(tmp_path):
    tokens = list(range(32))
    store = KVSnapshotStore(tmp_path)
    put(store, tokens, model=MODEL, identity="llama.cpp|1000|1|q8_0/f16")
    put(store, tokens, model="/models/b.gguf", identity="llama.cpp|2000|1|q8_0/f16")
    assert len(files(tmp_path)) == 2
    # the same file changed (another mtime): its snapshot is stale
    assert lookup(store, tokens, identity="llama.cpp|1000|2|q8_0/f16") is None
    assert [e.model for e in store.entries()] == ["/models/b.gguf"] and len(files(tmp_path)) == 1
    assert lookup(store, tokens, model="/models/b.gguf",
                  identity="llama.cpp|2000|1|q8_0/f16").tokens == tokens


def test_a_longer_conversation_replaces_its_own_prefix(tmp_path):
    store = KVSnapshotStore(tmp_path)
    put(store, list(range(32)))
    put(store, list(range(64)))
    assert [e.n_tokens for e in store.entries()] == [64] and len(files(tmp_path)) == 1
    assert lookup(store, list(range(40))).tokens == list(range(64))  # it serves the prefix


def test_the_budget_holds_under_a_churn_of_200_conversations(tmp_path):
    store = KVSnapshotStore(tmp_path, budget=12 * 3000)
    rng = random.Random(0)
    conversations = [[rng.randrange(50000) for _ in range(32)] for _ in range(200)]
    put(store, conversations[0])
    kept_warm = conversations[0]
    for i, tokens in enumerate(conversations[1:], 1):
        put(store, tokens, rng.randbytes(2000))
        if i % 3 == 0:  # the user keeps reopening the first conversation
            assert lookup(store, kept_warm) is not None, i
        on_disk = sum(p.stat().st_size for p in tmp_path.iterdir())
        assert store.total_bytes() == on_disk <= store.budget, i
    assert store.evicted > 150
    names = {e.n_tokens for e in store.entries()}
    assert names == {32} and len(store.entries()) >= 10  # the budget is used, not only held
    assert lookup(store, conversations[-1]) is not None  # the newest stay
    assert lookup(store, conversations[1]) is None  # the oldest went
    assert lookup(store, kept_warm) is not None  # recency, not age, decides


def test_writes_happen_on_the_writer_thread_and_put_does_not_wait(tmp_path):
    store = KVSnapshotStore(tmp_path)
    with store.write_gate:  # the writer is stuck: put still returns at once
        assert store.put(MODEL, IDENTITY, list(range(32)), keys_of(list(range(32))), b"x" * 500)
        assert files(tmp_path) == [] and store.pending_bytes > 0
    store.flush()
    assert len(files(tmp_path)) == 1 and store.pending_bytes == 0


def test_a_snapshot_larger_than_the_budget_is_not_queued(tmp_path):
    store = KVSnapshotStore(tmp_path, budget=10_000)
    assert not store.put(MODEL, IDENTITY, list(range(32)), keys_of(list(range(32))), b"x" * 20_000)
    store.flush()
    assert files(tmp_path) == []


def test_clear_removes_every_snapshot(tmp_path):
    store = KVSnapshotStore(tmp_path)
    put(store, list(range(32)))
    put(store, list(range(100, 132)))
    assert store.clear() > 0 and files(tmp_path) == [] and store.total_bytes() == 0


def test_a_write_a_process_never_finished_is_removed_once_its_writer_is_gone_or_it_is_old(tmp_path):
    import os
    import time

    put(KVSnapshotStore(tmp_path), list(range(32)))
    name = "0123456789abcdef0123456789abcdef.kv"
    old = tmp_path / f".{name}.1.aaaa.tmp"  # pid 1 lives, but an hour is too long
    dead = tmp_path / f".{name}.999999999.bbbb.tmp"  # no such process: killed mid-write
    live = tmp_path / f".{name}.1.cccc.tmp"  # a write in progress elsewhere
    stranger = tmp_path / f".{name}.999999999.dddd.tmp"  # named so, but not our bytes
    for path in (old, dead, live):
        path.write_bytes(MAGIC + b"half a snapshot")
    stranger.write_bytes(b"someone else's")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    store = KVSnapshotStore(tmp_path)
    assert not old.exists() and not dead.exists() and live.exists() and stranger.exists()
    assert len(store.entries()) == 1
    assert store.unfinished == {live.name: live.stat().st_size,
                                stranger.name: stranger.stat().st_size}
