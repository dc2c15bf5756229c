"""One line per request on stderr, as llama-server and uvicorn users expect (--quiet: none):
`2026-12-02 20:59:01 127.0.0.1 POST /v1/chat/completions 200 12+32 tok 1.42 s`; a refusal
names its error code and field: `... 400 invalid_value (messages) 0.01 s`."""

from __future__ import annotations

import json
import sys
import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

USAGE_KEY = "localchat.usage"  # the scope entry the routes fill: tokens, whether it finished


def note_usage(scope: Scope, stats, *, finished: bool = True) -> None:
    """Record a completion's token counts for its log line."""
    usage = scope.get(USAGE_KEY)
    if usage is not None and stats is not None:
        usage.update(prompt=stats.prompt_tokens, completion=stats.completion_tokens,
                     finished=finished)


MAX_ERROR_BODY = 4096  # an error body is read for its code only up to this size


def error_label(body: bytes) -> str | None:
    """`invalid_value (messages)`: an OpenAI-shaped error body's code (else its type) and
    param; None for any other body."""
    try:
        error = json.loads(body)["error"]
        name = error.get("code") or error.get("type")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None
    if not isinstance(name, str) or not name:
        return None
    param = error.get("param")
    return f"{name} ({param})" if isinstance(param, str) and param else name


class AccessLog:
    """ASGI middleware: after each HTTP request, its line on `stream`."""

    def __init__(self, app: ASGIApp, stream=None) -> None:
        self.app, self.stream = app, stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start, status, error_body = time.perf_counter(), [0], bytearray()
        scope[USAGE_KEY] = usage = {}

        async def send_noting_status(message: Message) -> None:
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            elif status[0] >= 400 and len(error_body) < MAX_ERROR_BODY:
                error_body.extend(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, send_noting_status)
        finally:
            self._write(scope, status[0] or 500, usage, time.perf_counter() - start,
                        error_label(bytes(error_body)))

    def _write(self, scope: Scope, status: int, usage: dict, seconds: float,
               error: str | None = None) -> None:
        client = (scope.get("client") or ("-",))[0]
        parts = [time.strftime("%Y-%m-%d %H:%M:%S"), client, scope["method"], scope["path"],
                 str(status)]
        if error and usage.get("finished", True):  # a departed client's 503 is no refusal
            parts.append(error)
        if "completion" in usage:
            parts.append(f"{usage['prompt']}+{usage['completion']} tok")
            if not usage["finished"]:
                parts.append("disconnected")
        parts.append(f"{seconds:.2f} s")
        print(" ".join(parts), file=self.stream or sys.stderr, flush=True)
