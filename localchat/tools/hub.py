"""Connections to MCP servers through the official SDK (`mcp.Client`): a stdio server is
started as a subprocess with the environment its config names (beside the SDK's minimal
default: PATH, HOME, USER, LOGNAME, SHELL, TERM), an HTTP server reached at its URL. Every
server is served by one task on a background event loop; the chat and `run` call it from
their own threads. A server that fails to start, crashes, hangs or answers garbage is a
note and an error result, never an exception out of a call."""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

from localchat.message import Tool
from localchat.tools.config import ServerSpec
from localchat.tools.results import ToolOutcome, outcome_of

START_TIMEOUT_S = 20.0  # a server slower to start and list its tools is noted as failed
CALL_TIMEOUT_S = 60.0  # a call that takes longer is an error result (the server may hang)


@dataclass(frozen=True)
class HubTool:
    """A tool a server offers, under the name the model sees (the server's own, or
    SERVER_TOOL where two servers share a name)."""

    server: str
    name: str  # the server's
    exposed: str  # the model's
    description: str
    schema: dict

    def as_tool(self) -> Tool:
        return Tool(self.exposed, self.description, json.dumps(self.schema or
                                                               {"type": "object", "properties": {}}))


class McpHub:
    def __init__(self, specs: list[ServerSpec], *, start_timeout: float = START_TIMEOUT_S,
                 call_timeout: float = CALL_TIMEOUT_S) -> None:
        self.specs = {s.name: s for s in specs}
        self.start_timeout, self.call_timeout = start_timeout, call_timeout
        self.state: dict[str, str] = {s.name: "not started" for s in specs}
        self.notes: list[str] = []  # one line each: a server that failed or stopped
        self._tools: list[HubTool] = []
        self._inboxes: dict[str, asyncio.Queue] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="mcp", daemon=True)
        self._thread.start()

    # ---- starting -------------------------------------------------------------------

    def start(self) -> list[HubTool]:
        """Start every server at once and list their tools (each within start_timeout)."""
        ready = {name: asyncio.run_coroutine_threadsafe(self._start(spec), self._loop)
                 for name, spec in self.specs.items()}
        listed: dict[str, list] = {}
        for name, future in ready.items():
            try:
                listed[name] = future.result(self.start_timeout + 5)
                self.state[name] = "ready"
            except Exception as exc:  # noqa: BLE001 -- any failure is that server's note
                self._failed(name, "could not start", exc)
        self._tools = exposed_tools(listed)
        return list(self._tools)

    async def _start(self, spec: ServerSpec) -> list:
        ready: asyncio.Future = self._loop.create_future()
        inbox: asyncio.Queue = asyncio.Queue()
        self._inboxes[spec.name] = inbox
        self._tasks[spec.name] = asyncio.create_task(self._serve(spec, ready, inbox))
        return await asyncio.wait_for(ready, self.start_timeout)

    async def _serve(self, spec: ServerSpec, ready: asyncio.Future, inbox: asyncio.Queue) -> None:
        from mcp import Client, StdioServerParameters  # the SDK: only where tools are used
        from mcp.client.stdio import stdio_client

        errlog = server_log(spec.name) if spec.url is None else None
        target = spec.url or stdio_client(StdioServerParameters(
            command=spec.command, args=list(spec.args), env=dict(spec.env)), errlog=errlog)
        try:
            async with Client(target, read_timeout_seconds=self.call_timeout) as client:
                listed = await client.list_tools()
                if not ready.done():
                    ready.set_result(list(listed.tools))
                while (item := await inbox.get()) is not None:
                    name, arguments, done = item
                    try:
                        result = await asyncio.wait_for(client.call_tool(name, arguments),
                                                        self.call_timeout)
                        done.set_result(outcome_of(result))
                    except Exception as exc:  # noqa: BLE001 -- told to the model and the user
                        done.set_exception(exc)
        except BaseException as exc:  # noqa: BLE001 -- the server stopped: a note
            if not ready.done():
                ready.set_exception(exc)
            elif self.state.get(spec.name) == "ready":
                self._failed(spec.name, "stopped", exc)
            while not inbox.empty():  # calls queued behind the failure
                item = inbox.get_nowait()
                if item is not None and not item[2].done():
                    item[2].set_exception(exc)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
        finally:
            if errlog is not None:
                errlog.close()

    def _failed(self, name: str, what: str, exc: BaseException) -> None:
        self.state[name] = f"{what}: {one_line(exc)}"
        self.notes.append(f"MCP server {name} {what}: {one_line(exc)}")

    # ---- using ---------------------------------------------------------------------

    def tools(self) -> list[HubTool]:
        """The tools of the servers running now (one that stopped offers none)."""
        return [t for t in self._tools if self.state.get(t.server) == "ready"]

    def find(self, exposed: str) -> HubTool | None:
        return next((t for t in self._tools if t.exposed == exposed), None)

    def call(self, tool: HubTool, arguments: dict) -> ToolOutcome:
        """The tool's result; an error outcome (never an exception) if the server is gone,
        crashes, hangs past call_timeout or answers something that is not a result."""
        inbox = self._inboxes.get(tool.server)
        if inbox is None or self.state.get(tool.server) != "ready":
            return ToolOutcome(f"the {tool.server} server is not running "
                               f"({self.state.get(tool.server, 'unknown')})", error=True)
        done: Future = Future()
        self._loop.call_soon_threadsafe(inbox.put_nowait, (tool.name, arguments, done))
        try:
            return done.result(self.call_timeout + 5)
        except FutureTimeout:
            return ToolOutcome(f"{tool.exposed} did not answer within {self.call_timeout:.0f} s",
                               error=True)
        except asyncio.TimeoutError:
            return ToolOutcome(f"{tool.exposed} did not answer within {self.call_timeout:.0f} s",
                               error=True)
        except Exception as exc:  # noqa: BLE001 -- a protocol error, a crash: the model hears it
            if "closed" in one_line(exc).lower():  # the server's process or connection ended
                self._failed(tool.server, "stopped", exc)
            return ToolOutcome(f"{tool.exposed} failed: {one_line(exc)}", error=True)

    def close(self) -> None:
        """Stop every server (their processes end) and the loop."""
        async def stop() -> None:
            for inbox in self._inboxes.values():
                inbox.put_nowait(None)
            tasks = list(self._tasks.values())
            if tasks:
                await asyncio.wait(tasks, timeout=2)
            for task in tasks:
                task.cancel()

        if self._loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
            except Exception:  # noqa: BLE001 -- closing: nothing more to tell
                pass
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(5)

    def __enter__(self) -> "McpHub":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def exposed_tools(listed: dict[str, list]) -> list[HubTool]:
    """Every server's tools; a name two servers share is prefixed with each server's."""
    counts: dict[str, int] = {}
    for tools in listed.values():
        for t in tools:
            counts[t.name] = counts.get(t.name, 0) + 1
    out = []
    for server, tools in listed.items():
        for t in tools:
            exposed = t.name if counts[t.name] == 1 else f"{server}_{t.name}"
            out.append(HubTool(server, t.name, exposed, t.description or "",
                               dict(t.input_schema or {})))
    return out


def server_log(name: str):
    """Where a stdio server's stderr goes: logs/mcp-NAME.log in the data dir (never the
    terminal the chat draws on); the null device where that cannot be written."""
    import os

    from localchat.paths import data_dir

    try:
        folder = data_dir() / "logs"
        folder.mkdir(parents=True, exist_ok=True)
        return open(folder / f"mcp-{name}.log", "w", encoding="utf-8")
    except OSError:
        return open(os.devnull, "w", encoding="utf-8")


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (an exception group: its first leaf's)."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (anyio's task groups)
        exc = exc.exceptions[0]
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:300]
