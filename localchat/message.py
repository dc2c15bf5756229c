"""One chat message, the unit every layer passes around (prompt rendering, the engine, the
history), and the tools a request offers the model. A bottom module: it imports nothing
from localchat."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True)
class ToolCall:
    """A function call the assistant made: its id, the function's name and its arguments
    as JSON text (an object)."""

    id: str
    name: str
    arguments: str = "{}"

    def arguments_value(self) -> Any:
        """The arguments as a JSON value (templates want an object); text that is not
        JSON stays text."""
        try:
            return json.loads(self.arguments)
        except ValueError:
            return self.arguments


@dataclass(frozen=True)
class Tool:
    """A function the model may call: name, description and its parameters' JSON Schema
    (as JSON text, so the value stays hashable)."""

    name: str
    description: str = ""
    parameters: str = '{"type": "object", "properties": {}}'

    def as_dict(self) -> dict:
        """OpenAI's (and Hugging Face templates') form: {"type": "function", "function": ...}."""
        function: dict = {"name": self.name}
        if self.description:
            function["description"] = self.description
        function["parameters"] = json.loads(self.parameters)
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class Message:
    """role and content; an assistant message may carry tool_calls, a "tool" message answers
    the call tool_call_id."""

    role: Role
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
