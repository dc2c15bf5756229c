"""Speculative decoding made visible, mixed into ChatApp: each reply keeps which of
its text an accepted draft proposed, as (text, from_draft) runs, and F4 shows finished
replies in draft colours instead of Markdown (and back). Also the draft's section of
the /stats screen.

Only replies generated in this session with a draft have runs: the history keeps the
text, not where each token came from, so loaded messages stay Markdown.
"""

from __future__ import annotations

from localchat.storage.reply_status import ReplyStatus
from localchat.tui.messages import Entry
from localchat.chat.runs import Run


def draft_markdown(draft: dict) -> str:
    """The draft's stats as a Markdown table (the /stats screen's second section)."""
    rows = []
    for key, value in draft.items():
        if key == "accepted_run_histogram" and isinstance(value, dict):
            value = ", ".join(f"{k} kept: {n}×" for k, n in value.items()) or "–"
        elif key == "acceptance_rate" and isinstance(value, float):
            value = f"{value:.1%}"
        elif isinstance(value, float):
            value = f"{value:.4g}"
        elif value is None:
            value = "–"
        rows.append(f"| {key} | {str(value).replace('|', '/')} |")
    return "| draft | value |\n| --- | --- |\n" + "\n".join(rows)


class DraftColoursMixin:
    """The F4 toggle of ChatApp (uses its entries)."""

    draft_colours = False  # finished replies with runs shown in draft colours

    def _coloured_runs(self, entry: Entry) -> list[Run] | None:
        """The runs to show for entry now, or None for its Markdown."""
        drafted = entry.stats is not None and entry.stats.draft is not None
        if (self.draft_colours and entry.role == "assistant" and entry.runs
                and drafted and entry.status != ReplyStatus.STREAMING):
            return entry.runs
        return None

    def _show_runs(self, entry: Entry) -> None:
        entry.view.show_runs(self._coloured_runs(entry))

    def action_toggle_draft_colours(self) -> None:
        self.draft_colours = not self.draft_colours
        shown = 0
        for entry in self.entries:
            self._show_runs(entry)
            shown += entry.view.coloured
        if not self.draft_colours:
            self._info("replies shown as Markdown")
        elif shown:
            self._info(f"draft tokens coloured in {shown} repl{'y' if shown == 1 else 'ies'} "
                       "(F4 shows Markdown again)")
        else:
            self._info("draft colours on: replies generated here with a draft (--draft ngram, "
                       "--draft-model) show what the draft proposed")
