"""The F1 help text: keys and slash commands, kept next to each other so the help
screen and the README table are easy to compare."""

from __future__ import annotations

from pathlib import Path

from localchat.chat.commands import COMMANDS

# The empty input's placeholder: what a new user can do first.
EMPTY_HINT = "Type a message · Enter sends · Ctrl+J new line · /system TEXT · F1 help"

KEYS_HELP = [
    ("Enter", "send"),
    ("Ctrl+J (Shift+Enter)", "new line in the message"),
    ("Esc", "stop the reply (what was written is kept); cancel an edit or a selection"),
    ("Up (in an empty input)", "edit the selected (or last) message you sent"),
    ("Ctrl+R", "regenerate the selected (or last) reply: the old one stays as a version"),
    ("Alt+Up / Alt+Down", "select an earlier message (for Ctrl+R, Up-to-edit, Alt+←/→)"),
    ("Alt+Left / Alt+Right", "switch between a message's versions (‹ 2/3 ›) and their branches; "
                              "stops at the first and the last"),
    ("Ctrl+G", "continue a stopped reply"),
    ("F2 / F3", "copy the last reply / its last code block (or click a message)"),
    ("F4", "colour the tokens a speculative draft proposed (replies made here; again: Markdown)"),
    ("F5", "show or hide the last reply's thinking (a reasoning model's <think> block)"),
    ("F6", "parameters: sampling, max tokens, context size (reloads), seed"),
    ("F7", "models: switch the model, choose a draft (d), ngram draft (n), no draft (o)"),
    ("F8", "speculative decoding on/off (reloads the model)"),
    ("Ctrl+B", "show or hide the conversation list"),
    ("Ctrl+N", "new conversation"),
    ("Ctrl+P", "command palette"),
    ("Ctrl+T", "light/dark theme"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit"),
]


def _cell(text: str) -> str:
    """Table-cell text: a literal | (as in /export [md|json]) must not end the cell."""
    return text.replace("|", "\\|")


def help_markdown(keymap_file: Path | None = None) -> str:
    lines = ["| key | does |", "| --- | --- |"]
    lines += [f"| {_cell(k)} | {_cell(v)} |" for k, v in KEYS_HELP]
    lines += ["", "In the conversation list: Enter opens, r renames, d deletes, n starts a new "
              "one, / searches.", "", "| command | does |", "| --- | --- |"]
    for name, (args, what) in COMMANDS.items():
        lines.append(f"| {_cell('/' + name + (' ' + args if args else ''))} | {_cell(what)} |")
    lines += ["", "Start a message with // to send text that begins with /."]
    if keymap_file is not None:
        lines += ["", f"Keys can be rebound by action name in {keymap_file}."]
    return "\n".join(lines)
