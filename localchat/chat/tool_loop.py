"""A reply that may call tools: the model gets the enabled tools (its template's `tools`
rendering or its family's format, as `serve` does), a call it writes is approved or refused,
run, its result fed back as a `tool` message, and the model continues, up to a step limit.
`required` or a tool's name forces the first step's call by grammar (it parses and matches
the tool's schema); later steps are `auto`, so the model can answer with what it got."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

from localchat.chat.params import ReplyParams
from localchat.engine.base import Engine, Message, Result, ToolCall
from localchat.engine.constraint import Constraint
from localchat.errors import UsageError
from localchat.prompt.tool_calls import tool_format
from localchat.tools.hub import HubTool, McpHub
from localchat.tools.results import ToolOutcome

MAX_STEPS = 8
CHOICES = ("auto", "required", "none")


@dataclass
class Approval:
    """Which calls run: tools trusted by name (config `allow`, --allow-tool, "always" in
    the chat) run at once; others ask `ask` (the chat's card: "yes", "no" or "always"), or
    without one (a script) are refused and the refusal is fed back to the model."""

    allowed: set[str] = field(default_factory=set)
    ask: Callable[[ToolCall, HubTool], str] | None = None

    def decide(self, call: ToolCall, tool: HubTool) -> bool:
        if tool.exposed in self.allowed:
            return True
        if self.ask is None:
            return False
        answer = self.ask(call, tool)
        if answer == "always":
            self.allowed.add(tool.exposed)
        return answer in ("yes", "always")


@dataclass(frozen=True)
class CallRecord:
    """One call the model made: the tool, its arguments (JSON text), what came back."""

    name: str
    arguments: str
    result: str
    error: bool
    approved: bool

    def as_dict(self) -> dict:
        return {"name": self.name, "arguments": _json_or_text(self.arguments),
                "result": self.result, "error": self.error, "approved": self.approved}


@dataclass
class ToolTurn:
    """What the loop adds to the conversation: assistant calls and tool results, in order."""

    messages: list[Message] = field(default_factory=list)
    calls: list[CallRecord] = field(default_factory=list)
    steps: int = 0


def check_choice(choice: str, tools: Sequence[HubTool]) -> str:
    """auto, required, none or a tool's name; UsageError naming the tools otherwise."""
    if choice in CHOICES or any(t.exposed == choice for t in tools):
        return choice
    names = ", ".join(t.exposed for t in tools) or "none: no MCP server gave any"
    raise UsageError(f"--tool-choice {choice!r}: one of {', '.join(CHOICES)} or a tool's name "
                     f"({names})")


def reply_with_tools(engine: Engine, messages: Sequence[Message], params: ReplyParams,
                     hub: McpHub, approval: Approval, choice: str = "auto",
                     max_steps: int = MAX_STEPS,
                     on_call: Callable[[CallRecord], None] | None = None,
                     cancel=None) -> tuple[Result, ToolTurn]:
    """The answer (the last step's Result, "length" if the step limit came first) and the
    calls made on the way; each call is told to on_call once it has run."""
    turn = ToolTurn()
    offered = [] if choice == "none" else hub.tools()
    writer = tool_format(engine.info.tool_format)
    history = list(messages)
    result = None
    for step in range(max_steps):
        turn.steps = step + 1
        request = params.request(history + turn.messages,
                                 tools=tuple(t.as_tool() for t in offered))
        forced = _forced(writer, offered, choice) if step == 0 else None
        if forced is not None:
            request = replace(request, constraint=forced, format_prompt=False)
        result = engine.complete(request, cancel)
        parsed = writer.parse(writer.without_echo(result.text)) if offered else None
        if parsed is None or result.finish_reason == "cancelled":
            text = writer.without_echo(result.text) if offered else result.text
            return Result(text, result.finish_reason, result.stats), turn
        call = parsed.calls[0]  # one call a step, as `serve` without parallel_tool_calls
        turn.messages.append(Message("assistant", parsed.content or "", tool_calls=(call,)))
        outcome, approved = _run(hub, approval, call)
        record = CallRecord(call.name, call.arguments, outcome.text, outcome.error, approved)
        turn.calls.append(record)
        turn.messages.append(Message("tool", outcome.text, tool_call_id=call.id))
        if on_call is not None:
            on_call(record)
    assert result is not None
    return Result("", "length", result.stats), turn  # the step limit: no answer after the calls


def _run(hub: McpHub, approval: Approval, call: ToolCall) -> tuple[ToolOutcome, bool]:
    tool = hub.find(call.name)
    if tool is None:
        return ToolOutcome(f"there is no tool named {call.name}", error=True), False
    if not approval.decide(call, tool):
        return ToolOutcome(f"the user did not allow {call.name} to run", error=True), False
    try:
        arguments = json.loads(call.arguments or "{}")
    except ValueError:
        return ToolOutcome(f"the arguments are not JSON: {call.arguments[:200]}", error=True), True
    if not isinstance(arguments, dict):
        return ToolOutcome("the arguments must be a JSON object", error=True), True
    return hub.call(tool, arguments), True


def _forced(writer, offered: Sequence[HubTool], choice: str) -> Constraint | None:
    if choice in ("auto", "none") or not offered:
        return None
    tools = [t.as_tool() for t in offered if choice in ("required", t.exposed)]
    return Constraint("lark", writer.grammar(tools, False))


def _json_or_text(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return text
