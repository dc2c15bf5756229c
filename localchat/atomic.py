"""Write small state files atomically (a temporary file in the same folder, fsynced, renamed over
the target): readers see the old content or the new, never a mix. read_json_dict reads one
back without trusting it."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator


def read_json_dict(path: str | Path, max_bytes: int) -> dict:
    """The JSON object in `path`, or {} where it is missing, not a regular file (a FIFO, a
    device), larger than max_bytes or not a JSON object; never follows a link."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return {}
        try:
            data = json.loads(f.read(max_bytes + 1))
        except (ValueError, OSError):
            return {}
    return data if isinstance(data, dict) else {}


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace `path` with `text` (UTF-8) atomically, creating its folder if needed."""
    atomic_write_bytes(path, [text.encode("utf-8")])


def atomic_write_bytes(path: str | Path, parts: Iterable[bytes]) -> None:
    """Replace `path` with the parts written one after another, atomically, creating its
    folder if needed (large contents need not be joined in memory first); a device or FIFO
    already there (`-o /dev/null`) is written to, never replaced."""
    path = Path(path)
    if path.exists() and not path.is_file():  # /dev/null, /dev/stdout, a FIFO: written through
        with open(path, "wb") as f:  # (replacing one would put a file where the device was)
            for part in parts:
                f.write(part)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(path.parent)


def fsync_dir(folder: Path) -> None:
    """Make the rename itself durable where the OS allows it (not on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def atomic_directory(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder beside `path`; on success it is renamed to `path`, which
    must not exist or be empty; on failure it is removed. Readers never see half a folder."""
    path = Path(path)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise FileExistsError(f"{path} already exists")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; a model folder is not secret
        yield tmp
        if path.exists():
            path.rmdir()
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fsync_dir(path.parent)
