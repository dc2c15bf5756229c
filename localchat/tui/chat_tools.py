"""The chat's MCP tools: the servers of mcp.json (the data dir's, or --mcp FILE) started in
the background, which tools each conversation has on, how the next reply may call (/tools),
and the approval card each call waits on (y: run it, n: refuse, a: always in this chat)."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

from localchat.chat.params import ReplyParams
from localchat.chat.tool_loop import CHOICES, Approval, ToolUse
from localchat.errors import UsageError
from localchat.message import ToolCall
from localchat.tools.config import ServerSpec
from localchat.tools.hub import HubTool, McpHub

TOOLS_USAGE = "usage: /tools, /tools on|off NAME, /tools auto|required|none|NAME"


class ApprovalScreen(ModalScreen[str]):
    """A call the model made, waiting: the tool, its server and its arguments, pretty-printed.
    Answers "yes", "no", "always" (this tool, this conversation) or "stop" (Esc: the reply)."""

    BINDINGS = [Binding("y", "answer('yes')", "Run"), Binding("n", "answer('no')", "Refuse"),
                Binding("a", "answer('always')", "Always"),
                Binding("escape", "answer('stop')", "Stop")]

    def __init__(self, call: ToolCall, tool: HubTool) -> None:
        super().__init__(classes="modal")
        self.call, self.tool = call, tool

    def compose(self) -> ComposeResult:
        try:
            arguments = json.dumps(json.loads(self.call.arguments), indent=2, ensure_ascii=False)
        except ValueError:
            arguments = self.call.arguments
        with Vertical(classes="dialog approval"):
            yield Static(f"The model wants to run {self.tool.exposed} "
                         f"(MCP server {self.tool.server}) with:", classes="question",
                         markup=False)
            yield Static(arguments, classes="arguments", markup=False)
            yield Static("y: run it · n: refuse · a: always for this tool in this conversation"
                         " · Esc: stop the reply", classes="hint")

    def action_answer(self, answer: str) -> None:
        self.dismiss(answer)


class ChatTools:
    """The hub, and the next reply's choice; which tools are off and which run without
    asking are the conversation's params (stored with it). ask() runs in the reply's worker."""

    def __init__(self, app, servers: list[ServerSpec]) -> None:
        self.app, self.servers = app, servers
        self.hub: McpHub | None = None
        self.started = threading.Event()
        self.choice = "auto"  # required or a tool's name: for the next reply only
        self._notes_said = 0

    def start(self) -> list[str]:
        """Start the servers (blocks: call it in a worker); their notes, one line each."""
        hub = McpHub(self.servers)
        hub.start()
        self.hub = hub
        self.started.set()
        return self.fresh_notes()

    def fresh_notes(self) -> list[str]:
        """The hub's notes not yet said (a server that failed to start or stopped)."""
        notes = self.hub.notes[self._notes_said:] if self.hub is not None else []
        self._notes_said += len(notes)
        return notes

    def close(self) -> None:
        if self.hub is not None:
            self.hub.close()

    def use(self, params: ReplyParams, cancel: threading.Event) -> ToolUse | None:
        """What the next reply may call (None: no server is ready or every tool is off);
        a forced choice is used once."""
        if self.hub is None or not self.hub.tools():
            return None
        choice, self.choice = self.choice, "auto"
        allowed = set(params.tools_allowed) | self._trusted()
        use = ToolUse(self.hub, Approval(allowed, ask=lambda call, tool: self.ask(
            call, tool, cancel)), choice, off=frozenset(params.tools_off))
        return use if use.offered() or choice == "none" else None

    def command(self, arg: str) -> str:
        """/tools: list them; on/off NAME; auto, required, none or NAME for the next reply."""
        if self.hub is None:
            return "the MCP servers are still starting"
        session, names = self.app.session, [t.exposed for t in self.hub.tools()]
        words = arg.split()
        if not words:
            return self.listing(session.params)
        if words[0] in ("on", "off") and len(words) == 2:
            name = words[1]
            if name not in names:
                raise UsageError(f"no tool named {name} (tools: {', '.join(names) or 'none'})")
            off = [t for t in session.params.tools_off if t != name]
            off += [name] if words[0] == "off" else []
            session.set_params(replace(session.params, tools_off=tuple(off)))
            return f"{name} is {words[0]} in this conversation"
        if len(words) == 1 and (words[0] in CHOICES or words[0] in names):
            self.choice = words[0]
            return {"auto": "the model may call a tool or answer",
                    "none": "no tool is offered to the next reply"}.get(
                words[0], f"the next reply starts with a call to {words[0]}"
                if words[0] in names else "the next reply starts with a tool call")
        raise UsageError(TOOLS_USAGE)

    def listing(self, params: ReplyParams) -> str:
        lines, trusted = [], self._trusted() | set(params.tools_allowed)
        for spec in self.servers:
            lines.append(f"{spec.name}: {self.hub.state.get(spec.name, '?')}")
            for t in self.hub.tools():
                if t.server == spec.name:
                    marks = ["off" if t.exposed in params.tools_off else "on"]
                    if t.exposed in trusted:
                        marks.append("runs without asking")
                    lines.append(f"  {t.exposed} ({', '.join(marks)}): {t.description}")
        lines.append(f"next reply: {self.choice}")
        return "\n".join(lines)

    def ask(self, call: ToolCall, tool: HubTool, cancel: threading.Event) -> str:
        """The user's answer to the approval card (from the reply's worker thread); "always"
        is kept in the conversation's params; Esc stops the reply and refuses the call."""
        done, answer = threading.Event(), ["no"]

        def answered(value: str | None) -> None:
            answer[0] = value or "no"
            done.set()

        screen = ApprovalScreen(call, tool)
        self.app.call_from_thread(self.app.push_screen, screen, answered)
        while not done.wait(0.05):
            if cancel.is_set():  # Esc on the chat, or the app quitting
                self.app.call_from_thread(lambda: screen.is_current and screen.dismiss("no"))
                return "no"
        if answer[0] == "stop":
            cancel.set()
            return "no"
        if answer[0] == "always":
            self.app.call_from_thread(self._allow, tool.exposed)
        return answer[0]

    def _allow(self, name: str) -> None:
        session = self.app.session
        if name not in session.params.tools_allowed:
            session.set_params(replace(session.params,
                                       tools_allowed=session.params.tools_allowed + (name,)))

    def _trusted(self) -> set[str]:
        """Tools the config allows ("allow" in a server's entry)."""
        return {t.exposed for t in self.hub.tools() for s in self.servers
                if s.name == t.server and t.name in s.allow}
