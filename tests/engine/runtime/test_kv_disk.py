"""KV snapshots through the real engines (bundled model): after a restart, a conversation's
prefix (or a sibling branch's shared part) is restored from disk instead of prefilled, and
greedy output is identical to a cold prefill's; a damaged snapshot is removed and the
prompt prefilled, with identical output; the write happens on the store's writer thread."""

from __future__ import annotations

from pathlib import Path

import pytest

from localchat.engine import EngineConfig, open_engine
from localchat.engine.base import Request, SamplingParams
from localchat.engine.runtime import kv_disk
from localchat.engine.runtime.compute_thread import COMPUTE
from localchat.storage.kv_snapshots import SUFFIX, snapshot_dir

pytestmark = pytest.mark.model  # loads the bundled model

DOCS = Path(__file__).resolve().parents[3] / "docs"
MIN_TOKENS = 64  # above the product's one block, so the tests below have prompts on each side


@pytest.fixture(autouse=True)
def short_snapshots(monkeypatch):
    monkeypatch.setattr(kv_disk, "MIN_TOKENS", MIN_TOKENS)


def load(kind: str, kv_disk: int | None = None, exact: bool = False):
    """exact: llama.cpp's exact batching, whose attention rounds alike for a whole prompt
    and for the few rows after a restored prefix (its default f16 cache does not)."""
    extra = {"kv_memory": 2048 * 23040} if kind == "torch" else {"exact_batching": exact}
    return open_engine(EngineConfig("default", engine=kind, threads=2, ctx_size=1024,
                                    kv_disk=kv_disk, **extra))


def reply(engine, tokens: list[int]):
    return engine.complete(Request(prompt_tokens=tokens, sampling=SamplingParams(temperature=0),
                                   max_tokens=12))


def prompts(engine) -> dict[str, list[int]]:
    """A shared 80-token start (5 blocks) with two 90-token continuations, and an unrelated
    130-token prompt: each saved or restored stretch is over MIN_TOKENS."""
    text = engine.tokenize_text((DOCS / "architecture.md").read_text(encoding="utf-8"))
    other = engine.tokenize_text((DOCS / "reliability.md").read_text(encoding="utf-8"))
    shared = text[:80]
    return {"a": shared + text[80:170], "b": shared + text[1000:1090], "other": other[:130]}


@pytest.mark.parametrize("kind", ["llama.cpp", pytest.param("torch", marks=pytest.mark.slow)])
def test_restart_restores_from_disk_with_output_identical_to_a_cold_prefill(kind):
    cold = load(kind, kv_disk=0, exact=True)  # the reference: no snapshots at all
    try:
        p = prompts(cold)
        want = {name: reply(cold, tokens).text for name, tokens in p.items()}
    finally:
        cold.close()
    first = load(kind, exact=True)
    try:
        for name in ("a", "other"):
            result = reply(first, p[name])
            assert result.stats.restored_tokens == 0 and result.text == want[name]
    finally:
        first.close()  # flushes the writer: both snapshots are on disk
    snapshots = {f.stat().st_size: f for f in snapshot_dir().glob(f"*{SUFFIX}")}
    assert len(snapshots) == 2
    damaged = min(snapshots.items())[1]  # "other"'s (128 tokens, the smaller one)
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x10
    damaged.write_bytes(bytes(data))

    second = load(kind, exact=True)
    try:
        sibling = reply(second, p["b"])  # shares 80 tokens (5 blocks) with a's snapshot
        assert sibling.stats.restored_tokens == 80 and sibling.text == want["b"]
        assert sibling.stats.cached_tokens == 80 and sibling.stats.restore_s > 0
        result = reply(second, p["a"])  # all its full blocks, 80 of them in memory now
        assert result.stats.cached_tokens == 160 and result.stats.restored_tokens == 160 - 80
        assert result.text == want["a"]
        result = reply(second, p["other"])  # the damaged one: prefilled, identical
        assert result.stats.restored_tokens == 0 and result.text == want["other"]
        assert not damaged.exists()
        assert second.memory()["kv_disk_bytes"] > 0
    finally:
        second.close()


def test_the_snapshot_is_written_by_the_writer_thread_not_the_reply():
    first = load("llama.cpp")
    try:
        tokens = prompts(first)["a"]
        store = first.disk.store
        with store.write_gate:  # the writer cannot write: the reply must still finish
            result = reply(first, tokens)
            assert result.finish_reason == "length"
            COMPUTE.call(lambda: None)  # the step that ended the reply is over: captured
            assert store.entries() == [] and store.pending_bytes > 0
        store.flush()
        assert [e.n_tokens for e in store.entries()] == [(len(tokens) + 11) // 16 * 16]
    finally:
        first.close()


def test_an_inflated_snapshot_is_prefilled_instead_and_removed():
    """A valid snapshot grown to 40 GB (sparse; its header still valid) once failed every
    request with its prefix: load() allocated the file's size before checking it."""
    first = load("llama.cpp")
    try:
        tokens = prompts(first)["a"]
        want = reply(first, tokens).text
    finally:
        first.close()
    (path,) = snapshot_dir().glob(f"*{SUFFIX}")
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size + (40 << 30))
    second = load("llama.cpp")
    try:
        result = reply(second, tokens)
        assert result.text == want and result.stats.restored_tokens == 0
        assert not path.exists()
    finally:
        second.close()


def test_the_disk_figure_follows_another_process_clearing_the_folder():
    from localchat.storage.kv_snapshots import KVSnapshotStore

    engine = load("llama.cpp")
    try:
        reply(engine, prompts(engine)["a"])
        COMPUTE.call(lambda: None)  # the step that ended the reply has captured its KV
        engine.disk.store.flush()
        assert engine.memory()["kv_disk_bytes"] > 0
        KVSnapshotStore().clear()  # `localchat cache clear` while serving
        assert engine.memory()["kv_disk_bytes"] == 0
    finally:
        engine.close()


def test_each_reply_says_whether_its_kv_was_saved_and_why_not():
    engine = load("llama.cpp")
    try:
        short = engine.complete(Request(prompt_tokens=engine.tokenize_text("Hi there."),
                                        sampling=SamplingParams(temperature=0), max_tokens=4))
        assert short.stats.kv_saved.startswith(f"not saved: shorter than {MIN_TOKENS} tokens")
        tokens = prompts(engine)["a"]
        long = reply(engine, tokens)  # its computed tokens' full blocks
        assert long.stats.kv_saved == f"saved: {(len(tokens) + 11) // 16 * 16} tokens"
    finally:
        engine.close()
