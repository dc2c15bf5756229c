"""`run`'s structured-output flags: -j/--json-schema FILE|JSON, --grammar FILE (Lark, or GBNF
converted by llguidance), --json-object; the Constraint they ask for."""

from __future__ import annotations

import argparse
from pathlib import Path

from localchat.engine.constraint import MAX_CONSTRAINT_CHARS, Constraint
from localchat.errors import UsageError


def add_constraint_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-j", "--json-schema", default=None, metavar="FILE|JSON",
                       help="the reply is JSON valid against this JSON Schema (a file, or the "
                            "schema itself)")
    group.add_argument("--grammar", default=None, metavar="FILE",
                       help="the reply follows this grammar: Lark (llguidance's dialect), or "
                            "GBNF (llama.cpp's, a .gbnf file or one with '::=' rules)")
    group.add_argument("--json-object", action="store_true",
                       help="the reply is one JSON object")
    parser.add_argument("--no-format-prompt", dest="format_prompt", action="store_false",
                        help="with -j/--json-object: do not add the format to the system "
                             "prompt (by default a line asking for JSON, or the schema, is "
                             "added unless the prompt already asks)")


def constraint_from_args(args: argparse.Namespace) -> Constraint | None:
    """The constraint the flags ask for (None without them); UsageError naming the flag."""
    if getattr(args, "json_object", False):
        return Constraint.json_object()
    schema = getattr(args, "json_schema", None)
    if schema is not None:
        text = schema if schema.lstrip().startswith(("{", "true", "false")) else \
            _read(schema, "-j/--json-schema")
        try:
            return _checked(Constraint.json_schema(text))
        except UsageError as e:
            raise UsageError(f"-j/--json-schema: {e}") from None
    grammar = getattr(args, "grammar", None)
    if grammar is not None:
        text = _read(grammar, "--grammar")
        gbnf = grammar.endswith(".gbnf") or "::=" in text
        try:
            return _checked(Constraint("gbnf" if gbnf else "lark", text))
        except UsageError as e:
            raise UsageError(f"--grammar: {e}") from None
    return None


def _checked(constraint: Constraint) -> Constraint:
    """The constraint, refused before any model loads if llguidance rejects it or no
    finite text satisfies it."""
    constraint.check()
    return constraint


def _read(path: str, flag: str) -> str:
    try:
        size = Path(path).stat().st_size
        if size > MAX_CONSTRAINT_CHARS * 4:
            raise UsageError(f"{flag} {path}: {size} bytes is too large")
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise UsageError(f"{flag} {path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {path}: not UTF-8 text") from None
