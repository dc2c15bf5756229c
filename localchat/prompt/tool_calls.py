"""Tool-call formats by model family: the tools section a prompt gets, how a past call and a
tool's result are written into the history, the parser that reads calls back out of a reply,
and the Lark grammar that forces a valid call (tool_choice required or named).

hermes: Hermes/Qwen `<tool_call>{"name", "arguments"}</tool_call>` (ChatML and the rest);
llama3: Llama 3.1's JSON `{"name", "parameters"}`; mistral: `[TOOL_CALLS][{...}]`."""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, replace
from typing import Any, Sequence

from localchat.message import Message, Tool, ToolCall

FORMATS = ("hermes", "llama3", "mistral")
MAX_PARALLEL_CALLS = 8  # a forced reply's calls: a grammar that always completes
# JSON as the grammar writes it (guide.py's JSON_OPTIONS): one spelling, no free whitespace
_JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_TOOLS_VARIABLE = re.compile(r"\btools\b")


def tool_format_for(template: str | None) -> str:
    """The call format a chat template's family uses: by the markers its source writes."""
    source = template or ""
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source or "[INST]" in source:
        return "mistral"
    if "<|start_header_id|>" in source or "<|python_tag|>" in source:
        return "llama3"
    return "hermes"


def template_takes_tools(template: str | None) -> bool:
    """Does the template render `tools` itself (most recent GGUF templates do)?"""
    return bool(template) and _TOOLS_VARIABLE.search(template) is not None


def has_tool_turns(messages: Sequence[Message]) -> bool:
    return any(m.tool_calls or m.role == "tool" for m in messages)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedReply:
    """A reply read as tool calls: the text before them (None if none) and the calls."""

    content: str | None
    calls: tuple[ToolCall, ...]


def _call(value: Any, arguments_key: str) -> ToolCall | None:
    """{"name": str, arguments_key: object} as a ToolCall; None for any other shape."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict) or not value["name"]:
        return None
    return ToolCall(new_call_id(), value["name"], _dumps(arguments))


def _json_value(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


# --- the formats ---------------------------------------------------------------------


def strict_parameters(schema):
    """A tool's parameters as a forced call writes them: only the properties it declares
    (additionalProperties false where the schema does not say; as OpenAI's strict mode), so
    a small model cannot wander into keys of its own (it copied the schema's `title` and
    `type` into the arguments until the reply ran out)."""
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and \
            "additionalProperties" not in schema:
        return {**schema, "additionalProperties": False}
    return schema


class ToolFormat:
    """One family's tool-call text. `marker` starts a call in a reply; `marker_at_start`:
    only a reply that starts with it is a call."""

    name = ""
    marker = ""
    marker_at_start = False
    arguments_key = "arguments"
    echo_marker = ""  # how a tool's result starts in the prompt: a small model may repeat it
    _echo: re.Pattern | None = None

    def without_echo(self, text: str) -> str:
        """The reply without tool results it repeated from the prompt (the family's result
        markup is never the assistant's own text)."""
        return self._echo.sub("", text).strip() if self._echo and self.echo_marker in text \
            else text

    def section(self, tools: Sequence[Tool]) -> str:
        """The system-prompt text that offers the tools."""
        raise NotImplementedError

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        """A past assistant turn's calls, as the model would have written them."""
        raise NotImplementedError

    def result_message(self, message: Message) -> Message:
        """A tool's result as a message the template can render."""
        return Message("user", message.content)

    def parse(self, text: str) -> ParsedReply | None:
        """The calls in a reply; None when it holds none or they are malformed."""
        raise NotImplementedError

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> str:
        """Lark: a reply that is only calls of these tools (one, or several if parallel),
        each one's arguments valid against its parameters."""
        raise NotImplementedError

    def _call_schema(self, tools: Sequence[Tool]) -> dict:
        return {"anyOf": [{
            "type": "object",
            "properties": {"name": {"const": t.name},
                           self.arguments_key: strict_parameters(json.loads(t.parameters))},
            "required": ["name", self.arguments_key], "additionalProperties": False}
            for t in tools]}

    def inline(self, messages: Sequence[Message], tools: Sequence[Tool]) -> list[Message]:
        """The conversation for a template that knows nothing of tools: the tools section
        in the system message, past calls as assistant text, results as user turns."""
        out: list[Message] = []
        for m in messages:
            if m.role == "tool":
                out.append(self.result_message(m))
            elif m.tool_calls:
                text = "\n".join(filter(None, [m.content, self.call_text(m.tool_calls)]))
                out.append(Message("assistant", text))
            else:
                out.append(m)
        if tools:
            section = self.section(tools)
            if out and out[0].role == "system":
                out[0] = replace(out[0], content=out[0].content + "\n\n" + section)
            else:
                out.insert(0, Message("system", section))
        return out


class Hermes(ToolFormat):
    name = "hermes"
    marker = "<tool_call>"
    echo_marker = "<tool_response>"
    _echo = re.compile(r"<tool_response>.*?(?:</tool_response>|$)", re.DOTALL)
    _block = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)

    def section(self, tools: Sequence[Tool]) -> str:
        listed = "\n".join(_dumps(t.as_dict()) for t in tools)
        return ("# Tools\n\nYou may call one or more functions to assist with the user query."
                "\n\nYou are provided with function signatures within <tools></tools> XML "
                f"tags:\n<tools>\n{listed}\n</tools>\n\nFor each function call, return a json"
                " object with function name and arguments within <tool_call></tool_call> "
                "XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        return "\n".join("<tool_call>\n" + _dumps({"name": c.name,
                                                   "arguments": c.arguments_value()})
                         + "\n</tool_call>" for c in calls)

    def result_message(self, message: Message) -> Message:
        """For a template that knows nothing of tools, in plain words: wrapped in Hermes's
        <tool_response> the bundled model only repeated the markup (2 of 2 round trips
        answered nothing); said so, it answered ("The weather in Oslo is clear.")."""
        return Message("user", f"The tool answered: {message.content}\n"
                               "Now answer my question in one sentence.")

    def parse(self, text: str) -> ParsedReply | None:
        start = text.find(self.marker)
        if start < 0:
            return None
        calls = [_call(_json_value(body), "arguments")
                 for body in self._block.findall(text, start)]
        if not calls or None in calls:
            return None
        return ParsedReply(text[:start].strip() or None, tuple(calls))  # type: ignore[arg-type]

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> str:
        body = {"x-guidance": _JSON_OPTIONS, **self._call_schema(tools)}
        more = f' ("\\n" call){{0,{MAX_PARALLEL_CALLS - 1}}}' if parallel else ""
        return (f"start: call{more}\n"
                'call: "<tool_call>\\n" body "\\n</tool_call>"\n'
                f"body: %json{_dumps(body)}\n")


