"""Standard input as text, for run's prompt and run --batch's lines."""

from __future__ import annotations

import sys


def read_stdin_text(stdin) -> str:
    """stdin as text; bytes that are not UTF-8 become U+FFFD, and stderr says how many."""
    raw = getattr(stdin, "buffer", None)
    if raw is None:  # already text (a test's StringIO)
        return stdin.read()
    data = raw.read()
    text = data.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
    if bad:
        print(f"localchat: warning: stdin is not valid UTF-8; {bad} invalid byte sequence(s) "
              "replaced with U+FFFD", file=sys.stderr)
    return text
