"""Never destroy data: where a conversion may write, and how it writes.

An output that is the input (by name, symlink or hardlink: the same st_dev/st_ino) is
refused before anything is opened for writing; an existing output is replaced only when
asked. Files are written to a temporary name in the output's folder and renamed into
place only when complete, so an error, Ctrl+C or a full disk leaves no partial file.
"""

from __future__ import annotations

import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from localchat.atomic import _fsync_dir
from localchat.errors import LocalchatError, UsageError


class OutputError(LocalchatError):
    """Writing the output failed (disk full, permissions): nothing was left behind."""


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
        os.chmod(tmp, 0o644)  # mkstemp makes it private; a model file is not secret
        os.replace(tmp, out)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OutputError(f"cannot write {out}: {e.strerror or e}; nothing was written") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(out.parent)
