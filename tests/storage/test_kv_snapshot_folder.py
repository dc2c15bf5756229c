"""The snapshot folder treated as hostile (no model): the store removes only files it wrote,
never follows a symbolic link (the folder or an entry), never opens a FIFO or a folder
named *.kv, reads an inflated file's header before anything large, keeps going on a
read-only disk, and forgets files another process removed."""

from __future__ import annotations

import hashlib
import os
import subprocess
import threading
from pathlib import Path

import pytest

from localchat.cli import main
from localchat.storage.kv_snapshots import MAGIC, SUFFIX, KVSnapshotStore

MODEL, IDENTITY = "/models/a.gguf", "llama.cpp|1000|1|q8_0/f16"
TOKENS = list(range(64))


def keys_of(tokens: list[int]) -> list[bytes]:
    return [hashlib.blake2b(repr(tokens[:16 * (i + 1)]).encode(), digest_size=16).digest()
            for i in range(len(tokens) // 16)]


def saved(folder: Path, payload: bytes = b"kv" * 500) -> Path:
    store = KVSnapshotStore(folder)
    assert store.put(MODEL, IDENTITY, TOKENS, keys_of(TOKENS), payload)
    store.flush()
    (path,) = [p for p in folder.glob(f"*{SUFFIX}") if len(p.name) == 35]
    return path


def lookup(store: KVSnapshotStore):
    found = store.longest(MODEL, IDENTITY, keys_of(TOKENS))
    return None if found is None else store.load(found[0])


def in_time(fn, seconds: float = 10.0):
    """fn's result, failing the test (not hanging it) if it takes longer than `seconds`."""
    result: list = []
    thread = threading.Thread(target=lambda: result.append(fn()), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "hung"
    return result[0]


def test_a_kv_folder_that_is_a_symbolic_link_is_not_followed(tmp_path, capsys):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "app.kv").write_bytes(b"someone's data")
    saved(elsewhere)  # even a real snapshot there is not ours to touch through the link
    home = Path(os.environ["LOCALCHAT_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "kv").symlink_to(elsewhere)
    before = sorted((p.name, p.read_bytes()) for p in elsewhere.iterdir())
    assert main(["cache", "ls"]) == 0
    captured = capsys.readouterr()
    assert "symbolic link" in captured.err and "KV snapshots are off" in captured.err
    assert main(["cache", "clear"]) == 0
    store = KVSnapshotStore(home / "kv")
    assert not store.put(MODEL, IDENTITY, TOKENS, keys_of(TOKENS), b"x" * 100)
    assert sorted((p.name, p.read_bytes()) for p in elsewhere.iterdir()) == before


def test_files_the_store_did_not_write_are_left_alone_with_a_note(tmp_path, capsys):
    folder = tmp_path / "kv"
    saved(folder)
    foreign = {"app.kv": b"an app's own file",
               "0123456789abcdef0123456789abcdef.kv": b"named like ours, not ours",
               "short.kv": b"LC"}
    for name, data in foreign.items():
        (folder / name).write_bytes(data)
    target = tmp_path / "target.kv"
    target.write_bytes(MAGIC + b"looks like ours, behind a link")
    (folder / "link.kv").symlink_to(target)
    store = KVSnapshotStore(folder)
    assert len(store.entries()) == 1 and lookup(store) is not None
    assert store.clear() > 0
    assert {p.name for p in folder.iterdir()} == set(foreign) | {"link.kv"}
    assert all((folder / n).read_bytes() == d for n, d in foreign.items())
    assert target.read_bytes().startswith(MAGIC)
    notes = " ".join(store.notes)
    assert "app.kv: not a KV snapshot, left alone" in notes and "link.kv: a symbolic link" in notes


def test_a_fifo_named_like_a_snapshot_hangs_nothing(tmp_path, capsys, monkeypatch):
    folder = Path(os.environ["LOCALCHAT_HOME"]) / "kv"
    saved(folder)
    fifo = folder / "0123456789abcdef0123456789abcdef.kv"
    os.mkfifo(fifo)
    store = in_time(lambda: KVSnapshotStore(folder))
    assert len(store.entries()) == 1 and "not a regular file" in " ".join(store.notes)
    assert in_time(lambda: main(["cache", "ls"])) == 0
    assert "1 snapshot(s)" in capsys.readouterr().out
    assert in_time(lambda: main(["cache", "clear"])) == 0
    assert fifo.exists() and [p.name for p in folder.iterdir()] == [fifo.name]


def test_a_folder_named_like_a_snapshot_is_one_note(tmp_path, capsys):
    folder = Path(os.environ["LOCALCHAT_HOME"]) / "kv"
    saved(folder)
    (folder / "0123456789abcdef0123456789abcdef.kv").mkdir()
    assert main(["cache", "ls"]) == 0
    captured = capsys.readouterr()
    assert "1 snapshot(s)" in captured.out and "not a regular file, left alone" in captured.err
    assert "Traceback" not in captured.err


def test_an_inflated_snapshot_is_refused_by_its_header_and_removed(tmp_path):
    path = saved(tmp_path)
    with path.open("r+b") as f:  # what `truncate -s +40G` does: sparse, header still valid
        f.truncate(path.stat().st_size + (40 << 30))
    store = KVSnapshotStore(tmp_path)
    assert len(store.entries()) == 1  # its header reads
    assert lookup(store) is None  # but the size is not what the header says
    assert not path.exists() and store.entries() == [] and store.removed_bad == 1


def test_a_snapshot_whose_payload_passes_the_budget_is_not_read(tmp_path):
    path = saved(tmp_path, b"x" * 50_000)
    store = KVSnapshotStore(tmp_path, budget=10_000)  # the user lowered --kv-disk
    assert lookup(store) is None and not path.exists()


def test_snapshots_removed_by_another_process_are_forgotten(tmp_path):
    saved(tmp_path)
    store = KVSnapshotStore(tmp_path)
    assert store.total_bytes() > 0
    KVSnapshotStore(tmp_path).clear()  # `localchat cache clear` while the server runs
    store.sync()
    assert store.total_bytes() == 0 and store.entries() == []


def test_cache_ls_shows_and_counts_unfinished_writes(capsys):
    folder = Path(os.environ["LOCALCHAT_HOME"]) / "kv"
    saved(folder)
    (folder / ".0123456789abcdef0123456789abcdef.kv.1.abcd.tmp").write_bytes(MAGIC + b"x" * 3000)
    assert main(["cache", "ls"]) == 0
    out = capsys.readouterr().out
    assert "1 snapshot(s)" in out and "1 unfinished write(s), 2.9 KiB" in out


@pytest.fixture
def read_only_home(tmp_path, monkeypatch):
    """A data dir on a real read-only filesystem (a tmpfs remounted read-only)."""
    mount = tmp_path / "ro"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)],
                      capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.subprocess
def test_a_bad_snapshot_on_a_read_only_disk_is_one_note(read_only_home, capsys, monkeypatch):
    folder = read_only_home / "kv"
    path = saved(folder)
    data = bytearray(path.read_bytes())
    data[-1] ^= 1  # damaged digest
    path.write_bytes(bytes(data))
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_home)], check=True)
    monkeypatch.setenv("LOCALCHAT_HOME", str(read_only_home))
    store = KVSnapshotStore(folder)
    assert lookup(store) is None  # not loaded, and the failed removal is a note
    assert "cannot remove it" in " ".join(store.notes) and path.exists()
    assert main(["cache", "ls"]) == 0 and main(["cache", "clear"]) == 0
    assert "Traceback" not in capsys.readouterr().err
