"""Text files put into a conversation (`/attach PATH`, `localchat run --attach FILE`): read as
UTF-8 text, binaries refused, and turned into one user turn that names the file. The turn
is stored as text, so a reopened conversation needs no file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localchat.errors import UsageError

MAX_ATTACHMENT_BYTES = 4 * 1024 * 1024  # the chat template's output limit is 4 MiB of text
_SNIFF_BYTES = 8192


@dataclass(frozen=True)
class Attachment:
    name: str
    text: str

    def as_message(self) -> str:
        """The user turn the model sees: the file's name, then its text fenced."""
        fence = "````" if "```" in self.text else "```"
        return f"File {self.name}:\n{fence}\n{self.text.rstrip()}\n{fence}"


def read_attachment(path: str | Path) -> Attachment:
    """The file as text; UsageError (one line) for a missing, non-regular, too large,
    binary or non-UTF-8 file."""
    path = Path(path).expanduser()
    if not path.exists():
        raise UsageError(f"cannot attach {path}: no such file")
    if not path.is_file():
        raise UsageError(f"cannot attach {path}: not a regular file")
    size = path.stat().st_size
    if size > MAX_ATTACHMENT_BYTES:
        raise UsageError(f"cannot attach {path}: {size} bytes, more than the "
                         f"{MAX_ATTACHMENT_BYTES // 2**20} MiB a prompt can hold")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UsageError(f"cannot attach {path}: {exc.strerror or exc}") from None
    if b"\0" in data[:_SNIFF_BYTES]:
        raise UsageError(f"cannot attach {path.name}: it is a binary file, not text")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"cannot attach {path.name}: not UTF-8 text") from None
    if not text.strip():
        raise UsageError(f"cannot attach {path.name}: the file is empty")
    return Attachment(path.name, text)
