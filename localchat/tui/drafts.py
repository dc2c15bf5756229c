"""The /stats screen's draft section: a speculative draft's stats as a Markdown table."""

from __future__ import annotations


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
