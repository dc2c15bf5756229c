"""Copying text out of the chat: the terminal clipboard (OSC 52, which many terminals,
tmux setups and ssh sessions silently ignore) plus a file in the data dir that always
has the last copied text, so the UI can name a place that surely holds it."""

from __future__ import annotations

import re
from pathlib import Path

from localchat.atomic import atomic_write_text

CLIPBOARD_FILE = "clipboard.txt"
_FENCE = re.compile(r"^(```+|~~~+)[^\n]*\n(.*?)^\1[ \t]*$", re.MULTILINE | re.DOTALL)


def code_blocks(markdown: str) -> list[str]:
    """Fenced code blocks' contents, in order (an unclosed last fence counts too: a
    stopped reply may end inside one)."""
    blocks = [m.group(2) for m in _FENCE.finditer(markdown)]
    rest = _FENCE.sub("", markdown)
    unclosed = re.search(r"^(```+|~~~+)[^\n]*\n(.*)\Z", rest, re.MULTILINE | re.DOTALL)
    if unclosed:
        blocks.append(unclosed.group(2))
    return blocks


def last_code_block(markdown: str) -> str | None:
    blocks = code_blocks(markdown)
    return blocks[-1] if blocks else None


def clipboard_file() -> Path:
    from localchat.paths import data_dir

    return data_dir() / CLIPBOARD_FILE


def copy_text(app, text: str) -> Path | None:
    """OSC 52 through the app, and the fallback file; returns the file (None if it
    could not be written)."""
    app.copy_to_clipboard(text)
    path = clipboard_file()
    try:
        atomic_write_text(path, text)
    except OSError:
        return None
    return path
