"""Atomic writes: a regular file is replaced whole; a device or FIFO at the path is written to,
never replaced (as root, `-o /dev/null` had turned /dev/null into a private regular file, and
every later daemon(3) — tmux's server — failed with 'No such device')."""

from __future__ import annotations

import os
import stat
import threading

from localchat.atomic import atomic_write_bytes


def test_a_fifo_at_the_path_receives_the_bytes_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    atomic_write_bytes(fifo, [b"one ", b"two"])
    reader.join(timeout=10)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert got == [b"one two"]


def test_a_regular_file_is_replaced_whole_and_no_temporary_is_left(tmp_path):
    target = tmp_path / "state.json"
    target.write_bytes(b"old contents, longer")
    atomic_write_bytes(target, [b"new"])
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]
