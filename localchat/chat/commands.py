"""Slash commands typed in the chat input: parsing and validation (by the flags' rules,
SAMPLING_FIELDS), no UI. A message starting with `//` is sent as text starting with `/`."""

from __future__ import annotations

from dataclasses import dataclass, replace

from localchat.engine.base import SamplingParams
from localchat.errors import UsageError
from localchat.sampling_fields import FIELD, SAMPLING_FIELDS


@dataclass(frozen=True)
class Command:
    name: str
    arg: str = ""


_SET_NAMES = [f.set_names[0] for f in SAMPLING_FIELDS]  # temp, top_k, ... seed
_CLEARED = " and ".join(f.set_names[0] for f in SAMPLING_FIELDS if f.nullable)

# name -> (argument help, what it does); the order is /help's order
COMMANDS: dict[str, tuple[str, str]] = {
    "help": ("", "this list of commands and keys"),
    "system": ("TEXT", "set this conversation's system prompt (no TEXT: clear it)"),
    "set": ("NAME VALUE", f"{', '.join(_SET_NAMES)} (`none` clears {_CLEARED})"),
    "json": ("[SCHEMA_FILE|off]", "replies in this conversation are JSON (matching the schema "
                                  "in SCHEMA_FILE; no file: any JSON object; off: free text)"),
    "model": ("[SPEC]", "switch to model SPEC (default, a .gguf path, OWNER/REPO:QUANT); "
                        "no SPEC: the model picker"),
    "regen": ("", "generate the selected (or last) reply again; the old one stays a version"),
    "edit": ("", "edit the selected (or last) message you sent; Enter sends a new version"),
    "continue": ("", "keep generating a stopped reply"),
    "copy": ("[code|think]", "copy the last reply (or its last code block, or its thinking)"),
    "stats": ("", "the full stats record of the last reply"),
    "export": ("[md|json] [PATH]", "write this conversation (the branch on screen) to a file"),
    "fork": ("", "copy the branch on screen into a new conversation"),
    "attach": ("PATH", "put a text file into your next message (its tokens shown first)"),
    "tools": ("[on|off NAME|auto|required|none|NAME]", "the MCP tools: list them, switch one "
              "on or off in this conversation, or say how the next reply may call"),
    "new": ("", "start a new conversation"),
    "clear": ("", "start a new, empty conversation (this one stays in the list)"),
    "rename": ("TITLE", "rename this conversation"),
}

# /set names (with aliases) -> the field they change
PARAM_NAMES = {name: f.name for f in SAMPLING_FIELDS
               for name in (*f.set_names, *f.unlisted_set_names)}
_LISTED = sorted(name for f in SAMPLING_FIELDS for name in f.set_names)


def parse_command(text: str) -> Command | None:
    """A Command for `/name args`, None for a normal message. Unknown names raise."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    name, _, arg = stripped[1:].partition(" ")
    name = name.lower()
    if name in ("?", "h"):
        name = "help"
    if name not in COMMANDS:
        raise UsageError(f"unknown command /{name} (type /help for the list)")
    return Command(name, arg.strip())


def unescape(text: str) -> str:
    """`//text` is sent as `/text`."""
    return text.lstrip()[1:] if text.lstrip().startswith("//") else text


def parse_set(arg: str) -> tuple[str, int | float | None]:
    """`temp 0.7` -> ("temperature", 0.7), type-checked; range checks: apply_set."""
    parts = arg.split()
    if len(parts) != 2:
        raise UsageError("usage: /set NAME VALUE, e.g. /set temp 0.7 "
                         f"(names: {', '.join(_LISTED)})")
    raw_name, raw_value = parts
    name = PARAM_NAMES.get(raw_name.lower())
    if name is None:
        raise UsageError(f"unknown parameter {raw_name!r} (use {', '.join(_SET_NAMES[:-1])} "
                         f"or {_SET_NAMES[-1]})")
    field = FIELD[name]
    if field.nullable and raw_value.lower() in ("none", "off", "default"):
        return name, None
    try:
        value: int | float = field.kind(raw_value)
    except ValueError:
        kind = "a whole number" if field.kind is int else "a number"
        raise UsageError(f"{raw_name} must be {kind}, got {raw_value!r}") from None
    if isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise UsageError(f"{raw_name} must be a finite number, got {raw_value!r}")
    return name, value


def apply_set(sampling: SamplingParams, max_tokens: int | None,
              name: str, value) -> tuple[SamplingParams, int | None]:
    """The new (sampling, max_tokens) after `/set name value`; invalid -> UsageError."""
    if not FIELD[name].in_sampling:  # max_tokens
        problem = FIELD[name].problem(value, label=name)
        if problem is not None:
            raise UsageError(problem)
        return sampling, value
    return replace(sampling, **{name: value}), max_tokens  # SamplingParams validates


def export_args(arg: str) -> tuple[str, str | None]:
    """`/export [md|json] [PATH]` -> (format, path or None)."""
    parts = arg.split(maxsplit=1)
    fmt = parts[0].lower() if parts else "md"
    if fmt not in ("md", "json"):
        raise UsageError(f"export format is md or json, not {parts[0]!r}")
    return fmt, (parts[1].strip() if len(parts) > 1 else None)


def parse_json(arg: str):
    """/json's constraint: any JSON object (no argument), the schema in a file, or None
    (off). UsageError or ConstraintError in one line for a file that cannot be used."""
    from pathlib import Path

    from localchat.engine.constraint import MAX_CONSTRAINT_CHARS, Constraint

    if not arg:
        return Constraint.json_object()
    if arg.lower() in ("off", "none"):
        return None
    path = Path(arg).expanduser()
    try:
        if path.stat().st_size > MAX_CONSTRAINT_CHARS:
            raise UsageError(f"{arg}: larger than {MAX_CONSTRAINT_CHARS} characters")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{arg}: not UTF-8 text") from None
    except OSError as exc:
        raise UsageError(f"{arg}: cannot read it ({exc.strerror or exc})") from None
    return Constraint.json_schema(text)
