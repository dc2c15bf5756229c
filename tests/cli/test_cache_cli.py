"""The KV snapshot surfaces without a model: `localchat cache ls|clear` over real snapshot
files, --kv-disk parsing, the `restored ... from disk` line and the gauge's cache figure."""

from __future__ import annotations

import json

import pytest

from localchat.cli import main
from localchat.cli.flags import kv_disk_bytes
from localchat.cli.run import format_stats
from localchat.engine.base import Stats
from localchat.errors import UsageError
from localchat.storage.kv_snapshots import KVSnapshotStore, snapshot_dir
from localchat.tui.widgets import format_gauges


def saved(n_tokens: int, payload: int) -> None:
    store = KVSnapshotStore()
    tokens = list(range(n_tokens))
    keys = [bytes([i]) * 16 for i in range(n_tokens // 16)]
    assert store.put("/models/SmolLM2.gguf", "llama.cpp|1|2|q8_0/f16", tokens, keys,
                     b"\1" * payload)
    store.flush()


def test_cache_ls_lists_and_clear_removes_the_snapshots(capsys):
    saved(2944, 50_000)
    assert main(["cache", "ls", "--json"]) == 0
    listing = json.loads(capsys.readouterr().out)
    assert [(s["model"], s["engine"], s["tokens"]) for s in listing["snapshots"]] == [
        ("/models/SmolLM2.gguf", "llama.cpp", 2944)]
    assert listing["total_bytes"] == sum(p.stat().st_size for p in snapshot_dir().iterdir())
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2.gguf" in out and "2,944" in out and "1 snapshot(s)" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 1 KV snapshot(s)" in capsys.readouterr().out
    assert list(snapshot_dir().iterdir()) == []
    assert main(["cache", "ls"]) == 0
    assert "no KV snapshots" in capsys.readouterr().out


@pytest.mark.parametrize("text, want", [(None, None), ("0", 0), ("off", 0), ("1GiB", 1 << 30),
                                        ("512MB", 512_000_000)])
def test_kv_disk_sizes(text, want):
    assert kv_disk_bytes(text) == want


def test_a_bad_kv_disk_size_is_one_clear_error():
    with pytest.raises(UsageError, match="cannot read memory size '12zz'"):
        kv_disk_bytes("12zz")


def test_verbose_stats_and_the_gauge_say_what_came_from_disk():
    stats = Stats(prompt_tokens=3000, cached_tokens=2944, restored_tokens=2944, restore_s=0.1234,
                  kv_cache_capacity_bytes=1 << 26, kv_cache_cached_bytes=3 << 20,
                  kv_disk_bytes=50 << 20, context_capacity=4096)
    assert "restored 2,944 tokens from disk in 0.12 s" in format_stats(stats)
    assert "cache 3.0 MiB + 50.0 MiB disk" in format_gauges(stats, "ready")
    plain = Stats(prompt_tokens=10, kv_cache_capacity_bytes=1 << 26, context_capacity=4096)
    assert "from disk" not in format_stats(plain) and "disk" not in format_gauges(plain, "ready")
