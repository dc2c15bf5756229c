"""`localchat run --mcp`: one prompt whose reply may call MCP tools, unattended. Tools run
only when allowed by name (--allow-tool, or the config's "allow"); any other call is
refused and the refusal fed back. Each call is one line on stderr; `--json` lists them."""

from __future__ import annotations

import argparse
import json
import sys
import threading

from localchat.chat.session import ChatSession
from localchat.chat.tool_loop import Approval, CallRecord, check_choice, reply_with_tools
from localchat.errors import UsageError
from localchat.interrupts import ctrl_c_cancels
from localchat.engine.base import Message
from localchat.tools.hub import McpHub


def run_with_tools(args: argparse.Namespace, session: ChatSession, prompt: str, typed: str,
                   servers) -> int:
    """The tool loop over the servers; the answer on stdout (saved as the run's reply)."""
    engine, params = session.engine, session.params
    messages = session.history + [Message("user", prompt)]
    if args.max_tool_steps < 1:
        raise UsageError("--max-tool-steps must be at least 1")
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
        cancel = threading.Event()
        with ctrl_c_cancels(cancel):
            result, turn = reply_with_tools(engine, messages, params, hub, Approval(allowed),
                                            choice, args.max_tool_steps, on_call=_say,
                                            cancel=cancel)
    session.keep(session.send(prompt, typed), result)  # the calls are not kept there yet
    if args.json:
        print(json.dumps({"text": result.text, "finish_reason": result.finish_reason,
                          "tool_calls": [c.as_dict() for c in turn.calls],
                          **result.stats.to_dict(), "model": engine.info.name,
                          "engine": engine.name}, ensure_ascii=False))
    else:
        print(result.text if result.text.endswith("\n") else result.text + "\n", end="")
        if result.finish_reason == "length" and not result.text:
            print(f"localchat: no answer after {turn.steps} tool steps (--max-tool-steps)",
                  file=sys.stderr)
    return 130 if result.finish_reason == "cancelled" else 0


def _say(call: CallRecord) -> None:
    outcome = "refused" if not call.approved else ("error" if call.error else "ok")
    shown = call.result if len(call.result) <= 80 else call.result[:77] + "..."
    print(f"localchat: tool {call.name}({call.arguments}) -> {outcome}: "
          f"{' '.join(shown.split())}", file=sys.stderr)
