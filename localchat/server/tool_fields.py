"""The tool fields of a chat request, checked field by field (a bad one is a 400 naming it):
`tools`, `tool_choice`, `parallel_tool_calls`, and the tool parts of messages (assistant
`tool_calls`, `role: "tool"` with `tool_call_id`). With tool_choice `required` or a named
function, decoding is constrained to the model family's call syntax."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from localchat.engine.base import Tool, ToolCall
from localchat.engine.constraint import Constraint
from localchat.errors import ConstraintError
from localchat.prompt.tool_calls import ParsedReply, ToolFormat, new_call_id, tool_format
from localchat.server.errors import ApiError

MAX_TOOLS = 128
_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # OpenAI's rule for function names
_EMPTY_PARAMETERS = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolUse:
    """The tools a reply may call: all of them rendered into the prompt; `only` (a name)
    or `required` forces a call (of that function); `parallel`: more than one call."""

    tools: tuple[Tool, ...]
    format: str  # tool_calls.py's family name: how calls are written and read
    required: bool = False
    only: str | None = None
    parallel: bool = False  # llama-server's default: a small model repeats calls otherwise

    @property
    def writer(self) -> ToolFormat:
        return tool_format(self.format)

    def read(self, text: str) -> ParsedReply | None:
        """The reply's calls (only the first unless parallel); None if it holds none."""
        parsed = self.writer.parse(self.writer.without_echo(text))
        if parsed is None or self.parallel:
            return parsed
        return ParsedReply(parsed.content, parsed.calls[:1])

    def constraint(self) -> Constraint | None:
        """The grammar a forced call is decoded under; None when the model may answer."""
        if not (self.required or self.only):
            return None
        tools = [t for t in self.tools if self.only in (None, t.name)]
        return Constraint("lark", self.writer.grammar(tools, self.parallel))


def _bad(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def parse_tool_use(body: dict, tool_format_name: str) -> ToolUse | None:
    """tools, tool_choice and parallel_tool_calls; None when no tool may be called
    (no tools, or tool_choice "none": then the tools are not rendered either)."""
    tools = _tools(body.get("tools"))
    choice = body.get("tool_choice")
    parallel = _typed("parallel_tool_calls", body.get("parallel_tool_calls"), bool,
                      "true or false") is True
    if choice in (None, "auto", "none"):  # "auto" without tools changes nothing
        return ToolUse(tools, tool_format_name, parallel=parallel) \
            if tools and choice != "none" else None
    if not tools:
        raise _bad("tool_choice", "tool_choice needs tools to choose from")
    if choice == "required":
        return ToolUse(tools, tool_format_name, required=True, parallel=parallel)
    name = _named_choice(choice)
    if name not in {t.name for t in tools}:
        raise _bad("tool_choice", f"tool_choice names the function {name!r}, which is not "
                                  "in tools")
    return ToolUse(tools, tool_format_name, only=name, parallel=False)


def _named_choice(choice: Any) -> str:
    if isinstance(choice, dict) and choice.get("type") == "function" \
            and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        return choice["function"]["name"]
    raise _bad("tool_choice", 'tool_choice must be "none", "auto", "required" or '
                              '{"type": "function", "function": {"name": ...}}')


def _tools(value: Any) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad("tools", "tools must be an array", "invalid_type")
    if len(value) > MAX_TOOLS:
        raise _bad("tools", f"at most {MAX_TOOLS} tools are accepted, got {len(value)}")
    tools = tuple(_tool(f"tools[{i}]", t) for i, t in enumerate(value))
    names = [t.name for t in tools]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise _bad(f"tools[{i}].function.name", f"two tools are named {name!r}")
    return tools


def _tool(param: str, value: Any) -> Tool:
    if not isinstance(value, dict):
        raise _bad(param, f"{param} must be an object", "invalid_type")
    if value.get("type") != "function":
        raise _bad(f"{param}.type", f"{param}.type must be \"function\" (the only kind of tool "
                                    "supported)")
    function = value.get("function")
    if not isinstance(function, dict):
        raise _bad(f"{param}.function", f"{param}.function must be an object", "invalid_type")
    name = function.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise _bad(f"{param}.function.name", f"{param}.function.name must be 1 to 64 letters, "
                                             "digits, _ . or -")
    description = _typed(f"{param}.function.description", function.get("description", ""),
                         str, "a string")
    _typed(f"{param}.function.strict", function.get("strict"), bool, "true or false")
    parameters = function.get("parameters", _EMPTY_PARAMETERS)
    where = f"{param}.function.parameters"
    if not isinstance(parameters, dict):
        raise _bad(where, f"{where} must be a JSON Schema object", "invalid_type")
    try:
        Constraint.json_schema(parameters).check()
    except ConstraintError as exc:
        raise _bad(where, f"{where}: {exc}") from None
    return Tool(name, description, json.dumps(parameters))


def _typed(param: str, value: Any, kind: type, what: str) -> Any:
    """value, if it is None or of `kind`; else a 400 naming param."""
    if value is not None and not isinstance(value, kind):
        raise _bad(param, f"{param} must be {what}", "invalid_type")
    return value


# --- the tool parts of messages ------------------------------------------------------


def tool_calls_field(param: str, value: Any) -> tuple[ToolCall, ...]:
    """An assistant message's tool_calls: [{"id", "type": "function", "function":
    {"name", "arguments": JSON text}}]."""
    if value is None:
        return ()
    if not isinstance(value, list):
        raise _bad(param, f"{param} must be an array", "invalid_type")
    calls = []
    for i, call in enumerate(value):
        where = f"{param}[{i}]"
        if not isinstance(call, dict) or call.get("type", "function") != "function" \
                or not isinstance(call.get("function"), dict):
            raise _bad(where, f'{where} must be {{"type": "function", "function": {{"name", '
                              '"arguments"}}')
        function = call["function"]
        if not isinstance(function.get("name"), str) or not function["name"]:
            raise _bad(f"{where}.function.name", f"{where}.function.name must be a string")
        arguments = _typed(f"{where}.function.arguments", function.get("arguments", "{}"),
                           str, "a string (JSON)")
        call_id = _typed(f"{where}.id", call.get("id"), str, "a string")
        calls.append(ToolCall(call_id or new_call_id(), function["name"], arguments or "{}"))
    return tuple(calls)


def tool_call_id_field(param: str, value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise _bad(param, f"{param} is required in a tool message (the id of the call it "
                          "answers)", "missing_required_parameter" if value is None
                   else "invalid_type")
    return value
