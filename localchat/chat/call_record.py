"""CallRecord: one tool call a reply made before its answer, as the history keeps it and
as the model reads it again (the assistant's call, then the tool's result)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from localchat.message import Message, ToolCall


@dataclass(frozen=True)
class CallRecord:
    """The tool, its arguments (JSON text), what came back, whether that is an error,
    whether the call was allowed to run, and what the model said before calling."""

    name: str
    arguments: str
    result: str
    error: bool = False
    approved: bool = True
    said: str = ""
    id: str = ""

    @property
    def outcome(self) -> str:
        """refused, error or ok."""
        return "refused" if not self.approved else ("error" if self.error else "ok")

    def as_dict(self) -> dict:
        """What the history stores (and `run --json` lists, arguments as JSON)."""
        return asdict(self)

    def shown(self) -> dict:
        return {"name": self.name, "arguments": _json_or_text(self.arguments),
                "result": self.result, "error": self.error, "approved": self.approved}

    @classmethod
    def from_dict(cls, data: dict) -> "CallRecord":
        """A stored call; missing or mistyped fields read as empty."""
        def text(key: str) -> str:
            value = data.get(key, "")
            return value if isinstance(value, str) else json.dumps(value)

        return cls(text("name"), text("arguments") or "{}", text("result"),
                   bool(data.get("error", False)), bool(data.get("approved", True)),
                   text("said"), text("id"))

    def messages(self, index: int) -> tuple[Message, Message]:
        """The assistant's call and the tool's answer, as the prompt renders them."""
        call_id = self.id or f"call_{index}"
        return (Message("assistant", self.said, tool_calls=(
                    ToolCall(call_id, self.name, self.arguments),)),
                Message("tool", self.result, tool_call_id=call_id))


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text
