"""The reply's format said in the prompt. A constraint makes the reply parse, but a model
that is not told what is wanted fills a JSON object with junk ("{}", `{",": 0}`); OpenAI and
Ollama advise saying the format in the prompt too. Where the request does not already, the
system turn gets one short line: "Answer with one JSON object.", or the schema."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Sequence

from localchat.message import Message

MAX_SCHEMA_CHARS = 2000  # a longer schema is not pasted: only the plain instruction
OBJECT = "Answer with one JSON object."
SCHEMA = "Answer with one JSON value that matches this JSON Schema:\n{schema}"


def instruction(kind: str, text: str) -> str | None:
    """The line for a constraint of this kind and text (None: grammars, said by the user)."""
    if kind == "json_object":
        return OBJECT
    if kind != "json_schema":
        return None
    try:
        schema = json.dumps(json.loads(text), ensure_ascii=False)
    except ValueError:
        return OBJECT
    return SCHEMA.format(schema=schema) if len(schema) <= MAX_SCHEMA_CHARS else OBJECT


def with_format_instruction(messages: Sequence[Message], kind: str, text: str
                            ) -> tuple[Message, ...]:
    """The messages with the format's line added to the system turn (a new one first if there
    is none), unless a message already asks for JSON (json_object) or holds the schema."""
    line = instruction(kind, text)
    if line is None or _already_asked(messages, kind, line):
        return tuple(messages)
    if messages and messages[0].role == "system":
        first = messages[0]
        content = f"{first.content}\n\n{line}" if first.content.strip() else line
        return (replace(first, content=content), *messages[1:])
    return (Message("system", line), *messages)


def _already_asked(messages: Sequence[Message], kind: str, line: str) -> bool:
    texts = [m.content for m in messages if isinstance(m.content, str)]
    if kind == "json_object":
        return any("json" in t.lower() for t in texts)
    schema = line.split("\n", 1)[-1]
    return any(schema in t for t in texts)
