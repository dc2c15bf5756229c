"""A reply's runs: its text as (text, from_draft) stretches, each from one source (the
model, or an accepted draft), so the TUI can colour what speculative decoding proposed."""

from __future__ import annotations

Run = tuple[str, bool]  # (text, from_draft): a stretch of a reply from one source


def add_run(runs: list[Run], text: str, from_draft: bool) -> None:
    """Append text to runs, extending the last run when it came from the same source."""
    if not text:
        return
    if runs and runs[-1][1] == from_draft:
        runs[-1] = (runs[-1][0] + text, from_draft)
    else:
        runs.append((text, from_draft))
