"""Never destroy data: an output that is the input (same inode) is refused, an existing output
is replaced only when asked, and files are written beside the target, then renamed into place."""

from __future__ import annotations

import os
import re
import signal
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from localchat.atomic import fsync_dir
from localchat.errors import LocalchatError, UsageError


class OutputError(LocalchatError):
    """Writing the output failed (disk full, permissions): nothing was left behind."""


class _Terminated(KeyboardInterrupt):
    """Raised by the signal handler: unwinds (and cleans up) exactly as Ctrl+C does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP) if hasattr(signal, "SIGHUP") else (signal.SIGTERM,)


@contextmanager
def stop_signals_clean_up() -> Iterator[None]:
    """Inside, SIGTERM/SIGHUP unwind like Ctrl+C (temporary files removed), then end as a
    one-line OutputError with exit code 128+signal; the old handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame) -> None:
        for s in STOP_SIGNALS:  # a second signal must not cut the clean-up short
            signal.signal(s, signal.SIG_IGN)
        raise _Terminated(signum)

    old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
    try:
        yield
    except _Terminated as t:
        error = OutputError(f"stopped by {signal.Signals(t.signum).name}; "
                            "its temporary files were removed")
        error.exit_code = 128 + t.signum
        raise error from None
    finally:
        for s, h in old.items():
            signal.signal(s, h)


def new_file_mode() -> int:
    """The mode open() gives a new file: 0666 less the process's umask."""
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def save_safetensors(tensors: dict, path: Path) -> None:
    """safetensors' save_file, with its I/O errors (a full disk) raised as OSError and the
    file given new_file_mode() (safetensors writes it private, 0600)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata={"format": "pt"})
    except SafetensorError as e:
        code = re.search(r"\(os error (\d+)\)", str(e))
        if code is None:
            raise
        raise OSError(int(code[1]), os.strerror(int(code[1])), str(path)) from None
    os.chmod(path, new_file_mode())


def check_free_space(out: Path, needed: int) -> None:
    """Refuse, before anything is written, an output that cannot fit in its folder."""
    import shutil

    from localchat.units import human_bytes

    free = shutil.disk_usage(out.parent).free
    if needed > free:
        raise OutputError(f"not enough free space for {out}: it needs at least "
                          f"{human_bytes(needed)} and {human_bytes(free)} is free; "
                          "nothing was written")


def same_file(a: Path, b: Path) -> bool:
    """True when both names reach one file or folder (symlinks followed, hardlinks too)."""
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def check_output(src: Path, out: Path, *, replace: bool = False) -> None:
    """Refuse an output that is, or lies inside, the source, and an existing output
    unless `replace` (a folder output must always be new)."""
    if same_file(src, out):
        raise UsageError(f"output {out} is the input {src}: choose another name")
    if src.is_dir() and out.resolve().is_relative_to(src.resolve()):
        raise UsageError(f"output {out} lies inside the input folder {src}")
    if out.is_dir():
        raise UsageError(f"output {out} is an existing folder: choose a new name")
    if (out.exists() or out.is_symlink()) and not replace:
        raise UsageError(f"output {out} already exists (pass --force to replace it)")
    if not out.parent.is_dir():
        raise UsageError(f"output folder {out.parent} does not exist")


@contextmanager
def atomic_output_file(out: Path) -> Iterator[Path]:
    """Yield a temporary path beside `out`; renamed to `out` when the block completes,
    removed when it raises. OS errors become one-line OutputErrors."""
    fd, name = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, new_file_mode())  # mkstemp makes it private; a model file is not secret
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {out}: {e.strerror or e}; nothing was written") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(out.parent)
