"""The servers running on this machine, for `localchat ps`: each `serve` writes a small JSON file
(pid, address, model, engine, start time) in the data dir's servers/ folder once it listens, and
removes it at exit; a file whose process is gone is stale and skipped (and removed)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from localchat.atomic import atomic_write_text
from localchat.paths import data_dir


def servers_dir() -> Path:
    return data_dir() / "servers"


def register(url: str, model: str, model_path: str, engine: str, n_ctx: int) -> Path | None:
    """Write this process's state file; None when the data dir is not writable (no error:
    only `ps` misses it)."""
    path = servers_dir() / f"{os.getpid()}.json"
    state = dict(pid=os.getpid(), url=url, model=model, model_path=model_path, engine=engine,
                 context=n_ctx, started=time.time())
    try:
        atomic_write_text(path, json.dumps(state, indent=2) + "\n")
    except OSError:
        return None
    return path


def unregister(path: Path | None) -> None:
    if path is not None:
        path.unlink(missing_ok=True)


def running_servers() -> list[dict]:
    """The state of each live server, oldest first; stale and unreadable files are removed."""
    found = []
    for path in sorted(servers_dir().glob("*.json")) if servers_dir().is_dir() else []:
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
            pid = int(state["pid"])
        except (OSError, ValueError, TypeError, KeyError):
            state, pid = None, 0
        if state is None or path.stem != str(pid) or not _alive(pid):
            path.unlink(missing_ok=True)
            continue
        found.append(state)
    return sorted(found, key=lambda s: s.get("started", 0))


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True
