"""A reply that may call tools: the model gets the enabled tools (its template's `tools`
rendering or its family's format, as `serve` does), a call it writes is approved or refused,
run, its result fed back as a `tool` message, and the model continues, up to a step limit.
`required` or a tool's name forces the first step's call by grammar (it parses and matches
the tool's schema); later steps are `auto`, so the model can answer with what it got."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator, Sequence

from localchat.chat.call_record import CallRecord
from localchat.engine.base import Delta, Engine, Message, Request, Result, ToolCall
from localchat.engine.constraint import Constraint
from localchat.errors import UsageError
from localchat.prompt.call_stream import CallStream
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


@dataclass
class ToolUse:
    """What a reply may call: the hub's tools less those switched off, who approves each
    call, how the first step may call (auto, required, none or a tool's name), and how many
    calls at most before the model must answer."""

    hub: McpHub
    approval: Approval
    choice: str = "auto"
    max_steps: int = MAX_STEPS
    off: frozenset[str] = frozenset()

    def offered(self) -> list[HubTool]:
        if self.choice == "none":
            return []
        return [t for t in self.hub.tools() if t.exposed not in self.off]


def check_choice(choice: str, tools: Sequence[HubTool]) -> str:
    """auto, required, none or a tool's name; UsageError naming the tools otherwise."""
    if choice in CHOICES or any(t.exposed == choice for t in tools):
        return choice
    names = ", ".join(t.exposed for t in tools) or "none: no MCP server gave any"
    raise UsageError(f"--tool-choice {choice!r}: one of {', '.join(CHOICES)} or a tool's name "
                     f"({names})")


def tool_events(engine: Engine, request: Request, use: ToolUse,
                cancel=None) -> Iterator[CallRecord | Delta | Result]:
    """request's reply with tools: its text as it streams (up to where a call may start:
    that is held until the step ends), each call the model makes (a CallRecord, once it has
    run or been refused), then the Result, whose text is all that was shown ("length" when
    the step limit came first). A forced first step is generated whole: it is the call."""
    offered = use.offered()
    writer = tool_format(engine.info.tool_format)
    with_tools = replace(request, tools=tuple(t.as_tool() for t in offered))
    turn: list[Message] = []
    shown, result = "", None
    for step in range(use.max_steps):
        step_request = replace(with_tools, messages=tuple(request.messages) + tuple(turn))
        forced = _forced(writer, offered, use.choice) if step == 0 else None
        stream = CallStream(writer) if offered and forced is None else None
        if forced is not None:
            step_request = replace(step_request, constraint=forced, format_prompt=False)
        result = None
        for event in engine.generate(step_request, cancel):
            if isinstance(event, Result):
                result = event
            elif stream is None and not offered:
                shown += event.text
                yield event
            elif stream is not None:
                now = stream.feed(event.text)
                if now:
                    shown += now
                    yield replace(event, text=now)
        assert result is not None
        held = stream.held if stream is not None else result.text if offered else ""
        parsed = writer.parse(writer.without_echo(held)) \
            if held and offered and not (stream is not None and stream.passing) else None
        if parsed is None or result.finish_reason == "cancelled":
            rest = stream.rest() if stream is not None else writer.without_echo(held)
            if rest:
                shown += rest
                yield Delta(rest, (), result.stats)
            yield Result(shown, result.finish_reason, result.stats)
            return
        call = parsed.calls[0]  # one call a step, as `serve` without parallel_tool_calls
        outcome, approved = _run(use.hub, use.approval, call)
        record = CallRecord(call.name, call.arguments, outcome.text, outcome.error, approved,
                            parsed.content or "", call.id)
        turn += record.messages(step)
        yield record
    assert result is not None
    yield Result(shown, "length", result.stats)  # the step limit: no answer after the calls


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
