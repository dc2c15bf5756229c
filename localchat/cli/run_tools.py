"""`localchat run --mcp`: one prompt whose reply may call MCP tools, unattended. Tools run
only when allowed by name (--allow-tool, or the config's "allow"); any other call is
refused and the refusal fed back. Each call is one line on stderr; `--json` lists them."""

from __future__ import annotations

import argparse
import json
import sys
import threading

from localchat.chat.session import ChatSession
from localchat.chat.call_record import CallRecord
from localchat.chat.tool_loop import Approval, ToolUse, check_choice
from localchat.engine.base import Result
from localchat.errors import LocalchatError, UsageError
from localchat.interrupts import ctrl_c_cancels
from localchat.tools.hub import McpHub


def run_with_tools(args: argparse.Namespace, session: ChatSession, prompt: str, typed: str,
                   servers) -> int:
    """The tool loop over the servers through the session's reply pipeline: the answer on
    stdout, the calls on stderr (and in --json), all of it saved to the history."""
    if args.max_tool_steps < 1:
        raise UsageError("--max-tool-steps must be at least 1")
    engine = session.engine
    with McpHub(servers) as hub:
        tools = hub.start()
        for note in hub.notes:
            print(f"localchat: {note}", file=sys.stderr)
        choice = check_choice(args.tool_choice, tools)
        allowed = set(args.allow_tool) | {t.exposed for t in tools for s in servers
                                          if s.name == t.server and t.name in s.allow}
        unknown = sorted(set(args.allow_tool) - {t.exposed for t in tools})
        if unknown:
            print(f"localchat: --allow-tool: no server offers {', '.join(unknown)}",
                  file=sys.stderr)
        use = ToolUse(hub, Approval(allowed), choice, args.max_tool_steps)
        cancel = threading.Event()
        reply = session.send(prompt, typed)
        result = None
        with ctrl_c_cancels(cancel):
            try:
                for event in session.reply(reply, cancel, tools=use):
                    if isinstance(event, CallRecord):
                        _say(event)
                    elif isinstance(event, Result):
                        result = event
            except LocalchatError as exc:
                session.fail(reply, str(exc))
                raise
    assert result is not None
    calls = reply.entry.calls
    if args.json:
        print(json.dumps({"text": result.text, "finish_reason": result.finish_reason,
                          "tool_calls": [c.shown() for c in calls],
                          **result.stats.to_dict(), "model": engine.info.name,
                          "engine": engine.name}, ensure_ascii=False))
    else:
        print(result.text if result.text.endswith("\n") else result.text + "\n", end="")
        if result.finish_reason == "length" and not result.text:
            print(f"localchat: no answer after {len(calls)} tool steps (--max-tool-steps)",
                  file=sys.stderr)
    return 130 if result.finish_reason == "cancelled" else 0


def _say(call: CallRecord) -> None:
    outcome = call.outcome
    shown = call.result if len(call.result) <= 80 else call.result[:77] + "..."
    print(f"localchat: tool {call.name}({call.arguments}) -> {outcome}: "
          f"{' '.join(shown.split())}", file=sys.stderr)