class Llama3(ToolFormat):
    """Llama 3.1's JSON tool calling: one call per reply, `parameters` for the arguments."""

    name = "llama3"
    marker = "{"
    marker_at_start = True
    arguments_key = "parameters"

    def section(self, tools: Sequence[Tool]) -> str:
        listed = "\n\n".join(json.dumps(t.as_dict(), indent=4, ensure_ascii=False)
                             for t in tools)
        return ("Given the following functions, please respond with a JSON for a function "
                "call with its proper arguments that best answers the given prompt.\n\n"
                'Respond in the format {"name": function name, "parameters": dictionary of '
                "argument name and its value}. Do not use variables.\n\n" + listed)

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        return "; ".join(_dumps({"name": c.name, "parameters": c.arguments_value()})
                         for c in calls)

    def result_message(self, message: Message) -> Message:
        return Message("ipython", message.content)  # type: ignore[arg-type]

    def parse(self, text: str) -> ParsedReply | None:
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return None
        call = _call(_json_value(body), "parameters")
        return ParsedReply(None, (call,)) if call else None

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> str:
        body = {"x-guidance": _JSON_OPTIONS, **self._call_schema(tools)}
        return f"start: %json{_dumps(body)}\n"  # Llama 3.1 makes one call per turn


class Mistral(ToolFormat):
    name = "mistral"
    marker = "[TOOL_CALLS]"

    def section(self, tools: Sequence[Tool]) -> str:
        return "[AVAILABLE_TOOLS] " + _dumps([t.as_dict() for t in tools]) + \
            "[/AVAILABLE_TOOLS]"

    def call_text(self, calls: Sequence[ToolCall]) -> str:
        return "[TOOL_CALLS] " + _dumps([{"name": c.name, "arguments": c.arguments_value()}
                                          for c in calls])

    def result_message(self, message: Message) -> Message:
        return Message("user", "[TOOL_RESULTS] " + _dumps({"content": message.content})
                       + "[/TOOL_RESULTS]")

    def parse(self, text: str) -> ParsedReply | None:
        start = text.find(self.marker)
        before, body = (text[:start], text[start + len(self.marker):]) if start >= 0 else \
            ("", text)
        value = _json_value(body.strip())
        if start < 0 and not isinstance(value, list):  # the marker may be a control token
            return None
        items = value if isinstance(value, list) else [value]
        calls = [_call(item, "arguments") for item in items]
        if not calls or None in calls:
            return None
        return ParsedReply(before.strip() or None, tuple(calls))  # type: ignore[arg-type]

    def grammar(self, tools: Sequence[Tool], parallel: bool) -> str:
        calls = {"x-guidance": _JSON_OPTIONS, "type": "array", "items": self._call_schema(tools),
                 "minItems": 1, "maxItems": MAX_PARALLEL_CALLS if parallel else 1}
        return f'start: "[TOOL_CALLS] " %json{_dumps(calls)}\n'


_FORMATS: dict[str, ToolFormat] = {f.name: f for f in (Hermes(), Llama3(), Mistral())}


def tool_format(name: str) -> ToolFormat:
    return _FORMATS[name]
