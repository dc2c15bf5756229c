"""A folder of files this program writes, used without trusting it: the folder and its entries
are never followed through a symbolic link, only regular files are opened (non-blocking: a
FIFO never hangs a read), and every operation goes through a descriptor of the folder
opened with O_NOFOLLOW, so a path swapped under us cannot send a write or an unlink
elsewhere. Writes are atomic (a temporary file named after the writer's pid, renamed)."""

from __future__ import annotations

import errno
import os
import secrets
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
DIRECTORY = getattr(os, "O_DIRECTORY", 0)
NONBLOCK = getattr(os, "O_NONBLOCK", 0)
CLOEXEC = getattr(os, "O_CLOEXEC", 0)
DIR_FD = os.open in os.supports_dir_fd and os.unlink in os.supports_dir_fd


class FolderError(OSError):
    """The folder cannot be used (a symbolic link, not a folder, unreadable)."""


class OwnFolder:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    # ---- the folder itself -----------------------------------------------------------

    def exists(self) -> bool:
        try:
            return stat.S_ISDIR(os.lstat(self.path).st_mode)
        except OSError:
            return False

    def problem(self) -> str | None:
        """Why the folder cannot be used, or None (it is a folder, or not there yet)."""
        try:
            mode = os.lstat(self.path).st_mode
        except FileNotFoundError:
            return None
        except OSError as e:
            return f"cannot read it ({e.strerror or e})"
        if stat.S_ISLNK(mode):
            return "it is a symbolic link (not followed)"
        if not stat.S_ISDIR(mode):
            return "it is not a folder"
        return None

    @contextmanager
    def _dir(self, create: bool = False) -> Iterator[int]:
        """A descriptor of the folder, never through a link; FolderError if it cannot be."""
        if create and not self.exists() and self.problem() is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                os.mkdir(self.path, 0o700)
            except FileExistsError:
                pass
        try:
            fd = os.open(self.path, os.O_RDONLY | DIRECTORY | NOFOLLOW | CLOEXEC)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                raise FolderError(e.errno, self.problem() or "not a folder") from None
            raise
        try:
            if not stat.S_ISDIR(os.fstat(fd).st_mode):
                raise FolderError(errno.ENOTDIR, "it is not a folder")
            yield fd
        finally:
            os.close(fd)

    # ---- entries ---------------------------------------------------------------------

    def entries(self) -> list[tuple[str, os.stat_result]]:
        """(name, lstat) of every entry; [] if the folder is not there."""
        if not self.exists():
            return []
        out = []
        with self._dir() as fd:
            with os.scandir(fd if DIR_FD else self.path) as it:
                for entry in it:
                    try:
                        out.append((entry.name, entry.stat(follow_symlinks=False)))
                    except OSError:
                        continue
        return out

    @contextmanager
    def open_regular(self, name: str) -> Iterator:
        """The named regular file, open for reading (binary); OSError if it is anything else
        (a link, a FIFO, a device, a folder) or cannot be opened."""
        flags = os.O_RDONLY | NOFOLLOW | NONBLOCK | CLOEXEC
        with self._dir() as dir_fd:
            fd = os.open(name, flags, dir_fd=dir_fd) if DIR_FD else \
                os.open(self.path / name, flags)
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise OSError(errno.EINVAL, "not a regular file")
            f = os.fdopen(fd, "rb")
        except BaseException:
            os.close(fd)
            raise
        with f:
            yield f

    def unlink(self, name: str) -> None:
        """Remove the named entry (a link itself, never its target); gone already is fine."""
        try:
            with self._dir() as dir_fd:
                if DIR_FD:
                    os.unlink(name, dir_fd=dir_fd)
                else:
                    os.unlink(self.path / name)
        except FileNotFoundError:
            pass

    def touch(self, name: str, when: float) -> None:
        with self._dir() as dir_fd:
            if DIR_FD and os.utime in os.supports_dir_fd:
                os.utime(name, (when, when), dir_fd=dir_fd, follow_symlinks=False)
            else:
                os.utime(self.path / name, (when, when))

    def write_atomic(self, name: str, parts: Iterable[bytes]) -> os.stat_result:
        """Write the parts to `name` atomically (creating the folder); the new file's stat.
        A temporary `.NAME.PID.RANDOM.tmp` holds the bytes until the rename."""
        tmp = temporary_name(name)
        with self._dir(create=True) as dir_fd:
            opener = (lambda path, flags: os.open(path, flags | NOFOLLOW, 0o600, dir_fd=dir_fd)) \
                if DIR_FD else (lambda path, flags: os.open(self.path / path, flags | NOFOLLOW, 0o600))
            try:
                with open(tmp, "wb", opener=lambda p, f: opener(p, f | os.O_EXCL)) as f:
                    for part in parts:
                        f.write(part)
                    f.flush()
                    os.fsync(f.fileno())
                if DIR_FD:
                    os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                else:
                    os.replace(self.path / tmp, self.path / name)
            except BaseException:
                try:
                    os.unlink(tmp, dir_fd=dir_fd) if DIR_FD else os.unlink(self.path / tmp)
                except OSError:
                    pass
                raise
            try:
                os.fsync(dir_fd)
            except OSError:
                pass
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False) if DIR_FD else \
                os.lstat(self.path / name)


def temporary_name(name: str) -> str:
    return f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def writer_pid(temporary: str) -> int | None:
    """The pid in a temporary name temporary_name() made, or None."""
    parts = temporary.rsplit(".", 3)
    if len(parts) != 4 or parts[3] != "tmp" or not parts[1].isdigit():
        return None
    return int(parts[1])


def process_alive(pid: int) -> bool:
    """Whether a process with this pid runs on this machine (one we may not signal counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
